#include "engine/tensor_parallel_layout.h"

#include "common/status_macros.h"
#include "engine/layer_kinds.h"

namespace conveyor::engine {

bool LayerSplits(const LayerSpec& layer) {
  return LayerKindRowOf(layer.kind).build_shard != nullptr;
}

bool StageSplits(const ModelSpec& spec, int stage) {
  const int begin = stage < 0 ? 0 : spec.stage_begin[stage];
  const int end =
      stage < 0 ? static_cast<int>(spec.layers.size()) : spec.StageEnd(stage);
  for (int i = begin; i < end; ++i) {
    if (LayerSplits(spec.layers[i])) return true;
  }
  return false;
}

absl::Status CheckTensorParallel(const ModelSpec& spec, int64_t ranks) {
  if (ranks <= 1) return absl::OkStatus();
  for (const LayerSpec& layer : spec.layers) {
    const LayerKindRow& row = LayerKindRowOf(layer.kind);
    if (row.check_shard != nullptr) {
      RETURN_IF_ERROR(row.check_shard(layer, ranks));
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor::engine
