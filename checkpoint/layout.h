// The on-disk layout of a pipelined job's checkpoints, shared by the workers
// that write the stage files, the coordinator that commits each step with a
// manifest, resume, and `conveyorctl export` (the checkpoint/ module):
//
//   <checkpoint.dir>/step-<N>/stage-<s>.safetensors   one per stage
//   <checkpoint.dir>/step-<N>/manifest.json           written last
//
// A stage file holds the stage's parameters under their global names and,
// for resume, the optimizer's state as tensors named
// "optimizer/<slot>/<parameter>" (slot: momentum_buffer, exp_avg,
// exp_avg_sq), with the metadata format (kStageFileFormat), job, stage,
// num_stages, step and optimizer_step. A step directory without a manifest
// is incomplete and does not exist for resume or export (see
// checkpoint/manifest.h). Thread-safe (constants and pure functions).
#ifndef CONVEYOR_CHECKPOINT_LAYOUT_H_
#define CONVEYOR_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::checkpoint {

inline constexpr char kStageFileFormat[] = "conveyor-stage-v1";
inline constexpr char kOptimizerTensorPrefix[] = "optimizer/";
inline constexpr char kManifestFileName[] = "manifest.json";

// "<checkpoint_dir>/step-<step>".
std::string StepDirPath(absl::string_view checkpoint_dir, int64_t step);

// N for a step directory's canonical name "step-N" (no sign, no leading
// zero, fits int64), else nullopt: "step-01", "step-x" and "step-1.tmp" are
// not step directories.
std::optional<int64_t> StepOfDirName(absl::string_view name);

// "stage-<stage>.safetensors": the only file name a manifest may give stage
// `stage`, relative to the step directory.
std::string StageFileName(int stage);

// "<checkpoint_dir>/step-<step>/stage-<stage>.safetensors".
std::string StageFilePath(absl::string_view checkpoint_dir, int64_t step,
                          int stage);

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_CHECKPOINT_LAYOUT_H_
