// A stage file: one stage's share of a checkpoint step
// (<checkpoint.dir>/step-<N>/stage-<s>.safetensors, checkpoint/layout.h).
// The worker that owns the stage writes it; resume and `conveyorctl export`
// read it back through the one reader here, which checks the file against
// the manifest's digest and its own metadata, so a file of another step,
// stage or job under the right name is refused wherever it is read.
//
// The file holds the stage's parameters under their global names and the
// optimizer's state of those parameters under OptimizerTensorName(slot,
// parameter), with the metadata of StageFileInfo and "format"
// kStageFileFormat.
//
// Thread-safe (pure functions over their arguments and the filesystem).
#ifndef CONVEYOR_CHECKPOINT_STAGE_FILE_H_
#define CONVEYOR_CHECKPOINT_STAGE_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "engine/safetensors.h"

namespace conveyor::checkpoint {

// What a stage file says about itself, as its safetensors metadata.
struct StageFileInfo {
  std::string job;  // The job's name when it was written.
  int stage = 0;
  int num_stages = 0;
  int64_t step = 0;  // Steps done when it was written.
  // The optimizer's own step count; equal to `step` in every file a worker
  // writes (one optimizer step per training step).
  int64_t optimizer_step = 0;
  // How far the data source got: the source is indexed by step.
  int64_t samples_seen = 0;
};

// "optimizer/<slot>/<parameter>": where a parameter's optimizer state
// (slot: momentum_buffer, exp_avg, exp_avg_sq) is kept in a stage file.
std::string OptimizerTensorName(absl::string_view slot,
                                absl::string_view parameter);
// True for the names OptimizerTensorName makes: resume reads them, export
// leaves them out of the model.
bool IsOptimizerTensor(absl::string_view name);

// Writes stage `info.stage`'s file of step `info.step` under
// `checkpoint_dir`, creating the step directory: atomically and durably (a
// reader sees the whole file or none, and it survives a crash once this
// returns). Returns the digest the manifest records, or InvalidArgument for
// tensors SerializeSafetensors refuses, or the errno-derived code with the
// path of a failed call.
absl::StatusOr<StageFileDigest> WriteStageFile(
    const std::string& checkpoint_dir, const StageFileInfo& info,
    const std::vector<engine::TensorToWrite>& tensors);

// A stage file read back and checked, whole in memory.
struct StageFile {
  StageFileInfo info;
  engine::SafetensorsReader tensors;
};

// What a reader expects of a stage file besides its digest.
struct StageFileExpectation {
  int64_t step = 0;
  // Unset: any. Set by export, from the manifest.
  std::optional<int> num_stages = std::nullopt;
  // Unset: any (a resumed job may have been renamed). Set by export, from
  // stage 0, so that every stage comes from one job.
  std::optional<std::string> job = std::nullopt;
};

// Reads `digest.file` in `step_dir` (only the canonical StageFileName of its
// stage is accepted, so a manifest cannot point outside the step
// directory), checks it has the digest's size and CRC-32C, parses it, and
// checks that its metadata describe stage `digest.stage` at `expect.step`
// (and `expect`'s other fields where set). Returns the errno-derived code
// with the path when it cannot be read; DataLoss naming the file for
// anything else: another size or checksum (with both values), a file that
// is not safetensors, metadata missing, malformed or describing another
// file.
absl::StatusOr<StageFile> ReadStageFile(const std::string& step_dir,
                                        const StageFileDigest& digest,
                                        const StageFileExpectation& expect);

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_CHECKPOINT_STAGE_FILE_H_
