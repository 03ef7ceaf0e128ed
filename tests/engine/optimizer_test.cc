#include "engine/optimizer.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/layers/dense.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::FromVector;
using testing_util::ToVector;

Backend* B() { return CpuBackend::Get(); }

Parameter Param(std::vector<float> value, std::vector<float> grad) {
  const Shape shape = {static_cast<int64_t>(value.size())};
  return {"p", FromVector(shape, value), FromVector(shape, grad)};
}

TEST(OptimizerTest, LearningRateSchedules) {
  OptimizerConfig c;
  c.lr = 1.0;
  EXPECT_DOUBLE_EQ(LearningRate(c, 100), 1.0);
  c.schedule = {.kind = LrSchedule::Kind::kLinearWarmup, .warmup_steps = 4};
  EXPECT_DOUBLE_EQ(LearningRate(c, 0), 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(c, 3), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(c, 50), 1.0);
  c.schedule = {.kind = LrSchedule::Kind::kCosine,
                .warmup_steps = 2,
                .total_steps = 12,
                .min_lr = 0.1};
  EXPECT_DOUBLE_EQ(LearningRate(c, 1), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(c, 2), 1.0);
  EXPECT_NEAR(LearningRate(c, 7), 0.55, 1e-12);  // Halfway: (1 + 0.1) / 2.
  EXPECT_DOUBLE_EQ(LearningRate(c, 12), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 40), 0.1);
}

TEST(OptimizerTest, ClipsByTheGlobalNormLikeTorch) {
  // grads (3, 4): norm 5; clip to 1 scales them by 1 / (5 + 1e-6).
  Parameter p = Param({0, 0}, {3, 4});
  OptimizerConfig c{.kind = OptimizerConfig::Kind::kSgd, .lr = 1.0};
  c.clip_grad_norm = 1.0;
  auto opt = *Optimizer::Create(B(), c, {&p});
  auto norm = opt->Step();
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 5.0, 1e-6);
  EXPECT_TRUE(
      testing_util::AllClose(ToVector(p.value), {-0.6f, -0.8f}, 1e-5, 0));
  // A norm reduced over other stages is used as given.
  Parameter q = Param({0}, {1});
  auto opt2 = *Optimizer::Create(B(), c, {&q});
  ASSERT_TRUE(opt2->Step(10.0).ok());
  EXPECT_NEAR(ToVector(q.value)[0], -0.1f, 1e-6);
  EXPECT_EQ(opt2->step(), 1);
}

TEST(OptimizerTest, AdamWUsesTorchDefaultWeightDecay) {
  // adamw default weight_decay 0.01: w = 1 * (1 - lr * 0.01) - lr * sign(g).
  Parameter p = Param({1}, {0.5});
  auto opt = *Optimizer::Create(
      B(), {.kind = OptimizerConfig::Kind::kAdamW, .lr = 0.1}, {&p});
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_NEAR(ToVector(p.value)[0], 0.999f - 0.1f, 1e-6);
  opt->ZeroGrad();
  EXPECT_EQ(ToVector(p.grad)[0], 0.0f);
}

TEST(OptimizerTest, SgdMomentumOverTwoSteps) {
  // torch.optim.SGD(lr=0.1, momentum=0.9), grad 1 both steps: buf 1 then
  // 1.9; w = 1 - 0.1 - 0.19 = 0.71.
  Parameter p = Param({1}, {1});
  auto opt = *Optimizer::Create(
      B(), {.kind = OptimizerConfig::Kind::kSgd, .lr = 0.1, .momentum = 0.9},
      {&p});
  ASSERT_TRUE(opt->Step().ok());
  ASSERT_TRUE(opt->Step().ok());
  EXPECT_NEAR(ToVector(p.value)[0], 0.71f, 1e-6);
}

