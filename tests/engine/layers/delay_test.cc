// The delay layer: an identity on values and shapes, with no parameters, that
// takes at least its configured time in every action, alone and when a Stage
// builds it from a model spec. Timing checks are lower bounds only: a loaded
// CI machine can make a wait longer, never shorter.
#include "engine/layers/delay.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "engine/model_spec.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using std::chrono::milliseconds;
using testing_util::FromVector;
using testing_util::ToVector;
using Clock = std::chrono::steady_clock;

// Runs `f` and returns how long it took.
template <typename F>
Clock::duration Timed(F&& f) {
  const Clock::time_point start = Clock::now();
  f();
  return Clock::now() - start;
}

TEST(DelayTest, ForwardIsTheIdentityAndTakesItsTime) {
  Delay delay(/*forward_ms=*/5, /*backward_input_ms=*/0,
              /*backward_weight_ms=*/0);
  EXPECT_TRUE(delay.parameters().empty());
  const Tensor x = FromVector({2, 3}, {1, -2, 3, 4.5f, 0, -6});
  Stash stash;
  absl::StatusOr<Tensor> y;
  const Clock::duration took = Timed([&] { y = delay.Forward(x, stash); });
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_GE(took, milliseconds(5));
  EXPECT_EQ(y->shape(), x.shape());
  EXPECT_EQ(ToVector(*y), ToVector(x));
  // Nothing to keep for the backward.
  EXPECT_EQ(stash.bytes(), 0u);
}

TEST(DelayTest, BackwardInputPassesTheGradientAndTakesItsTime) {
  Delay delay(/*forward_ms=*/0, /*backward_input_ms=*/4,
              /*backward_weight_ms=*/0);
  const Tensor x = FromVector({3}, {1, 2, 3});
  const Tensor dy = FromVector({3}, {0.5f, -1, 7});
  Stash stash;
  ASSERT_TRUE(delay.Forward(x, stash).ok());
  absl::StatusOr<Tensor> dx;
  const Clock::duration took =
      Timed([&] { dx = delay.BackwardInput(dy, stash, /*need_dx=*/true); });
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_GE(took, milliseconds(4));
  EXPECT_EQ(dx->shape(), dy.shape());
  EXPECT_EQ(ToVector(*dx), ToVector(dy));
}

TEST(DelayTest, BackwardInputWaitsEvenWithoutDx) {
  Delay delay(0, 3, 0);
  const Tensor dy = FromVector({2}, {1, 2});
  Stash stash;
  absl::StatusOr<Tensor> dx;
  const Clock::duration took =
      Timed([&] { dx = delay.BackwardInput(dy, stash, /*need_dx=*/false); });
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_FALSE(dx->defined());
  EXPECT_GE(took, milliseconds(3));
}

TEST(DelayTest, BackwardWeightTakesItsTime) {
  Delay delay(0, 0, 6);
  const Tensor dy = FromVector({2}, {1, 2});
  Stash stash;
  absl::Status status;
  const Clock::duration took =
      Timed([&] { status = delay.BackwardWeight(dy, stash); });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_GE(took, milliseconds(6));
}

TEST(DelayTest, KeepsFractionalMilliseconds) {
  const Delay delay(0.25, 1.5, 2e-3);
  EXPECT_EQ(delay.forward_time(), std::chrono::microseconds(250));
  EXPECT_EQ(delay.backward_input_time(), std::chrono::microseconds(1500));
  EXPECT_EQ(delay.backward_weight_time(), std::chrono::microseconds(2));
}

TEST(DelayTest, WaitUntilReturnsAtOrAfterTheDeadline) {
  // Shorter than, equal to and longer than the spin window, and one past.
  for (const auto wait :
       {std::chrono::microseconds(10), kDelaySpinWindow,
        std::chrono::microseconds(1500), std::chrono::microseconds(-100)}) {
    const Clock::time_point deadline = Clock::now() + wait;
    EXPECT_TRUE(WaitUntil(deadline).ok());
    EXPECT_GE(Clock::now(), deadline) << wait.count() << " us";
  }
}

