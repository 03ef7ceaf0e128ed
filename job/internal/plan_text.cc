#include "job/internal/plan_text.h"

#include "absl/strings/str_format.h"

namespace conveyor::job::job_internal {

std::string Bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

absl::string_view Reason(absl::string_view message) {
  if (size_t at = message.find("pipeline"); at != absl::string_view::npos) {
    message.remove_prefix(at);
    if (size_t colon = message.find(": "); colon != absl::string_view::npos) {
      message.remove_prefix(colon + 2);
    }
  }
  return message;
}

}  // namespace conveyor::job::job_internal
