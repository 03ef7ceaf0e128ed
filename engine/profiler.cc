#include "engine/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cancellation.h"
#include "common/median.h"
#include "common/status_macros.h"
#include "engine/host_upload.h"
#include "engine/stage.h"

namespace conveyor::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRepetitions = 100;

Shape WithBatch(int64_t rows, const std::vector<int64_t>& per_sample) {
  Shape shape = {rows};
  shape.insert(shape.end(), per_sample.begin(), per_sample.end());
  return shape;
}

// A fixed pattern of small floats in [-0.08, 0.08]: nonzero, so no kernel
// takes a shortcut on zeros, and small, so nothing overflows.
absl::StatusOr<Tensor> PatternTensor(Backend* backend, const Shape& shape) {
  std::vector<float> host(static_cast<size_t>(NumElements(shape)));
  for (size_t k = 0; k < host.size(); ++k) {
    host[k] = static_cast<float>(static_cast<int>(k % 17) - 8) * 0.01f;
  }
  return UploadVector(backend, shape, host);
}

// Token ids 0: valid for every vocabulary. The engine's ids are I64
// (Backend::EmbeddingForward).
absl::StatusOr<Tensor> ZeroIds(Backend* backend, const Shape& shape) {
  return UploadVector(
      backend, shape,
      std::vector<int64_t>(static_cast<size_t>(NumElements(shape)), 0));
}

// Seconds `f` takes, including the backend finishing the work it enqueued.
template <typename F>
absl::StatusOr<double> Timed(Backend* backend, F&& f) {
  const Clock::time_point start = Clock::now();
  RETURN_IF_ERROR(f());
  RETURN_IF_ERROR(backend->Synchronize());
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct ActionTimes {
  double forward = 0, backward_input = 0, backward_weight = 0;
};

// One microbatch through F, BI and BW, timing each action and noting the
// stage's activation peak over the three.
absl::StatusOr<ActionTimes> RunOnce(Backend* backend, Stage& stage,
                                    const Tensor& x, const Tensor& dy,
                                    int64_t* peak_bytes) {
  constexpr int kMicrobatch = 0;
  stage.ResetPeakActivationBytes();
  ActionTimes t;
  ASSIGN_OR_RETURN(t.forward, Timed(backend, [&]() -> absl::Status {
                     return stage.Forward(kMicrobatch, x).status();
                   }));
  ASSIGN_OR_RETURN(t.backward_input, Timed(backend, [&]() -> absl::Status {
                     return stage.BackwardInput(kMicrobatch, dy).status();
                   }));
  ASSIGN_OR_RETURN(t.backward_weight, Timed(backend, [&]() -> absl::Status {
                     return stage.BackwardWeight(kMicrobatch);
                   }));
  // The stage's peak comes at the end of BI: the layer's stash and the
  // output gradient BW needs, so the per-layer figures add up over the
  // layers of a stage.
  *peak_bytes = std::max(*peak_bytes,
                         static_cast<int64_t>(stage.peak_activation_bytes()));
  return t;
}

absl::StatusOr<LayerProfile> ProfileLayer(Backend* backend,
                                          const ModelSpec& one_per_stage,
                                          int index, uint64_t seed,
                                          const ProfileOptions& options) {
  const LayerSpec& layer = one_per_stage.layers[index];
  ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                   Stage::Create(backend, one_per_stage, index));
  RETURN_IF_ERROR(stage->InitializeFromSeed(seed));

  LayerProfile profile;
  for (const ParamSpec& p : layer.params) {
    profile.parameter_bytes += p.NumElements() * 4;
  }

  const Shape x_shape = WithBatch(options.microbatch_size, layer.input_shape);
  Tensor x;
  if (layer.kind == LayerKind::kEmbedding) {
    ASSIGN_OR_RETURN(x, ZeroIds(backend, x_shape));
  } else {
    ASSIGN_OR_RETURN(x, PatternTensor(backend, x_shape));
  }
  ASSIGN_OR_RETURN(Tensor dy,
                   PatternTensor(backend, WithBatch(options.microbatch_size,
                                                    layer.output_shape)));
  RETURN_IF_ERROR(backend->Synchronize());

  // Warm-up: first-touch allocations, BLAS thread start-up, caches.
  RETURN_IF_ERROR(
      RunOnce(backend, *stage, x, dy, &profile.activation_bytes).status());

  std::vector<double> forward, backward_input, backward_weight;
  for (int r = 0; r < options.repetitions; ++r) {
    RETURN_IF_ERROR(CheckCancelled());
    ASSIGN_OR_RETURN(ActionTimes t, RunOnce(backend, *stage, x, dy,
                                            &profile.activation_bytes));
    forward.push_back(t.forward);
    backward_input.push_back(t.backward_input);
    backward_weight.push_back(t.backward_weight);
  }
  profile.forward_seconds = Median(std::move(forward));
  profile.backward_input_seconds = Median(std::move(backward_input));
  profile.backward_weight_seconds = Median(std::move(backward_weight));
  return profile;
}