// A job cancelled while its delay layer waits a minute (the longest a spec
// allows) leaves the wait at once with the cancel's status: before, a cancel
// waited out the delay (56.7 s measured). Outside a job's scope, and before
// its cancel, a wait keeps its full length.
TEST(DelayTest, ACancelledJobLeavesALongWaitAtOnce) {
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  Delay delay(60000, 60000, 60000);
  Stash stash;
  const Tensor x = FromVector({1}, {1.0f});
  // The clock starts before the canceller does: its sleep begins after
  // `start`, so the cancel, and the return it causes, come at least 100 ms
  // after `start` however the threads are scheduled. (Timing from after the
  // thread's creation could read 99.9 ms when the thread started sleeping
  // first: CI saw that.)
  const Clock::time_point start = Clock::now();
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(100));
    cancellation.Cancel(absl::CancelledError("cancelled by a test"));
  });
  absl::StatusOr<Tensor> y = delay.Forward(x, stash);
  const Clock::duration took = Clock::now() - start;
  EXPECT_EQ(y.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(y.status().message(), "cancelled by a test");
  canceller.join();
  EXPECT_GE(took, milliseconds(100));
  // A liveness bound, two orders of magnitude below the wait.
  EXPECT_LT(took, std::chrono::seconds(10));
  // Already cancelled: every action returns at once.
  EXPECT_EQ(delay.BackwardInput(x, stash, true).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(delay.BackwardWeight(x, stash).code(),
            absl::StatusCode::kCancelled);
}

TEST(DelayTest, AWaitUnderAnUncancelledScopeKeepsItsLength) {
  Cancellation cancellation;
  CancellationScope scope(&cancellation);
  for (const auto wait :
       {std::chrono::microseconds(300), std::chrono::microseconds(20000)}) {
    const Clock::time_point deadline = Clock::now() + wait;
    EXPECT_TRUE(WaitUntil(deadline).ok());
    EXPECT_GE(Clock::now(), deadline) << wait.count() << " us";
  }
}

// Stage::Create builds delay layers from the spec: a stage of two delays
// waits for both in each action, and a pipeline of them passes values
// through unchanged.
TEST(DelayTest, StageBuildsDelayLayersFromTheSpec) {
  for (const bool remat : {false, true}) {
    SCOPED_TRACE(remat ? "remat" : "no remat");
    absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(
        absl::StrCat("model:\n  input_shape: [2]\n  init: {seed: 0}\n"
                     "  remat: ",
                     remat ? "true" : "false",
                     "\n  loss: mse\n  layers:\n"
                     "    - delay: {forward_ms: 2, backward_ms: 3}\n"
                     "    - delay:\n"
                     "        forward_ms: 1\n"
                     "        backward_input_ms: 2\n"
                     "        backward_weight_ms: 4\n"),
        "delay.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<std::unique_ptr<Stage>> stage =
        Stage::Create(CpuBackend::Get(), *spec, 0);
    ASSERT_TRUE(stage.ok()) << stage.status();
    EXPECT_TRUE((*stage)->parameters().empty());
    ASSERT_TRUE((*stage)->InitializeFromSeed(0).ok());

    const Tensor x = FromVector({3, 2}, {1, 2, 3, 4, 5, 6});
    absl::StatusOr<Tensor> y;
    EXPECT_GE(Timed([&] { y = (*stage)->Forward(/*microbatch=*/0, x); }),
              milliseconds(2 + 1));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(ToVector(*y), ToVector(x));

    const Tensor dy = FromVector({3, 2}, {-1, 0, 1, 2, 3, 4});
    absl::StatusOr<Tensor> dx;
    // The stage's BI runs every layer's BI (3 + 2 ms); under remat it first
    // recomputes the forward (2 + 1 ms).
    EXPECT_GE(Timed([&] { dx = (*stage)->BackwardInput(0, dy); }),
              milliseconds(remat ? 3 + 2 + 2 + 1 : 3 + 2));
    ASSERT_TRUE(dx.ok()) << dx.status();
    // Stage 0 needs no input gradient.
    EXPECT_FALSE(dx->defined());
    absl::Status bw;
    EXPECT_GE(Timed([&] { bw = (*stage)->BackwardWeight(0); }),
              milliseconds(0 + 4));
    EXPECT_TRUE(bw.ok()) << bw;
    EXPECT_EQ((*stage)->in_flight(), 0);
  }
}

TEST(DelayTest, LaterStagePassesTheGradientBack) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(
      "model:\n  input_shape: [2]\n  init: {seed: 0}\n  loss: mse\n"
      "  layers:\n"
      "    - delay: {forward_ms: 0, backward_ms: 0}\n"
      "    - boundary\n"
      "    - delay: {forward_ms: 1, backward_ms: 1}\n",
      "delay.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto stage = Stage::Create(CpuBackend::Get(), *spec, 1);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const Tensor x = FromVector({1, 2}, {3, 4});
  const Tensor dy = FromVector({1, 2}, {0.25f, -0.5f});
  ASSERT_TRUE((*stage)->Forward(7, x).ok());
  absl::StatusOr<Tensor> dx = (*stage)->Backward(7, dy);
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(ToVector(*dx), ToVector(dy));
}

}  // namespace
}  // namespace conveyor::engine
