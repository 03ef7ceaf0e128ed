// StageCut: where a model is cut into pipeline stages, as the first layer of
// each stage. Valid by construction: Create checks that the first stage
// starts at layer 0, that stages start strictly in order, and that each
// starts inside the model. A cut comes from the model's `boundary` markers
// (Of), from a partition the planner chose, from a program's stage_begin or
// from a checkpoint's manifest, and ApplyTo is how a job's model is re-cut:
// the planner, resume and rank programs pass cuts, not bare vectors.
//
// Thread-compatible (a value).
#ifndef CONVEYOR_JOB_STAGE_CUT_H_
#define CONVEYOR_JOB_STAGE_CUT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model_spec.h"

namespace conveyor::job {

class StageCut {
 public:
  // A cut of a `num_layers`-layer model into stages starting at
  // `first_layers`. InvalidArgument "stage boundaries: ..." naming what is
  // wrong (engine::CheckStageBoundaries).
  static absl::StatusOr<StageCut> Create(std::vector<int> first_layers,
                                         int num_layers);
  // `model`'s cut as it is (its markers', or the last one applied).
  static StageCut Of(const engine::ModelSpec& model);

  // One stage of an empty model: a placeholder until one is assigned.
  StageCut() = default;

  int num_stages() const { return static_cast<int>(first_layers_.size()); }
  int num_layers() const { return num_layers_; }
  const std::vector<int>& first_layers() const { return first_layers_; }
  // Stage `stage` holds layers [Begin(stage), End(stage)).
  int Begin(int stage) const { return first_layers_[stage]; }
  int End(int stage) const;
  // The stage that holds `layer` (0 <= layer < num_layers()).
  int StageOf(int layer) const;

  // Re-cuts `model` here: its num_stages, stage_begin and every layer's
  // stage (parameter names follow the layer index, so they do not change).
  // InvalidArgument when `model` has another number of layers, leaving it
  // unchanged.
  absl::Status ApplyTo(engine::ModelSpec* model) const;

  // "0, 3, 7".
  std::string ToString() const;

  friend bool operator==(const StageCut&, const StageCut&) = default;

 private:
  StageCut(std::vector<int> first_layers, int num_layers)
      : first_layers_(std::move(first_layers)), num_layers_(num_layers) {}

  std::vector<int> first_layers_ = {0};
  int num_layers_ = 0;
};

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_STAGE_CUT_H_