std::string ShapeKey(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Doubles exactly (round-trip precision), so two delays that differ in the
// last bit get different keys.
std::string DoubleKey(double v) { return absl::StrFormat("%.17g", v); }

int Bit(bool b) { return b ? 1 : 0; }

}  // namespace

absl::StatusOr<std::vector<LayerProfile>> ProfileLayers(
    Backend* backend, const ModelSpec& model, const ProfileOptions& options) {
  if (options.microbatch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: microbatch_size must be >= 1; got ",
                     options.microbatch_size));
  }
  if (options.repetitions < 1 || options.repetitions > kMaxRepetitions) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: repetitions must be in 1..", kMaxRepetitions,
                     "; got ", options.repetitions));
  }
  std::vector<LayerProfile> profiles;
  if (model.layers.empty()) return profiles;

  // Every layer its own stage, so each is built, run and accounted alone;
  // layer 0 stays the first stage and, like the real first layer, skips dx.
  ModelSpec one_per_stage = model;
  std::vector<int> begins(model.layers.size());
  for (size_t i = 0; i < begins.size(); ++i) begins[i] = static_cast<int>(i);
  RETURN_IF_ERROR(SetStageBoundaries(&one_per_stage, begins));

  const uint64_t seed = model.seed.value_or(0);
  profiles.reserve(model.layers.size());
  for (int i = 0; i < static_cast<int>(model.layers.size()); ++i) {
    RETURN_IF_ERROR(CheckCancelled());
    ASSIGN_OR_RETURN(LayerProfile profile,
                     ProfileLayer(backend, one_per_stage, i, seed, options));
    profiles.push_back(profile);
  }
  return profiles;
}

std::string ProfileKey(const ModelSpec& model, int64_t microbatch_size) {
  std::string key = absl::StrCat(
      "profile-v1;mb=", microbatch_size, ";remat=", Bit(model.remat),
      ";tokens=", Bit(model.token_input), ";layers=", model.layers.size());
  for (const LayerSpec& l : model.layers) {
    absl::StrAppend(&key, ";", LayerKindName(l.kind), "{f=", l.features,
                    ",bias=", Bit(l.bias), ",tanh=", Bit(l.approximate_tanh),
                    ",eps=", DoubleKey(l.eps), ",vocab=", l.vocab_size,
                    ",pos=", l.max_positions, ",heads=", l.heads,
                    ",causal=", Bit(l.causal), ",qkv=", l.qkv_features,
                    ",mlp=", l.mlp_features, ",pre_norm=", Bit(l.pre_norm),
                    ",kv=", l.kv_heads, ",theta=", DoubleKey(l.rope_theta));
    absl::StrAppend(&key, ",fms=", DoubleKey(l.forward_ms),
                    ",bims=", DoubleKey(l.backward_input_ms),
                    ",bwms=", DoubleKey(l.backward_weight_ms),
                    ",in=", ShapeKey(l.input_shape),
                    ",out=", ShapeKey(l.output_shape), ",params=");
    for (const ParamSpec& p : l.params)
      absl::StrAppend(&key, ShapeKey(p.shape));
    absl::StrAppend(&key, "}");
  }
  return key;
}

}  // namespace conveyor::engine
