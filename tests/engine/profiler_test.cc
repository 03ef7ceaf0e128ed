// The layer profiler: re-cutting a model into stages, per-layer times on
// delay layers (whose cost is known), exact parameter and activation bytes on
// dense layers, token models, the cache key, and option checks. Timing checks
// allow for a loaded machine: a delay's wait is a lower bound, and the upper
// tolerance is generous.
#include "engine/profiler.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cancellation.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

ModelSpec Parse(const std::string& yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "profile.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << yaml;
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

std::string Model(absl::string_view layers, absl::string_view input_shape,
                  absl::string_view loss = "mse", int seed = 0,
                  bool remat = false) {
  return absl::StrCat("model:\n  input_shape: ", input_shape,
                      "\n  init: {seed: ", seed,
                      "}\n  remat: ", remat ? "true" : "false",
                      "\n  loss: ", loss, "\n  layers:\n", layers);
}

// Six layers in two stages: [0, 3), [3, 6).
ModelSpec SixLayers() {
  return Parse(
      Model("    - dense: {features: 8}\n"
            "    - relu\n"
            "    - dense: {features: 6}\n"
            "    - boundary\n"
            "    - gelu\n"
            "    - dense: {features: 5}\n"
            "    - relu\n",
            "[4]"));
}

TEST(ProfileLayersTest, DelayLayersTakeTheirConfiguredTimes) {
  const ModelSpec spec =
      Parse(Model("    - delay:\n"
                  "        forward_ms: 13\n"
                  "        backward_input_ms: 52\n"
                  "        backward_weight_ms: 26\n"
                  "    - delay:\n"
                  "        forward_ms: 65\n"
                  "        backward_input_ms: 39\n"
                  "        backward_weight_ms: 0\n",
                  "[2]"));
  absl::StatusOr<std::vector<LayerProfile>> profiles = ProfileLayers(
      CpuBackend::Get(), spec, {.microbatch_size = 3, .repetitions = 3});
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  ASSERT_EQ(profiles->size(), 2u);

  // A wait is a lower bound; sleeping overshoots a little, and a machine busy
  // with other tests (CI runs them in parallel on two cores) overshoots more.
  // The configured times are 13 ms apart, so with a 12 ms slack the allowed
  // ranges are disjoint: a time attributed to the wrong phase or layer fails
  // a bound.
  constexpr double kSlack = 12e-3;
  auto expect_time = [&](double seconds, double configured_ms,
                         const char* what) {
    EXPECT_GE(seconds, configured_ms * 1e-3) << what;
    EXPECT_LE(seconds, configured_ms * 1e-3 + kSlack) << what;
  };
  const LayerProfile& a = (*profiles)[0];
  const LayerProfile& b = (*profiles)[1];
  expect_time(a.forward_seconds, 13, "layer 0 F");
  expect_time(a.backward_input_seconds, 52, "layer 0 BI");
  expect_time(a.backward_weight_seconds, 26, "layer 0 BW");
  expect_time(b.forward_seconds, 65, "layer 1 F");
  expect_time(b.backward_input_seconds, 39, "layer 1 BI");
  expect_time(b.backward_weight_seconds, 0, "layer 1 BW");

  // Delays have no parameters and stash nothing; what the stage holds is the
  // output gradient, from BI until BW: 3 samples * 2 floats.
  for (const LayerProfile& p : *profiles) {
    EXPECT_EQ(p.parameter_bytes, 0);
    EXPECT_EQ(p.activation_bytes, 3 * 2 * 4);
  }
}

TEST(ProfileLayersTest, DenseBytesAreExactAndScaleWithTheMicrobatch) {
  // dense 3 -> 5, relu, dense 5 -> 7 (the last one not the first stage, so
  // its BI computes dx).
  const ModelSpec spec =
      Parse(Model("    - dense: {features: 5}\n"
                  "    - relu\n"
                  "    - dense: {features: 7, bias: false}\n",
                  "[3]"));
  for (const int64_t samples : {2, 8}) {
    SCOPED_TRACE(absl::StrCat(samples, " samples"));
    absl::StatusOr<std::vector<LayerProfile>> profiles =
        ProfileLayers(CpuBackend::Get(), spec,
                      {.microbatch_size = samples, .repetitions = 1});
    ASSERT_TRUE(profiles.ok()) << profiles.status();
    ASSERT_EQ(profiles->size(), 3u);
    EXPECT_EQ((*profiles)[0].parameter_bytes, (3 * 5 + 5) * 4);
    EXPECT_EQ((*profiles)[1].parameter_bytes, 0);
    EXPECT_EQ((*profiles)[2].parameter_bytes, 5 * 7 * 4);
    // Dense and relu stash their input from F until BW; the stage also holds
    // the output gradient from BI until BW.
    EXPECT_EQ((*profiles)[0].activation_bytes, samples * (3 + 5) * 4);
    EXPECT_EQ((*profiles)[1].activation_bytes, samples * (5 + 5) * 4);
    EXPECT_EQ((*profiles)[2].activation_bytes, samples * (5 + 7) * 4);
    for (const LayerProfile& p : *profiles) {
      EXPECT_GE(p.forward_seconds, 0);
      EXPECT_GE(p.backward_input_seconds, 0);
      EXPECT_GE(p.backward_weight_seconds, 0);
    }

    // The layers' figures add up to what a stage of all three holds.
    absl::StatusOr<std::unique_ptr<Stage>> stage =
        Stage::Create(CpuBackend::Get(), spec, 0);
    ASSERT_TRUE(stage.ok()) << stage.status();
    const Tensor x = *CpuBackend::Get()->Zeros({samples, 3});
    const Tensor dy = *CpuBackend::Get()->Zeros({samples, 7});
    ASSERT_TRUE((*stage)->Forward(0, x).ok());
    ASSERT_TRUE((*stage)->BackwardInput(0, dy).ok());
    EXPECT_EQ(static_cast<int64_t>((*stage)->peak_activation_bytes()),
              (*profiles)[0].activation_bytes +
                  (*profiles)[1].activation_bytes +
                  (*profiles)[2].activation_bytes);
  }
}

TEST(ProfileLayersTest, RematHoldsAtLeastAsMuch) {
  const std::string layers = "    - dense: {features: 5}\n    - relu\n";
  const ModelSpec plain = Parse(Model(layers, "[3]"));
  const ModelSpec remat = Parse(Model(layers, "[3]", "mse", 0, true));
  const ProfileOptions options = {.microbatch_size = 4, .repetitions = 1};
  absl::StatusOr<std::vector<LayerProfile>> p =
      ProfileLayers(CpuBackend::Get(), plain, options);
  absl::StatusOr<std::vector<LayerProfile>> r =
      ProfileLayers(CpuBackend::Get(), remat, options);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(p->size(), 2u);
  ASSERT_EQ(r->size(), 2u);
  for (size_t i = 0; i < p->size(); ++i) {
    // Under remat the kept input adds to the stash rebuilt for backward.
    EXPECT_GT((*r)[i].activation_bytes, (*p)[i].activation_bytes) << i;
    EXPECT_EQ((*r)[i].parameter_bytes, (*p)[i].parameter_bytes) << i;
  }
}

TEST(ProfileLayersTest, TokenModelProfilesEveryLayer) {
  ModelSpec spec = Parse(Model(
      "    - embedding: {vocab_size: 16, features: 8, max_positions: 4}\n"
      "    - transformer_block: {heads: 2, mlp_features: 16, causal: true}\n"
      "    - layernorm\n"
      "    - lm_head: {vocab_size: 16}\n",
      "[4]", "cross_entropy"));
  ASSERT_TRUE(spec.token_input);
  // Parameters initialised without a seed (from a file, not read here).
  spec.seed.reset();
  spec.init_from = "params.safetensors";
  absl::StatusOr<std::vector<LayerProfile>> profiles = ProfileLayers(
      CpuBackend::Get(), spec, {.microbatch_size = 2, .repetitions = 2});
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  ASSERT_EQ(profiles->size(), spec.layers.size());
  for (size_t i = 0; i < profiles->size(); ++i) {
    SCOPED_TRACE(absl::StrCat("layer ", i));
    const LayerProfile& p = (*profiles)[i];
    int64_t param_bytes = 0;
    for (const ParamSpec& ps : spec.layers[i].params) {
      param_bytes += ps.NumElements() * 4;
    }
    EXPECT_GT(param_bytes, 0);
    EXPECT_EQ(p.parameter_bytes, param_bytes);
    EXPECT_GT(p.activation_bytes, 0);
    EXPECT_GE(p.forward_seconds, 0);
    EXPECT_GE(p.backward_input_seconds, 0);
    EXPECT_GE(p.backward_weight_seconds, 0);
  }
  // The embedding stashes its I64 ids [2, 4] and holds the output gradient
  // [2, 4, 8] from BI until BW.
  EXPECT_EQ((*profiles)[0].activation_bytes, 2 * 4 * 8 + 2 * 4 * 8 * 4);
}

std::string KeyModel(int seed, bool boundary, int features, double delay_ms,
                     bool remat) {
  return Model(absl::StrCat("    - dense: {features: ", features,
                            "}\n"
                            "    - relu\n",
                            boundary ? "    - boundary\n" : "",
                            "    - delay: {forward_ms: ", delay_ms,
                            ", backward_ms: 1}\n"
                            "    - dense: {features: 4}\n"),
               "[4]", "mse", seed, remat);
}

TEST(ProfileKeyTest, IgnoresSeedAndBoundariesButNotShapesOrCosts) {
  const ModelSpec base = Parse(KeyModel(0, false, 8, 1, false));
  const std::string key = ProfileKey(base, 4);
  EXPECT_FALSE(key.empty());
  EXPECT_EQ(ProfileKey(base, 4), key);

  // Same layers: another seed, another split, another init source.
  EXPECT_EQ(ProfileKey(Parse(KeyModel(7, false, 8, 1, false)), 4), key);
  const ModelSpec split = Parse(KeyModel(0, true, 8, 1, false));
  ASSERT_EQ(split.num_stages, 2);
  EXPECT_EQ(ProfileKey(split, 4), key);
  ModelSpec recut = base;
  ASSERT_TRUE(SetStageBoundaries(&recut, {0, 1, 3}).ok());
  recut.seed.reset();
  recut.init_from = "params.safetensors";
  EXPECT_EQ(ProfileKey(recut, 4), key);

  // Different work.
  EXPECT_NE(ProfileKey(Parse(KeyModel(0, false, 9, 1, false)), 4), key);
  EXPECT_NE(ProfileKey(Parse(KeyModel(0, false, 8, 1.5, false)), 4), key);
  EXPECT_NE(ProfileKey(Parse(KeyModel(0, false, 8, 1, true)), 4), key);
  EXPECT_NE(ProfileKey(base, 5), key);
  ModelSpec no_bias = base;
  no_bias.layers[0].bias = false;
  no_bias.layers[0].params.pop_back();
  EXPECT_NE(ProfileKey(no_bias, 4), key);
  // A delay time that differs only in the last bit still counts.
  ModelSpec nudged = base;
  nudged.layers[2].forward_ms = std::nextafter(1.0, 2.0);
  EXPECT_NE(ProfileKey(nudged, 4), key);
}

TEST(ProfileLayersTest, RejectsOptionsOutOfRange) {
  const ModelSpec spec = SixLayers();
  const std::vector<ProfileOptions> bad = {
      {.microbatch_size = 0, .repetitions = 1},
      {.microbatch_size = -3, .repetitions = 1},
      {.microbatch_size = 1, .repetitions = 0},
      {.microbatch_size = 1, .repetitions = 101},
  };
  for (const ProfileOptions& options : bad) {
    EXPECT_EQ(ProfileLayers(CpuBackend::Get(), spec, options).status().code(),
              absl::StatusCode::kInvalidArgument)
        << options.microbatch_size << " samples, " << options.repetitions
        << " repetitions";
  }
  EXPECT_TRUE(ProfileLayers(CpuBackend::Get(), spec,
                            {.microbatch_size = 1, .repetitions = 100})
                  .ok());
}

TEST(ProfileLayersTest, StopsWhenCancelled) {
  const ModelSpec spec = SixLayers();
  {
    Cancellation cancellation;
    cancellation.Cancel(absl::CancelledError("job cancelled"));
    CancellationScope scope(&cancellation);
    absl::StatusOr<std::vector<LayerProfile>> profiles = ProfileLayers(
        CpuBackend::Get(), spec, {.microbatch_size = 1, .repetitions = 1});
    EXPECT_EQ(profiles.status(), absl::CancelledError("job cancelled"));
  }
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  EXPECT_TRUE(ProfileLayers(CpuBackend::Get(), spec,
                            {.microbatch_size = 1, .repetitions = 1})
                  .ok());
}

TEST(ProfileLayersTest, CancellationStopsAProfileInProgress) {
  // 20 delay layers of 5 ms forward, 4 runs each: at least 400 ms in full;
  // and one of a minute, which a cancel must cut short.
  std::string layers;
  for (int i = 0; i < 20; ++i) {
    absl::StrAppend(&layers, "    - delay: {forward_ms: 5, backward_ms: 0}\n");
  }
  absl::StrAppend(&layers,
                  "    - delay: {forward_ms: 60000, backward_ms: 0}\n");
  const ModelSpec spec = Parse(Model(layers, "[2]"));
  for (const int cancel_after_ms : {20, 600}) {
    SCOPED_TRACE(cancel_after_ms);
    Cancellation cancellation;
    CancellationScope scope(&cancellation);
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(cancel_after_ms));
      cancellation.Cancel(absl::CancelledError("cancelled"));
    });
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<LayerProfile>> profiles = ProfileLayers(
        CpuBackend::Get(), spec, {.microbatch_size = 1, .repetitions = 3});
    const auto took = std::chrono::steady_clock::now() - start;
    canceller.join();
    EXPECT_EQ(profiles.status().code(), absl::StatusCode::kCancelled)
        << profiles.status();
    // A liveness bound: the profile would take over four minutes.
    EXPECT_LT(took, std::chrono::seconds(30));
  }
}

}  // namespace
}  // namespace conveyor::engine
