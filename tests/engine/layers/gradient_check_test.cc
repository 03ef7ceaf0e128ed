// Finite-difference checks of every layer's input gradient (BI) and weight
// gradient (BW): L = sum(w * layer(x)) for a random w, so dL/dy = w.
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/layers/activation.h"
#include "engine/layers/attention.h"
#include "engine/layers/composite.h"
#include "engine/layers/dense.h"
#include "engine/layers/embedding.h"
#include "engine/layers/layer_norm.h"
#include "engine/layers/transformer_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::FromVector;
using testing_util::Ids;
using testing_util::Random;
using testing_util::RandomTensor;
using testing_util::ToVector;

Backend* B() { return CpuBackend::Get(); }

// Fills every parameter with small random values (not the real init: the
// check needs non-trivial values everywhere, e.g. layernorm weights != 1).
void RandomizeParameters(Layer& layer, uint32_t seed) {
  for (Parameter* p : layer.parameters()) {
    auto v = Random(p->value.numel(), seed++, 0.5f);
    ASSERT_TRUE(B()->CopyFromHost(v.data(), v.size() * 4, p->value).ok());
    B()->Fill(p->grad, 0.0f);
  }
}

double Objective(Layer& layer, const Tensor& x, const Tensor& w) {
  Stash stash;
  auto y = layer.Forward(x, stash);
  EXPECT_TRUE(y.ok()) << y.status();
  double s = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    s += static_cast<double>(y->data<float>()[i]) * w.data<float>()[i];
  }
  return s;
}

// Up to `count` distinct indices of [0, n), always including 0 and n-1.
std::vector<int64_t> Sample(int64_t n, int count, uint32_t seed) {
  std::vector<int64_t> out;
  if (n <= count) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  std::mt19937 gen(seed);
  out = {0, n - 1};
  while (static_cast<int>(out.size()) < count) out.push_back(gen() % n);
  return out;
}

double Numeric(Layer& layer, const Tensor& x, const Tensor& w, float* at) {
  const double h = 5e-3;
  const float saved = *at;
  *at = static_cast<float>(saved + h);
  const double up = Objective(layer, x, w);
  *at = static_cast<float>(saved - h);
  const double down = Objective(layer, x, w);
  *at = saved;
  return (up - down) / (2 * h);
}

void ExpectClose(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-2 + 1e-2 * std::abs(numeric)) << what;
}

// Runs forward, BI and BW, then compares dx (when x is float) and every
// parameter gradient with central differences.
void CheckGradients(Layer& layer, Tensor x, uint32_t seed) {
  RandomizeParameters(layer, seed);
  Stash stash;
  auto y = layer.Forward(x, stash);
  ASSERT_TRUE(y.ok()) << y.status();
  Tensor w = RandomTensor(y->shape(), seed + 100);
  const bool float_input = x.dtype() == DType::kF32;
  auto dx = layer.BackwardInput(w, stash, float_input);
  ASSERT_TRUE(dx.ok()) << dx.status();
  ASSERT_TRUE(layer.BackwardWeight(w, stash).ok());
  if (float_input) {
    ASSERT_TRUE(dx->defined());
    for (int64_t i : Sample(x.numel(), 30, seed)) {
      ExpectClose(dx->data<float>()[i],
                  Numeric(layer, x, w, x.data<float>() + i),
                  "dx[" + std::to_string(i) + "]");
    }
  }
  for (Parameter* p : layer.parameters()) {
    for (int64_t i : Sample(p->value.numel(), 20, seed + 7)) {
      ExpectClose(p->grad.data<float>()[i],
                  Numeric(layer, x, w, p->value.data<float>() + i),
                  p->name + "[" + std::to_string(i) + "]");
    }
  }
}

TEST(GradientCheckTest, Dense) {
  auto dense = *Dense::Create(B(), "layers.0.", 4, 3, true);
  CheckGradients(*dense, RandomTensor({5, 4}, 1), 1);
  // Names and shapes as torch.nn.Linear.
  ASSERT_EQ(dense->parameters().size(), 2u);
  EXPECT_EQ(dense->parameters()[0]->name, "layers.0.weight");
  EXPECT_EQ(dense->parameters()[0]->value.shape(), (Shape{3, 4}));
  EXPECT_EQ(dense->parameters()[1]->name, "layers.0.bias");
}

TEST(GradientCheckTest, DenseOnSequencesAndWithoutBias) {
  auto dense = *Dense::Create(B(), "head.", 4, 6, false);
  CheckGradients(*dense, RandomTensor({2, 3, 4}, 2), 2);
  EXPECT_EQ(dense->parameters().size(), 1u);
}

TEST(GradientCheckTest, Activations) {
  for (auto kind : {Activation::Kind::kRelu, Activation::Kind::kGelu,
                    Activation::Kind::kGeluTanh}) {
    Activation act(B(), kind);
    // Keep inputs away from ReLU's kink, where the difference quotient lies.
    auto v = Random(24, 3);
    for (float& f : v) f += f >= 0 ? 0.1f : -0.1f;
    CheckGradients(act, FromVector({4, 6}, v), 3);
  }
}

