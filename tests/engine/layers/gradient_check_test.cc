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
#include "engine/layers/llama_attention.h"
#include "engine/layers/llama_block.h"
#include "engine/layers/rms_norm.h"
#include "engine/layers/swiglu.h"
#include "engine/layers/transformer_block.h"
#include "engine/rope.h"
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

// The unscaled rope frequencies of a head of `head_dim`, on the CPU.
RopeFrequencies Freqs(double theta, int64_t head_dim) {
  const RopeTable t = ComputeRopeTable({}, theta, head_dim, 0);
  return {.inv_freq = FromVector({head_dim / 2}, t.inv_freq),
          .attention_factor = t.attention_factor};
}

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

TEST(GradientCheckTest, RmsNorm) {
  auto norm = *RmsNormLayer::Create(B(), "norm.", 6, 1e-6f);
  CheckGradients(*norm, RandomTensor({2, 3, 6}, 21), 21);
  ASSERT_EQ(norm->parameters().size(), 1u);
  EXPECT_EQ(norm->parameters()[0]->name, "norm.weight");
}

TEST(GradientCheckTest, RmsNormMatchesItsDefinition) {
  auto norm = *RmsNormLayer::Create(B(), "norm.", 4, 1e-6f);
  const std::vector<float> w = {1.0f, 2.0f, -1.0f, 0.5f};
  ASSERT_TRUE(
      B()->CopyFromHost(w.data(), 16, norm->parameters()[0]->value).ok());
  // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5.
  Stash stash;
  std::vector<float> y =
      ToVector(*norm->Forward(FromVector({1, 4}, {1, -2, 3, 4}), stash));
  const double r = 1.0 / std::sqrt(7.5 + 1e-6);
  const std::vector<double> want = {1 * r, -4 * r, -3 * r, 2 * r};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << i;
}

TEST(GradientCheckTest, SwiGluMlp) {
  auto mlp = *SwiGluMlp::Create(B(), "mlp.", 4, 6);
  CheckGradients(*mlp, RandomTensor({2, 3, 4}, 22), 22);
  std::vector<std::string> names;
  for (Parameter* p : mlp->parameters()) names.push_back(p->name);
  EXPECT_THAT(names, ::testing::ElementsAre("mlp.gate_proj.weight",
                                            "mlp.up_proj.weight",
                                            "mlp.down_proj.weight"));
}

TEST(GradientCheckTest, RopeIsARotationAtEachPosition) {
  // [rows 1, seq 3, head_dim 4]: position 0 is unchanged, every position
  // keeps each pair's norm, and the inverse undoes it.
  Tensor x = RandomTensor({1, 3, 4}, 23);
  Tensor y = testing_util::ZerosLike(x);
  B()->Rope(x, Freqs(10000.0, 4), /*inverse=*/false, y);
  std::vector<float> xv = ToVector(x), yv = ToVector(y);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(yv[i], xv[i]);
  for (int p = 0; p < 3; ++p) {
    for (int i = 0; i < 2; ++i) {
      const float* a = xv.data() + p * 4;
      const float* b = yv.data() + p * 4;
      EXPECT_NEAR(std::hypot(a[i], a[i + 2]), std::hypot(b[i], b[i + 2]), 1e-6);
    }
  }
  // Position 1, pair 0 turns by exactly 1 radian (inv_freq = 1).
  EXPECT_NEAR(yv[4], xv[4] * std::cos(1.0) - xv[6] * std::sin(1.0), 1e-6);
  EXPECT_NEAR(yv[6], xv[6] * std::cos(1.0) + xv[4] * std::sin(1.0), 1e-6);
  // Pair 1 by 1 / 10000^(2/4) = 0.01 radian.
  EXPECT_NEAR(yv[5], xv[5] * std::cos(0.01) - xv[7] * std::sin(0.01), 1e-6);
  B()->Rope(y, Freqs(10000.0, 4), /*inverse=*/true, y);  // in place
  EXPECT_TRUE(testing_util::AllClose(ToVector(y), xv, 1e-6, 1e-6));
}

