// ConfigScope: what of a job file its configuration hashes (job/
// config_hash.h) and the differences resume names (job/config_diff.h) look
// at. The rule is written here once, so the hash and the diff cannot drift
// apart: an empty diff means equal hashes (config_diff_test checks both
// ways).
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_CONFIG_SCOPE_H_
#define CONVEYOR_JOB_CONFIG_SCOPE_H_

#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {

enum class ConfigScope {
  // What JobConfigHash covers: everything but the top-level name,
  // checkpoint, resume, restart, eval, priority and owner keys (where the
  // job's files go, how it recovers, what it measures on the side, how it
  // is scheduled).
  kConfig,
  // What JobTrainingHash covers: kConfig without what only says how the
  // model is cut and run: the pipeline section and the model's stage
  // boundaries (`- boundary` items, boundary_every, boundaries).
  kTraining,
};

// Whether the map key `key` is left out in `scope`. `top_level`: the key is
// in the document's top-level map; `in_model`: in the model section.
bool IsIgnoredKey(ConfigScope scope, absl::string_view key, bool top_level,
                  bool in_model);

// Whether a layer-list item is left out in `scope`: in kTraining, `-
// boundary` and `- boundary: {}` (items only of the model's sequences).
bool IsIgnoredListItem(ConfigScope scope, const YAML::Node& item,
                       bool in_model);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_CONFIG_SCOPE_H_
