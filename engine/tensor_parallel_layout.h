// Which layers of a model split over tensor-parallel ranks
// (`pipeline.tensor_parallel`, engine/tensor_parallel_stage.h), and whether
// a model can split over T of them: what the job parser checks and
// `validate` shows, without building anything.
#ifndef CONVEYOR_ENGINE_TENSOR_PARALLEL_LAYOUT_H_
#define CONVEYOR_ENGINE_TENSOR_PARALLEL_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/layer_spec.h"
#include "engine/model_spec.h"

namespace conveyor::engine {

// Whether `layer`'s kind splits over tensor-parallel ranks (the others run
// whole on every rank).
bool LayerSplits(const LayerSpec& layer);

// Whether any layer of stage `stage` (of the model, any stage: -1) splits.
bool StageSplits(const ModelSpec& spec, int stage);

// Why `spec` cannot split over `ranks` ranks (the first layer whose counts
// `ranks` does not divide, at its YAML position), or OK.
absl::Status CheckTensorParallel(const ModelSpec& spec, int64_t ranks);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_TENSOR_PARALLEL_LAYOUT_H_