TEST(GradientCheckTest, RopeFromAFirstPositionContinuesTheSequence) {
  // A decoder's cache feeds positions 2 and 3 alone: they must turn exactly
  // as rows 2 and 3 of the whole sequence do.
  Tensor whole = RandomTensor({2, 4, 8}, 24);
  Tensor rotated = testing_util::ZerosLike(whole);
  B()->Rope(whole, Freqs(500.0, 8), /*inverse=*/false, rotated);
  std::vector<float> w = ToVector(whole), r = ToVector(rotated);
  std::vector<float> tail_in, tail_want;
  for (int row = 0; row < 2; ++row) {
    for (int p = 2; p < 4; ++p) {
      for (int i = 0; i < 8; ++i) {
        tail_in.push_back(w[(row * 4 + p) * 8 + i]);
        tail_want.push_back(r[(row * 4 + p) * 8 + i]);
      }
    }
  }
  Tensor tail = FromVector({2, 2, 8}, tail_in);
  B()->Rope(tail, Freqs(500.0, 8), /*inverse=*/false, tail, Tensor(),
            /*first_position=*/2);
  EXPECT_EQ(ToVector(tail), tail_want);
}

TEST(GradientCheckTest, LlamaAttention) {
  for (const int64_t kv_heads : {2, 1}) {
    for (const bool bias : {false, true}) {
      auto attn = *LlamaAttention::Create(B(), "attn.",
                                          {.features = 8,
                                           .heads = 2,
                                           .kv_heads = kv_heads,
                                           .rope_theta = 100.0f,
                                           .bias = bias});
      CheckGradients(*attn, RandomTensor({2, 3, 8}, 24), 24);
    }
  }
  EXPECT_EQ(LlamaAttention::Create(B(), "a.",
                                   {.features = 6, .heads = 2, .kv_heads = 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // head_dim 3 is odd
  EXPECT_EQ(LlamaAttention::Create(B(), "a.",
                                   {.features = 12, .heads = 3, .kv_heads = 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // 2 does not divide 3
}

TEST(GradientCheckTest, LlamaAttentionWithItsOwnHeadDim) {
  // Heads wider than features / heads (Qwen3, Gemma): q and o span
  // heads * head_dim = 12 on 8 features, k and v kv_heads * head_dim.
  for (const int64_t kv_heads : {2, 1}) {
    auto attn = *LlamaAttention::Create(B(), "attn.",
                                        {.features = 8,
                                         .heads = 2,
                                         .kv_heads = kv_heads,
                                         .head_dim = 6,
                                         .rope_theta = 100.0,
                                         .bias = true});
    CheckGradients(*attn, RandomTensor({2, 3, 8}, 34), 34);
    const auto p = attn->parameters();
    EXPECT_EQ(p[0]->value.shape(), (Shape{12, 8}));            // q_proj
    EXPECT_EQ(p[1]->value.shape(), (Shape{12}));               // q bias
    EXPECT_EQ(p[2]->value.shape(), (Shape{kv_heads * 6, 8}));  // k_proj
    EXPECT_EQ(p[6]->value.shape(), (Shape{8, 12}));            // o_proj
  }
  // Narrower: 2 heads of 2 on 8 features.
  auto narrow = *LlamaAttention::Create(
      B(), "a.", {.features = 8, .heads = 2, .kv_heads = 2, .head_dim = 2});
  CheckGradients(*narrow, RandomTensor({1, 4, 8}, 35), 35);
  EXPECT_EQ(
      LlamaAttention::Create(
          B(), "a.", {.features = 8, .heads = 2, .kv_heads = 2, .head_dim = 5})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);  // odd head_dim
}

TEST(GradientCheckTest, LlamaAttentionWithEveryRopeScaling) {
  // Sequence 5 past an original length of 4, so dynamic grows theta; yarn
  // scales cos and sin by its attention factor, which the backward's
  // transpose must carry.
  const RopeScaling scalings[] = {
      {.type = RopeType::kLinear, .factor = 3.0},
      {.type = RopeType::kDynamic,
       .factor = 2.0,
       .original_max_position_embeddings = 4},
      {.type = RopeType::kYarn,
       .factor = 8.0,
       .original_max_position_embeddings = 4},
      {.type = RopeType::kLlama3,
       .factor = 8.0,
       .original_max_position_embeddings = 4,
       .low_freq_factor = 1.0,
       .high_freq_factor = 4.0},
  };
  for (const RopeScaling& s : scalings) {
    SCOPED_TRACE(std::string(RopeTypeName(s.type)));
    auto attn = *LlamaAttention::Create(B(), "attn.",
                                        {.features = 8,
                                         .heads = 2,
                                         .kv_heads = 1,
                                         .head_dim = 6,
                                         .rope_theta = 100.0,
                                         .rope_scaling = s});
    CheckGradients(*attn, RandomTensor({2, 5, 8}, 36), 36);
  }
  // A scaling out of range is refused when the layer is made.
  EXPECT_EQ(LlamaAttention::Create(
                B(), "a.",
                {.features = 8,
                 .heads = 2,
                 .rope_scaling = {.type = RopeType::kLinear, .factor = 0.5}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradientCheckTest, ScaledRopeChangesTheOutputAsItsTableSays) {
  // With every pair's frequency divided by 4 (linear), position p turns as
  // position p / 4 does without scaling: a layer fed positions 0, 4, 8 of a
  // linear-4 rope equals one fed 0, 1, 2 unscaled, row for row.
  const Tensor x = RandomTensor({1, 2, 9, 8}, 37);
  const RopeTable linear =
      ComputeRopeTable({.type = RopeType::kLinear, .factor = 4.0}, 100.0, 8, 0);
  Tensor scaled = testing_util::ZerosLike(x),
         plain = testing_util::ZerosLike(x);
  B()->Rope(x, {.inv_freq = FromVector({4}, linear.inv_freq)}, false, scaled,
            Ids({1, 9}, {0, 4, 8, 12, 16, 20, 24, 28, 32}));
  B()->Rope(x, Freqs(100.0, 8), false, plain);
  EXPECT_TRUE(
      testing_util::AllClose(ToVector(scaled), ToVector(plain), 1e-5, 1e-5));
}

TEST(GradientCheckTest, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  // GQA with 4 query heads sharing 2 key/value heads is multi-head attention
  // whose k and v projections repeat each shared head for its group (HF's
  // repeat_kv): same output, same dx, and the shared heads' weight
  // gradients are the sums over their copies.
  const int64_t d = 16, head_dim = 4;
  auto gqa = *LlamaAttention::Create(
      B(), "a.", {.features = d, .heads = 4, .kv_heads = 2, .bias = true});
  auto mha = *LlamaAttention::Create(
      B(), "a.", {.features = d, .heads = 4, .kv_heads = 4, .bias = true});
  RandomizeParameters(*gqa, 25);
  RandomizeParameters(*mha, 26);
  auto gp = gqa->parameters(), mp = mha->parameters();
  // Order: q, q bias, k, k bias, v, v bias, o.
  for (int i : {0, 1, 6}) B()->Copy(gp[i]->value, mp[i]->value);
  for (int i : {2, 3, 4, 5}) {
    const int64_t row = i % 2 == 0 ? d : 1;  // floats per output row
    const float* src = gp[i]->value.data<float>();
    float* dst = mp[i]->value.data<float>();
    for (int64_t head = 0; head < 4; ++head) {
      const int64_t group = head / 2;
      for (int64_t j = 0; j < head_dim * row; ++j) {
        dst[head * head_dim * row + j] = src[group * head_dim * row + j];
      }
    }
  }
  Tensor x = RandomTensor({2, 5, d}, 27), w = RandomTensor({2, 5, d}, 28);
  Stash gs, ms;
  std::vector<float> gy = ToVector(*gqa->Forward(x, gs));
  std::vector<float> my = ToVector(*mha->Forward(x, ms));
  EXPECT_TRUE(testing_util::AllClose(gy, my, 1e-5, 1e-5));
  std::vector<float> gdx = ToVector(*gqa->BackwardInput(w, gs, true));
  std::vector<float> mdx = ToVector(*mha->BackwardInput(w, ms, true));
  EXPECT_TRUE(testing_util::AllClose(gdx, mdx, 1e-5, 1e-5));
  ASSERT_TRUE(gqa->BackwardWeight(w, gs).ok());
  ASSERT_TRUE(mha->BackwardWeight(w, ms).ok());
  for (int i : {0, 1, 6}) {
    EXPECT_TRUE(testing_util::AllClose(ToVector(gp[i]->grad),
                                       ToVector(mp[i]->grad), 1e-5, 1e-5))
        << gp[i]->name;
  }
  for (int i : {2, 3, 4, 5}) {
    const int64_t row = i % 2 == 0 ? d : 1;
    std::vector<float> summed(gp[i]->grad.numel(), 0.0f);
    const float* m = mp[i]->grad.data<float>();
    for (int64_t head = 0; head < 4; ++head) {
      for (int64_t j = 0; j < head_dim * row; ++j) {
        summed[(head / 2) * head_dim * row + j] += m[head * head_dim * row + j];
      }
    }
    EXPECT_TRUE(
        testing_util::AllClose(ToVector(gp[i]->grad), summed, 1e-5, 1e-5))
        << gp[i]->name;
  }
}

TEST(GradientCheckTest, LlamaAttentionIsCausal) {
  auto attn = *LlamaAttention::Create(
      B(), "a.", {.features = 8, .heads = 2, .kv_heads = 1});
  RandomizeParameters(*attn, 29);
  Tensor x = RandomTensor({1, 3, 8}, 29);
  Stash s1, s2;
  std::vector<float> before = ToVector(*attn->Forward(x, s1));
  x.data<float>()[2 * 8 + 1] += 1.0f;  // Change the last position only.
  std::vector<float> after = ToVector(*attn->Forward(x, s2));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(before[i], after[i]) << i;
  EXPECT_NE(before[17], after[17]);
}

TEST(GradientCheckTest, LlamaBlock) {
  auto block = *MakeLlamaBlock(B(), "layers.1.",
                               {.features = 8,
                                .heads = 2,
                                .kv_heads = 1,
                                .mlp_features = 12,
                                .rope_theta = 500.0f});
  CheckGradients(*block, RandomTensor({2, 3, 8}, 30), 30);
  std::vector<std::string> names;
  for (Parameter* p : block->parameters()) names.push_back(p->name);
  EXPECT_THAT(names,
              ::testing::ElementsAre("layers.1.input_layernorm.weight",
                                     "layers.1.self_attn.q_proj.weight",
                                     "layers.1.self_attn.k_proj.weight",
                                     "layers.1.self_attn.v_proj.weight",
                                     "layers.1.self_attn.o_proj.weight",
                                     "layers.1.post_attention_layernorm.weight",
                                     "layers.1.mlp.gate_proj.weight",
                                     "layers.1.mlp.up_proj.weight",
                                     "layers.1.mlp.down_proj.weight"));
}

TEST(GradientCheckTest, LlamaBlockWithItsOwnHeadDimAndLlama3Rope) {
  auto block =
      *MakeLlamaBlock(B(), "layers.1.",
                      {.features = 8,
                       .heads = 4,
                       .kv_heads = 2,
                       .head_dim = 4,
                       .mlp_features = 12,
                       .rope_theta = 500.0,
                       .rope_scaling = {.type = RopeType::kLlama3,
                                        .factor = 32.0,
                                        .original_max_position_embeddings = 2,
                                        .low_freq_factor = 1.0,
                                        .high_freq_factor = 4.0}});
  CheckGradients(*block, RandomTensor({2, 3, 8}, 38), 38);
  EXPECT_EQ(block->parameters()[1]->value.shape(), (Shape{16, 8}));  // q
  EXPECT_EQ(block->parameters()[4]->value.shape(), (Shape{8, 16}));  // o
}

TEST(GradientCheckTest, LlamaLayersKeepWhatWeightBackwardNeeds) {
  // A zero-bubble schedule releases what only BI needed before BW runs:
  // the weight gradients must not change.
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(*MakeLlamaBlock(B(), "b.",
                                   {.features = 8,
                                    .heads = 4,
                                    .kv_heads = 2,
                                    .mlp_features = 12,
                                    .attention_bias = true}));
  layers.push_back(*SwiGluMlp::Create(B(), "m.", 8, 4));
  layers.push_back(*RmsNormLayer::Create(B(), "n.", 8, 1e-6f));
  for (auto& layer : layers) {
    RandomizeParameters(*layer, 31);
    Tensor x = RandomTensor({2, 3, 8}, 32), w = RandomTensor({2, 3, 8}, 33);
    std::vector<std::vector<float>> full;
    {
      Stash s;
      ASSERT_TRUE(layer->Forward(x, s).ok());
      ASSERT_TRUE(layer->BackwardInput(w, s, true).ok());
      ASSERT_TRUE(layer->BackwardWeight(w, s).ok());
      for (Parameter* p : layer->parameters()) {
        full.push_back(ToVector(p->grad));
        B()->Fill(p->grad, 0.0f);
      }
    }
    Stash s;
    ASSERT_TRUE(layer->Forward(x, s).ok());
    ASSERT_TRUE(layer->BackwardInput(w, s, true).ok());
    layer->ReleaseForWeightBackward(s);
    ASSERT_TRUE(layer->BackwardWeight(w, s).ok());
    auto params = layer->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(ToVector(params[i]->grad), full[i]) << params[i]->name;
    }
  }
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
