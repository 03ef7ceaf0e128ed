#include "job/stage_cut.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace conveyor::job {

absl::StatusOr<StageCut> StageCut::Create(std::vector<int> first_layers,
                                          int num_layers) {
  if (absl::Status s = engine::CheckStageBoundaries(first_layers, num_layers);
      !s.ok()) {
    return s;
  }
  return StageCut(std::move(first_layers), num_layers);
}

StageCut StageCut::Of(const engine::ModelSpec& model) {
  // A ModelSpec's cut was checked when it was set (AssembleModel,
  // SetStageBoundaries).
  return StageCut(model.stage_begin, static_cast<int>(model.layers.size()));
}

int StageCut::End(int stage) const {
  return stage + 1 < num_stages() ? first_layers_[stage + 1] : num_layers_;
}

int StageCut::StageOf(int layer) const {
  CONVEYOR_CHECK(layer >= 0 && layer < num_layers_, "layer outside the cut");
  // The last stage whose first layer is at or before `layer`.
  auto it = std::upper_bound(first_layers_.begin(), first_layers_.end(), layer);
  return static_cast<int>(it - first_layers_.begin()) - 1;
}

absl::Status StageCut::ApplyTo(engine::ModelSpec* model) const {
  if (static_cast<int>(model->layers.size()) != num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage boundaries: a cut of ", num_layers_,
                     " layers for a model of ", model->layers.size()));
  }
  return engine::SetStageBoundaries(model, first_layers_);
}

std::string StageCut::ToString() const {
  return absl::StrJoin(first_layers_, ", ");
}

}  // namespace conveyor::job
