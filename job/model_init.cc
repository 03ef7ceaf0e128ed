#include "job/model_init.h"

#include "common/status_macros.h"
#include "engine/parameter_source.h"
#include "engine/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/model.h"

namespace conveyor::job {

using engine::ModelSpec;
using engine::PipelineStage;
using engine::SafetensorsReader;
using engine::SafetensorsSource;

absl::Status InitializeStages(const ModelSpec& model,
                              std::span<PipelineStage* const> stages) {
  if (model.seed) {
    for (PipelineStage* stage : stages) {
      RETURN_IF_ERROR(stage->InitializeFromSeed(*model.seed));
    }
    return absl::OkStatus();
  }
  if (!model.from_hf.empty()) {
    ASSIGN_OR_RETURN(const hf::HfCheckpoint checkpoint,
                     hf::HfCheckpoint::Open(model.from_hf));
    // As validate and generate check it: every tensor explained.
    RETURN_IF_ERROR(checkpoint.CheckComplete());
    const hf::HfParameterSource source(checkpoint);
    for (PipelineStage* stage : stages) {
      RETURN_IF_ERROR(stage->LoadFrom(source));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const SafetensorsReader file,
                   SafetensorsReader::Open(model.init_from));
  const SafetensorsSource source(file);
  for (PipelineStage* stage : stages) RETURN_IF_ERROR(stage->LoadFrom(source));
  return absl::OkStatus();
}

}  // namespace conveyor::job
