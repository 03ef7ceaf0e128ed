// The initial parameters of a model's stages, as model.init says: drawn from
// the seed, read from a safetensors file (model.init.from), or read from a
// HuggingFace checkpoint (model.from_hf). The in-process trainer and the
// workers both start a job through here, so a pipelined job starts from
// exactly its reference's parameters.
#ifndef CONVEYOR_JOB_MODEL_INIT_H_
#define CONVEYOR_JOB_MODEL_INIT_H_

#include <span>

#include "absl/status/status.h"
#include "engine/model_spec.h"
#include "engine/pipeline_stage.h"

namespace conveyor::job {

// Initializes every stage in `stages` (any subset of the model's, in any
// order). The files' errors as they come (NotFound, InvalidArgument naming
// the tensor, ...).
absl::Status InitializeStages(const engine::ModelSpec& model,
                              std::span<engine::PipelineStage* const> stages);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_MODEL_INIT_H_