TEST(GradientCheckTest, LayerNorm) {
  auto norm = *LayerNormLayer::Create(B(), "norm.", 6, 1e-5f);
  CheckGradients(*norm, RandomTensor({2, 3, 6}, 4), 4);
}

TEST(GradientCheckTest, EmbeddingWithPositions) {
  auto emb = *Embedding::Create(B(), "layers.0.", 7, 4, 5);
  Tensor ids = Ids({2, 3}, {1, 6, 1, 0, 3, 6});  // Repeated ids accumulate.
  CheckGradients(*emb, ids, 5);
  EXPECT_EQ(emb->parameters()[1]->name, "layers.0.position.weight");
  Stash stash;
  EXPECT_EQ(
      emb->Forward(Ids({1, 6}, {0, 0, 0, 0, 0, 0}), stash).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(GradientCheckTest, SelfAttention) {
  for (bool causal : {false, true}) {
    auto attn = *SelfAttention::Create(B(), "attn.", 6, 2, 4, causal, true);
    CheckGradients(*attn, RandomTensor({2, 3, 6}, 6), 6);
  }
  EXPECT_EQ(
      SelfAttention::Create(B(), "attn.", 6, 4, 6, false, true).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(GradientCheckTest, CausalAttentionIgnoresTheFuture) {
  auto attn = *SelfAttention::Create(B(), "attn.", 4, 2, 4, true, true);
  RandomizeParameters(*attn, 9);
  Tensor x = RandomTensor({1, 3, 4}, 9);
  Stash s1, s2;
  std::vector<float> before = ToVector(*attn->Forward(x, s1));
  x.data<float>()[2 * 4 + 1] += 1.0f;  // Change the last position only.
  std::vector<float> after = ToVector(*attn->Forward(x, s2));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(before[i], after[i]) << i;
  EXPECT_NE(before[9], after[9]);
}

TEST(GradientCheckTest, TransformerBlocks) {
  for (bool pre_norm : {false, true}) {
    auto block = *MakeTransformerBlock(
        B(), "layers.1.",
        {.features = 4, .heads = 2, .mlp_features = 8, .pre_norm = pre_norm});
    CheckGradients(*block, RandomTensor({2, 3, 4}, 7), 7);
  }
  auto block = *MakeTransformerBlock(
      B(), "layers.1.", {.features = 4, .heads = 2, .mlp_features = 8});
  std::vector<std::string> names;
  for (Parameter* p : block->parameters()) names.push_back(p->name);
  EXPECT_THAT(
      names, ::testing::ElementsAre(
                 "layers.1.attn.in_proj_weight", "layers.1.attn.in_proj_bias",
                 "layers.1.attn.out_proj.weight", "layers.1.attn.out_proj.bias",
                 "layers.1.norm1.weight", "layers.1.norm1.bias",
                 "layers.1.mlp.0.weight", "layers.1.mlp.0.bias",
                 "layers.1.mlp.2.weight", "layers.1.mlp.2.bias",
                 "layers.1.norm2.weight", "layers.1.norm2.bias"));
}

TEST(GradientCheckTest, SplitBackwardEqualsRunningBIAndBWLater) {
  // BW may run long after BI (zero-bubble): other microbatches in between
  // must not disturb the stashed tensors.
  auto chain_layers = std::vector<std::unique_ptr<Layer>>();
  chain_layers.push_back(*Dense::Create(B(), "layers.0.", 4, 8, true));
  chain_layers.push_back(
      std::make_unique<Activation>(B(), Activation::Kind::kGelu));
  chain_layers.push_back(*Dense::Create(B(), "layers.2.", 8, 4, true));
  Chain chain(std::move(chain_layers));
  RandomizeParameters(chain, 11);
  Tensor x1 = RandomTensor({3, 4}, 12), x2 = RandomTensor({3, 4}, 13);
  Tensor w1 = RandomTensor({3, 4}, 14), w2 = RandomTensor({3, 4}, 15);
  // Interleaved: F1 F2 BI1 BI2 BW2 BW1.
  Stash s1, s2;
  ASSERT_TRUE(chain.Forward(x1, s1).ok());
  ASSERT_TRUE(chain.Forward(x2, s2).ok());
  ASSERT_TRUE(chain.BackwardInput(w1, s1, true).ok());
  ASSERT_TRUE(chain.BackwardInput(w2, s2, true).ok());
  ASSERT_TRUE(chain.BackwardWeight(w2, s2).ok());
  ASSERT_TRUE(chain.BackwardWeight(w1, s1).ok());
  std::vector<std::vector<float>> interleaved;
  for (Parameter* p : chain.parameters()) {
    interleaved.push_back(ToVector(p->grad));
    B()->Fill(p->grad, 0.0f);
  }
  // Sequential full backwards.
  for (auto [x, w] : {std::pair{x1, w1}, std::pair{x2, w2}}) {
    Stash s;
    ASSERT_TRUE(chain.Forward(x, s).ok());
    ASSERT_TRUE(chain.BackwardInput(w, s, true).ok());
    ASSERT_TRUE(chain.BackwardWeight(w, s).ok());
  }
  auto params = chain.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(testing_util::AllClose(ToVector(params[i]->grad),
                                       interleaved[i], 1e-6, 1e-6))
        << params[i]->name;
  }
}

}  // namespace
}  // namespace conveyor::engine
