#include "scheduler/render_text.h"

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {

std::string RenderText(const Schedule& schedule) {
  std::string out;
  // About six characters per action ("F12.3 "); reserving once keeps large
  // schedules (P=64, M=1024: 131k actions) from reallocating repeatedly.
  out.reserve(schedule.TotalActions() * 6 + schedule.actions.size() * 12);
  for (size_t r = 0; r < schedule.actions.size(); ++r) {
    absl::StrAppend(&out, "rank ", r, ":");
    for (const Action& action : schedule.actions[r]) {
      absl::StrAppend(&out, " ", ToString(action));
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace conveyor::scheduler
