#include "job/job_policy.h"

#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace conveyor::job {

std::optional<int> PriorityOfClass(absl::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kPriorityClasses)); ++i) {
    if (kPriorityClasses[i] == name) return i * kPriorityNormal;
  }
  return std::nullopt;
}

std::string PriorityName(int priority) {
  if (priority >= kPriorityLow && priority <= kPriorityUrgent &&
      priority % kPriorityNormal == 0) {
    return std::string(kPriorityClasses[priority / kPriorityNormal]);
  }
  return absl::StrCat(priority);
}

bool IsValidOwner(absl::string_view owner) {
  if (owner.empty() || owner.size() > kMaxOwnerBytes) return false;
  for (const char c : owner) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' &&
        c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace conveyor::job