// Resume continues bitwise: an optimizer restored from another's state after
// k steps takes the same next steps, for every kind with state.
TEST(OptimizerTest, RestoredStateContinuesBitwise) {
  const OptimizerConfig configs[] = {
      {.kind = OptimizerConfig::Kind::kSgd, .lr = 0.1, .momentum = 0.9},
      {.kind = OptimizerConfig::Kind::kAdam, .lr = 0.01},
      {.kind = OptimizerConfig::Kind::kAdamW,
       .lr = 0.01,
       .schedule = {.kind = LrSchedule::Kind::kCosine,
                    .total_steps = 6,
                    .min_lr = 0.001}}};
  for (const OptimizerConfig& c : configs) {
    Parameter a = Param({1, -2, 3}, {0.5, 0.25, -1});
    auto original = *Optimizer::Create(B(), c, {&a});
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(original->Step().ok());

    std::map<std::string, std::vector<float>> saved;
    for (const Optimizer::StateTensor& s : original->StateTensors()) {
      EXPECT_EQ(s.param, &a);
      saved[s.slot] = ToVector(s.tensor);
    }
    EXPECT_EQ(saved.size(), c.kind == OptimizerConfig::Kind::kSgd ? 1u : 2u);
    EXPECT_TRUE(saved.contains(
        c.kind == OptimizerConfig::Kind::kSgd ? "momentum_buffer" : "exp_avg"));

    Parameter b = Param(ToVector(a.value), {0.5, 0.25, -1});
    auto restored = *Optimizer::Create(B(), c, {&b});
    ASSERT_TRUE(
        restored
            ->RestoreState(3,
                           [&](absl::string_view slot, const Parameter& p)
                               -> absl::StatusOr<std::vector<float>> {
                             EXPECT_EQ(&p, &b);
                             return saved.at(std::string(slot));
                           })
            .ok());
    EXPECT_EQ(restored->step(), 3);
    EXPECT_EQ(restored->current_lr(), original->current_lr());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(original->Step().ok());
      ASSERT_TRUE(restored->Step().ok());
    }
    EXPECT_EQ(ToVector(a.value), ToVector(b.value));
  }
}

TEST(OptimizerTest, RestoreStateRejectsWrongSizesAndSteps) {
  Parameter p = Param({1, 2}, {0, 0});
  auto opt = *Optimizer::Create(
      B(), {.kind = OptimizerConfig::Kind::kAdam, .lr = 0.1}, {&p});
  auto short_reader = [](absl::string_view, const Parameter&)
      -> absl::StatusOr<std::vector<float>> { return std::vector<float>{1}; };
  absl::Status s = opt->RestoreState(1, short_reader);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("optimizer state exp_avg of 'p' has 1 values; the "
                        "parameter has 2"));
  EXPECT_EQ(opt->step(), 0);  // Nothing restored on failure.
  auto missing = [](absl::string_view slot,
                    const Parameter&) -> absl::StatusOr<std::vector<float>> {
    return absl::NotFoundError(absl::StrCat("no ", slot));
  };
  EXPECT_EQ(opt->RestoreState(1, missing).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(opt->RestoreState(-1, short_reader).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, RejectsInconsistentSettings) {
  Parameter p = Param({1}, {1});
  auto check = [&](OptimizerConfig c, const char* message) {
    auto opt = Optimizer::Create(B(), c, {&p});
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opt.status().message(), HasSubstr(message));
  };
  check({.lr = -1}, "lr must be >= 0");
  check({.kind = OptimizerConfig::Kind::kSgd, .nesterov = true},
        "nesterov needs momentum > 0");
  check({.beta1 = 1.0}, "betas must each be in [0, 1)");
  OptimizerConfig cosine;
  cosine.schedule = {
      .kind = LrSchedule::Kind::kCosine, .warmup_steps = 5, .total_steps = 5};
  check(cosine, "cosine needs total_steps > warmup_steps");
  OptimizerConfig clip;
  clip.clip_grad_norm = 0.0;
  check(clip, "clip_grad_norm must be > 0");
}

}  // namespace
}  // namespace conveyor::engine
