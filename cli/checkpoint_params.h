// The parameters of one complete step of a pipelined job's checkpoint
// (<dir>/step-<N>/stage-<s>.safetensors, committed by the manifest): what
// `conveyorctl export` writes out and `conveyorctl generate` runs.
//
// Only complete steps are read: the manifest parses and every stage file
// has its recorded size and CRC-32C (checksums verified, since what is read
// here is then trusted elsewhere), and every file agrees with the manifest
// and with stage 0 (format, job, step, num_stages, its stage number;
// checkpoint/stage_file.h). Without a step the newest complete one is taken,
// newer incomplete or damaged steps being passed over with a note.
// Thread-compatible.
#ifndef CONVEYOR_CLI_CHECKPOINT_PARAMS_H_
#define CONVEYOR_CLI_CHECKPOINT_PARAMS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/manifest.h"
#include "checkpoint/stage_file.h"
#include "engine/model_spec.h"
#include "engine/parameter_source.h"
#include "engine/safetensors.h"

namespace conveyor::cli {

struct CheckpointParams {
  checkpoint::CheckpointManifest manifest;
  std::string job;                            // The job id stage 0 names.
  std::vector<checkpoint::StageFile> stages;  // By stage.
  // Every model parameter (optimizer state left out) -> the stage holding
  // it.
  std::map<std::string, int> owner;
  // Why newer steps were passed over when choosing the latest one.
  std::vector<std::string> skipped;

  // The reader and tensor of parameter `name`; nullptr if there is none.
  const engine::TensorInfo* Find(const std::string& name,
                                 const engine::SafetensorsReader** file) const;
};

// Loads step `step` (nullopt: the newest complete one) of the checkpoint in
// `dir`. Errors:
//   NotFound            a missing directory, no step-<N> directories, or no
//                       step `step`;
//   FailedPrecondition  `step` has no manifest (incomplete), no step is
//                       complete, or the stage files disagree (metadata
//                       against the manifest or each other, a parameter in
//                       two stages, a file that is not valid safetensors);
//   DataLoss            `step`'s manifest is unreadable or a stage file is
//                       missing or differs from its size or CRC-32C;
//   the errno-derived code when a file cannot be read.
absl::StatusOr<CheckpointParams> LoadCheckpointParams(
    const std::string& dir, std::optional<int64_t> step);

// FailedPrecondition unless the model parameters of `params` (the
// checkpoint in `dir`) are exactly those of `model`, by name and shape:
// names the first few missing, extra or reshaped ones, calling the model
// `job_name`'s. What a job comparison cannot see (an import whose
// directory is gone or was changed) is still caught here, before any
// tensor is converted.
absl::Status CheckParamsMatchModel(const CheckpointParams& params,
                                   const std::string& dir,
                                   const engine::ModelSpec& model,
                                   const std::string& job_name);

// The parameters of `params` by name, for Stage::LoadFrom. `params` must
// outlive the source.
class CheckpointParamsSource final : public engine::ParameterSource {
 public:
  explicit CheckpointParamsSource(const CheckpointParams& params)
      : params_(params) {}

  absl::StatusOr<std::vector<float>> Read(
      const std::string& name, const engine::Shape& shape) const override;

 private:
  const CheckpointParams& params_;
};

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_CHECKPOINT_PARAMS_H_
