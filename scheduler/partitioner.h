// Stage partitioner: splits a model's L layers, in order, into S contiguous,
// non-empty pipeline stages. The coordinator calls it with profiled per-layer
// times (seconds) and per-layer memory (bytes), or with parameter counts when
// there is no profile yet.
//
// Strategies:
//   balanced    minimise the cost of the slowest stage (exact), optionally
//               keeping every stage's memory within a cap;
//   uniform     equal layer counts, the remainder going to the first stages;
//   parameters  the balanced algorithm applied to per-layer parameter counts.
//
// "Exact" means optimal for the stage sums as this file computes them (see
// PartitionInput): integer-valued costs give exactly the optimum, and tests
// compare against brute force over every split. Pure functions; thread-safe.
#ifndef CONVEYOR_SCHEDULER_PARTITIONER_H_
#define CONVEYOR_SCHEDULER_PARTITIONER_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::scheduler {

// Upper bounds that keep a typo from allocating gigabytes: the balanced
// tie-break keeps one int per (stage, layer), 64 MiB at these limits.
inline constexpr int kMaxPartitionLayers = 1 << 14;
inline constexpr int kMaxPartitionStages = 1024;

enum class PartitionStrategy : unsigned char {
  kBalanced,
  kUniform,
  kParameters,
};

// The names used in job YAML and on the command line, comma-separated.
inline constexpr absl::string_view kPartitionStrategyNames =
    "balanced, uniform, parameters";

// "balanced", "uniform", "parameters".
absl::string_view PartitionStrategyName(PartitionStrategy strategy);

// Inverse of PartitionStrategyName. InvalidArgument lists the allowed names.
absl::StatusOr<PartitionStrategy> ParsePartitionStrategy(
    absl::string_view name);

// Every field has an initializer so callers can name only the fields they set
// (`{.costs = c, .num_stages = 4}`) without -Wmissing-field-initializers.
struct PartitionInput {
  // One entry per layer, finite and >= 0; its size is the layer count L.
  // What the split balances: seconds for kBalanced, parameter counts for
  // kParameters; kUniform only sums it per stage for the report. A stage's
  // cost is the difference of long double prefix sums rounded to double: with
  // integer-valued costs it is exact whenever the stage sum is below 2^53 and
  // the total below 2^64 (x86-64's long double), even where double prefix
  // sums would have lost the low bits.
  std::vector<double> costs = {};
  // Empty, or one entry per layer (bytes), finite and >= 0.
  std::vector<double> memory = {};
  // When set, every stage's summed memory must be <= *memory_cap (finite,
  // >= 0). Needs `memory`.
  std::optional<double> memory_cap = std::nullopt;
  int num_stages = 1;  // S, in 1..min(L, kMaxPartitionStages)
};

struct Partition {
  int num_layers = 0;  // L
  // First layer of each stage: S entries, stage_begin[0] == 0, strictly
  // increasing (every stage holds at least one layer).
  std::vector<int> stage_begin;
  // Per stage, the summed costs of its layers.
  std::vector<double> stage_cost;
  // Per stage, the summed memory of its layers; empty when the input had none.
  std::vector<double> stage_memory;
  double max_stage_cost = 0;  // the largest stage_cost

  int num_stages() const { return static_cast<int>(stage_begin.size()); }
  // Stage `stage` holds layers [stage_begin[stage], StageEnd(stage)).
  int StageEnd(int stage) const;
  int NumLayersInStage(int stage) const {
    return StageEnd(stage) - stage_begin[stage];
  }
  // The stage holding `layer` (0 <= layer < num_layers).
  int StageOfLayer(int layer) const;
};

// kBalanced: among all splits into input.num_stages stages whose memory fits
// the cap, one with the smallest max stage cost. Ties: among those, the split
// with the smallest sum of squared stage costs (the most even one; compared in
// long double, so exactly for integer-valued costs of moderate size); among
// those, the one whose earlier stages hold as many layers as possible
// (lexicographically largest stage_begin), matching kUniform's "remainder to
// the first stages". O(64 L + S L log L) time, O(S L) memory.
//
// InvalidArgument, naming the field and the rule, when num_stages is outside
// 1..kMaxPartitionStages or above L, costs is empty or longer than
// kMaxPartitionLayers, a cost or memory entry is negative or not finite, the
// costs (or memory) sum past the double range, memory has the wrong length,
// memory_cap is negative, not finite or set without memory, or no split fits
// the cap (the message gives the smallest max stage memory any split reaches,
// i.e. the smallest cap that would work).
absl::StatusOr<Partition> PartitionLayers(const PartitionInput& input);

// kUniform: the first L % S stages hold ceil(L/S) layers, the rest floor(L/S);
// costs and memory are only summed. The same InvalidArgument cases as
// PartitionLayers; with a cap, InvalidArgument names the first stage over it.
absl::StatusOr<Partition> PartitionUniform(const PartitionInput& input);

// Dispatches on `strategy`. kParameters expects parameter counts in
// input.costs and runs PartitionLayers: balancing parameters is the same
// min-max problem.
absl::StatusOr<Partition> PartitionWithStrategy(PartitionStrategy strategy,
                                                const PartitionInput& input);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_PARTITIONER_H_
