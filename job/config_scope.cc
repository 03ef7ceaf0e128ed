#include "job/config_scope.h"

#include "absl/algorithm/container.h"

namespace conveyor::job {

bool IsIgnoredKey(ConfigScope scope, absl::string_view key, bool top_level,
                  bool in_model) {
  static constexpr absl::string_view kBookkeeping[] = {
      "name", "checkpoint", "resume", "restart", "eval", "priority", "owner"};
  static constexpr absl::string_view kModelLayout[] = {"boundary_every",
                                                       "boundaries"};
  const bool layout_free = scope == ConfigScope::kTraining;
  if (top_level) {
    return absl::c_linear_search(kBookkeeping, key) ||
           (layout_free && key == "pipeline");
  }
  return layout_free && in_model && absl::c_linear_search(kModelLayout, key);
}

bool IsIgnoredListItem(ConfigScope scope, const YAML::Node& item,
                       bool in_model) {
  if (scope != ConfigScope::kTraining || !in_model) return false;
  if (item.IsScalar()) return item.Scalar() == "boundary";
  return item.IsMap() && item.size() == 1 && item.begin()->first.IsScalar() &&
         item.begin()->first.Scalar() == "boundary";
}

}  // namespace conveyor::job
