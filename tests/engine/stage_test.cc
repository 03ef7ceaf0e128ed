#include "engine/stage.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::RandomTensor;
using testing_util::ToVector;

ModelSpec Parse(const std::string& layers, const std::string& input_shape) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(
      absl::StrCat("model:\n  input_shape: ", input_shape,
                   "\n  init: {seed: 3}\n  loss: mse\n  layers:\n", layers),
      "stage.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::unique_ptr<Stage> Build(const ModelSpec& spec) {
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(CpuBackend::Get(), spec, 0);
  EXPECT_TRUE(stage.ok()) << stage.status();
  EXPECT_TRUE((*stage)->InitializeFromSeed(3).ok());
  return *std::move(stage);
}

// The weight gradients of `split` (run F, BI, BW) equal those of `whole`
// after a full backward of the same microbatch, bit for bit.
void ExpectWholeBackwardsGradients(Stage& split, Stage& whole, const Tensor& x,
                                   const Tensor& dy) {
  ASSERT_TRUE(whole.Forward(0, x).ok());
  ASSERT_TRUE(whole.Backward(0, dy).ok());
  std::vector<Parameter*> a = split.parameters(), b = whole.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(ToVector(a[i]->grad), ToVector(b[i]->grad)) << a[i]->name;
  }
}

// After BI a microbatch keeps only what BW reads: each dense layer's input
// and output gradient; the ReLU between them needs nothing. So a zero-bubble
// schedule holding BWs back holds less than a forward stash plus gradients.
TEST(StageTest, BackwardInputKeepsOnlyWhatTheWeightBackwardReads) {
  const ModelSpec spec = Parse(
      "    - dense: {features: 5}\n    - relu\n    - dense: {features: 7}\n",
      "[3]");
  constexpr int64_t kSamples = 4;
  std::unique_ptr<Stage> split = Build(spec);
  std::unique_ptr<Stage> whole = Build(spec);
  const Tensor x = RandomTensor({kSamples, 3}, 1);
  const Tensor dy = RandomTensor({kSamples, 7}, 2);
  ASSERT_TRUE(split->Forward(0, x).ok());
  // Forward saves dense 1's input (3), the ReLU's input (5) and dense 2's
  // input (5).
  EXPECT_EQ(split->live_activation_bytes(), kSamples * (3 + 5 + 5) * 4);
  ASSERT_TRUE(split->BackwardInput(0, dy).ok());
  // During BI the output gradients of all three layers (5, 5, 7) joined
  // them; after it, the ReLU's input and output gradient are gone.
  EXPECT_EQ(split->peak_activation_bytes(),
            kSamples * (3 + 5 + 5 + 5 + 5 + 7) * 4);
  EXPECT_EQ(split->live_activation_bytes(), kSamples * (3 + 5 + 5 + 7) * 4);
  ASSERT_TRUE(split->BackwardWeight(0).ok());
  EXPECT_EQ(split->live_activation_bytes(), 0u);

  ExpectWholeBackwardsGradients(*split, *whole, x, dy);
}

// Fused attention keeps no [seq, seq] tensor: every stashed tensor is
// [batch, seq, ...], so the stash, before and after BI, grows exactly
// linearly with the sequence (the materializing path's scores made it grow
// quadratically). After BI the stage keeps only what BW reads, and BW then
// gives a full backward's gradients bit for bit.
TEST(StageTest, AttentionStashIsLinearInTheSequence) {
  size_t forward[2], after_bi[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t seq = 32 << i;
    const ModelSpec spec = Parse(
        "    - transformer_block: {heads: 2, mlp_features: 16, "
        "norm: post, causal: true}\n",
        absl::StrCat("[", seq, ", 8]"));
    std::unique_ptr<Stage> split = Build(spec);
    std::unique_ptr<Stage> whole = Build(spec);
    const Tensor x = RandomTensor({2, seq, 8}, 1);
    const Tensor dy = RandomTensor({2, seq, 8}, 2);
    ASSERT_TRUE(split->Forward(0, x).ok());
    forward[i] = split->live_activation_bytes();
    ASSERT_TRUE(split->BackwardInput(0, dy).ok());
    after_bi[i] = split->live_activation_bytes();
    EXPECT_GT(after_bi[i], 0u);
    ASSERT_TRUE(split->BackwardWeight(0).ok());
    EXPECT_EQ(split->live_activation_bytes(), 0u);
    ExpectWholeBackwardsGradients(*split, *whole, x, dy);
  }
  EXPECT_EQ(forward[1], 2 * forward[0]);
  EXPECT_EQ(after_bi[1], 2 * after_bi[0]);
}

}  // namespace
}  // namespace conveyor::engine
