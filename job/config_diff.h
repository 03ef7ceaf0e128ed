// What differs between two job files, section and key path, over exactly
// what JobConfigHash or JobTrainingHash (job/config_hash.h) compares: resume
// refuses a checkpoint of another configuration by its hashes, and names
// what differs with this so the user knows what to change back.
//
//   ASSIGN_OR_RETURN(ConfigDiff diff,
//                    DiffJobConfigs(recorded_yaml, job_yaml,
//                                   ConfigScope::kTraining));
//   // DescribeConfigDiff(diff): "optimizer.lr differs (0.001 in the
//   // checkpoint, 0.0003 in this job); data.shuffle is set in this job only"
//
// The old side is the checkpoint's job, the new side the job being
// submitted; the descriptions say so.
//
// Thread-safe (pure functions; each call parses its own YAML trees).
#ifndef CONVEYOR_JOB_CONFIG_DIFF_H_
#define CONVEYOR_JOB_CONFIG_DIFF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "job/config_scope.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {

struct ConfigDifference {
  enum class Kind {
    kChanged,    // In both, with other values (or of another type).
    kOnlyInOld,  // A key or list item only the checkpoint's job has.
    kOnlyInNew,  // A key or list item only this job has.
  };
  Kind kind = Kind::kChanged;
  // "optimizer.lr", "model.layers[3].dense.features". List indices count
  // the items compared, so with kTraining they skip `- boundary` items; the
  // index shown is this job's where it has the item, else the checkpoint's.
  std::string path;
  // The values in flow style ("0.001", "[0.9, 0.99]", "{features: 4}"),
  // or, over kMaxShownValueChars, what they are ("a list of 12 items");
  // unset where a side has none.
  std::optional<std::string> old_value;
  std::optional<std::string> new_value;
  bool list_item = false;  // The path ends in an index.

  friend bool operator==(const ConfigDifference&,
                         const ConfigDifference&) = default;
};

// Values longer than this are summarized, not shown.
inline constexpr size_t kMaxShownValueChars = 40;
// The most differences a ConfigDiff lists; it counts the rest.
inline constexpr int kMaxListedDifferences = 256;

struct ConfigDiff {
  // In document order (this job's keys, then keys only the checkpoint's job
  // has), at most kMaxListedDifferences.
  std::vector<ConfigDifference> differences;
  int64_t total = 0;  // All differences found, listed or not.
  // False when the trees were too deep or too large (aliases can make a
  // small file a huge tree) and the comparison stopped early: `total` is
  // then a lower bound.
  bool complete = true;

  bool empty() const { return total == 0 && complete; }
};

// The differences between two job files in `scope`. The comparison follows
// the hashes: maps by key whatever their order, sequences by position,
// scalars by their text ("1.0" and "1" differ; comments and layout do
// not). An empty diff of a complete comparison means the matching hash is
// equal. InvalidArgument "checkpoint's job: ..." or "this job: ..." when a
// text is not one YAML document.
absl::StatusOr<ConfigDiff> DiffJobConfigs(absl::string_view old_yaml,
                                          absl::string_view new_yaml,
                                          ConfigScope scope);

// DiffJobConfigs over documents the caller has loaded, and may have cut
// down to what it compares (conveyorctl export and generate compare only
// what makes the model). InternalError if yaml-cpp throws.
absl::StatusOr<ConfigDiff> DiffJobDocuments(const YAML::Node& old_doc,
                                            const YAML::Node& new_doc,
                                            ConfigScope scope);

// The first `max_listed` differences joined by "; ", then "and N more"
// when there are others, e.g.
//   optimizer.lr differs (0.001 in the checkpoint, 0.0003 in this job);
//   model.layers[3].dense.features differs (64, 128); data.shuffle is set
//   in this job only (true); and 3 more
// Empty for an empty diff.
std::string DescribeConfigDiff(const ConfigDiff& diff, int max_listed = 8);

// A change of training.steps that resume allows: the two jobs train the
// same parameters from the same data in the same order, only for longer or
// shorter (and a cosine schedule spans the new length when its total_steps
// follows training.steps).
struct StepsChange {
  int64_t old_steps = 0;
  int64_t new_steps = 0;
  // optimizer.schedule.kind: "constant" when unset.
  std::string schedule_kind = "constant";
  int64_t warmup_steps = 0;  // optimizer.schedule.warmup_steps; 0 unset.
  // Cosine only (0 otherwise): the steps its decay spans in the
  // checkpoint's job and in this one (total_steps, or training.steps when
  // total_steps is unset).
  int64_t old_span = 0;
  int64_t new_span = 0;
};

// The StepsChange when `training_diff` (a kTraining diff of the same two
// texts) is complete and its only differences are training.steps and,
// along with it, optimizer.schedule.total_steps; nullopt otherwise (also
// when a value is not an integer).
std::optional<StepsChange> FindStepsChange(const ConfigDiff& training_diff,
                                           absl::string_view old_yaml,
                                           absl::string_view new_yaml);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_CONFIG_DIFF_H_
