#include "engine/stage.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "engine/precision.h"
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

// Under bf16 GEMMs each matrix parameter keeps a bf16 copy, made when its
// value changes (initialization, the optimizer's update) instead of on every
// GEMM call. Rounding is idempotent, so a stage whose GEMMs read the copies
// computes bit for bit what one rounding on every call computes, step after
// step: a copy left stale by an update would show at the next step.
TEST(StageTest, Bf16GemmCopiesComputeWhatRoundingEveryCallComputes) {
  const ModelSpec spec = Parse(
      "    - llama_block: {heads: 2, kv_heads: 1, mlp_features: 24}\n"
      "    - dense: {features: 5}\n",
      "[6, 16]");
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  auto build = [&](bool copies) {
    absl::StatusOr<std::unique_ptr<Stage>> stage = Stage::Create(bf16, spec, 0);
    EXPECT_TRUE(stage.ok()) << stage.status();
    EXPECT_TRUE((*stage)->InitializeFromSeed(3).ok());
    if (!copies) {
      for (Parameter* p : (*stage)->parameters()) p->value_bf16 = Tensor();
    }
    return *std::move(stage);
  };
  std::unique_ptr<Stage> with = build(true), without = build(false);
  int copies = 0;
  for (Parameter* p : with->parameters()) {
    if (!p->value_bf16.defined()) continue;
    ++copies;
    EXPECT_EQ(p->value_bf16.dtype(), DType::kBF16) << p->name;
    EXPECT_EQ(p->value_bf16.shape(), p->value.shape()) << p->name;
  }
  // q, k, v, o, gate, up, down and the dense weight; not the norms or bias.
  EXPECT_EQ(copies, 8);
  const OptimizerConfig adamw{.kind = OptimizerConfig::Kind::kAdamW,
                              .lr = 1e-2};
  absl::StatusOr<std::unique_ptr<Optimizer>> opt_with =
      Optimizer::Create(bf16, adamw, with->parameters());
  absl::StatusOr<std::unique_ptr<Optimizer>> opt_without =
      Optimizer::Create(bf16, adamw, without->parameters());
  ASSERT_TRUE(opt_with.ok() && opt_without.ok());
  for (int step = 0; step < 3; ++step) {
    const Tensor x = RandomTensor({2, 6, 16}, 10 + step);
    const Tensor dy = RandomTensor({2, 6, 5}, 20 + step);
    for (Optimizer* o : {opt_with->get(), opt_without->get()}) o->ZeroGrad();
    absl::StatusOr<Tensor> a = with->Forward(0, x);
    absl::StatusOr<Tensor> b = without->Forward(0, x);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(ToVector(*a), ToVector(*b)) << "step " << step;
    ASSERT_TRUE(with->Backward(0, dy).ok());
    ASSERT_TRUE(without->Backward(0, dy).ok());
    std::vector<Parameter*> pa = with->parameters(), pb = without->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(ToVector(pa[i]->grad), ToVector(pb[i]->grad))
          << pa[i]->name << " step " << step;
    }
    ASSERT_TRUE((*opt_with)->Step().ok());
    ASSERT_TRUE((*opt_without)->Step().ok());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(ToVector(pa[i]->value), ToVector(pb[i]->value))
          << pa[i]->name << " step " << step;
      if (!pa[i]->value_bf16.defined()) continue;
      // The copy follows the update.
      Tensor widened = *bf16->Empty(pa[i]->value.shape(), DType::kF32);
      bf16->CastFromBf16(pa[i]->value_bf16, widened);
      const std::vector<float> value = ToVector(pa[i]->value);
      const std::vector<float> copy = ToVector(widened);
      for (size_t j = 0; j < value.size(); ++j) {
        ASSERT_EQ(copy[j], RoundToBf16(value[j]))
            << pa[i]->name << "[" << j << "] step " << step;
      }
    }
  }
}

// An embedding's table is looked up, never multiplied: no bf16 copy. A tied
// head multiplies its own copy of the table, which has one.
TEST(StageTest, OnlyGemmOperandsHaveBf16Copies) {
  const ModelSpec spec = Parse(
      "    - embedding: {vocab_size: 32, features: 16}\n"
      "    - lm_head: {vocab_size: 32, tied: true}\n",
      "[6]");
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(CpuBackend::Get(Precision::kBf16), spec, 0);
  ASSERT_TRUE(stage.ok()) << stage.status();
  int tables = 0, heads = 0;
  for (Parameter* p : (*stage)->parameters()) {
    if (p->tied_copy) {
      ++heads;
      EXPECT_TRUE(p->value_bf16.defined()) << p->name;
    } else {
      ++tables;
      EXPECT_FALSE(p->value_bf16.defined()) << p->name;
    }
  }
  EXPECT_EQ(tables, 1);
  EXPECT_EQ(heads, 1);
}

// An fp32 backend keeps no copies: nothing changes for fp32 training.
TEST(StageTest, Fp32ParametersHaveNoBf16Copies) {
  std::unique_ptr<Stage> stage =
      Build(Parse("    - dense: {features: 5}\n", "[3]"));
  for (Parameter* p : stage->parameters()) {
    EXPECT_FALSE(p->value_bf16.defined()) << p->name;
  }
}

}  // namespace
}  // namespace conveyor::engine
