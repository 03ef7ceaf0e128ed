// Layer profiler: measures, on one backend, what each layer of a model costs
// for one microbatch of a given size: forward, input-backward (BI) and
// weight-backward (BW) time, the activation bytes its stash holds from
// forward until BW, and its parameter bytes. The coordinator's automatic
// stage construction (`pipeline: {stages: auto}`) feeds these to the stage
// search (scheduler/stage_search.h); `conveyorctl validate` profiles on the
// local CPU the same way.
//
// Each layer is built alone (as a one-layer stage, so remat and the stash
// accounting are the stage's own), initialised from the model's seed (seed 0
// for a model that loads its parameters from a file: values do not change
// the cost), and run on a deterministic input: I64 token ids 0 for an
// embedding, otherwise a fixed pattern of small floats, as is the output
// gradient. Layer 0 is the first stage, so, as in training, its BI skips dx.
// One untimed warm-up, then `repetitions` timed runs of F, BI and BW; each time
// is the median over the runs, after Backend::Synchronize, so an asynchronous
// backend is timed to completion. The loss is not profiled (it is folded into
// the last stage's backward by the simulator and is small next to a layer).
//
// Thread-compatible: one profile at a time per backend.
#ifndef CONVEYOR_ENGINE_PROFILER_H_
#define CONVEYOR_ENGINE_PROFILER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model_spec.h"

namespace conveyor::engine {

struct LayerProfile {
  double forward_seconds = 0;
  double backward_input_seconds = 0;
  double backward_weight_seconds = 0;
  // Peak bytes the layer holds for one microbatch between forward and BW:
  // what forward saves, plus the output gradient kept from BI for BW, as the
  // Stage counts them (a tensor per handle). These add up over the layers of
  // a stage.
  int64_t activation_bytes = 0;
  int64_t parameter_bytes = 0;  // Parameter elements * 4 (fp32).
};

struct ProfileOptions {
  int64_t microbatch_size = 1;  // Samples per microbatch, >= 1.
  int repetitions = 3;          // Timed runs per action, in 1..100.
};

// One entry per layer of `model` (model.layers order; none for a model
// without layers). InvalidArgument for options out of range; the status of
// the calling thread's cancellation (common/cancellation.h) once it is
// cancelled, between layers, between timed runs or in a `delay` layer; whatever
// the backend or a layer returns otherwise (e.g. ResourceExhausted when a layer
// does not fit).
absl::StatusOr<std::vector<LayerProfile>> ProfileLayers(
    Backend* backend, const ModelSpec& model, const ProfileOptions& options);

// A key that is equal for two (model, microbatch size) pairs exactly when
// their profiles would measure the same layers on the same shapes: every
// layer's kind, options, shapes and parameter shapes, remat, and the
// microbatch size. Not the seed, parameter names or stage boundaries. The
// coordinator caches profiles under (key, device).
std::string ProfileKey(const ModelSpec& model, int64_t microbatch_size);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_PROFILER_H_
