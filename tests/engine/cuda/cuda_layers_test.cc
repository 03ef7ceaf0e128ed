// Every layer kind, both losses and the optimizers, run on CpuBackend and on
// CudaBackend with the same parameters and inputs: forward outputs, input
// gradients (BI) and parameter gradients (BW) must agree. BW runs after
// ReleaseForWeightBackward, as a zero-bubble schedule runs it, so freed and
// reused device memory is exercised too. Skipped without a CUDA device.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/layer.h"
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
#include "engine/loss.h"
#include "engine/optimizer.h"
#include "engine/rope.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda/cuda_test_util.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::AllClose;
using testing_util::Both;
using testing_util::CudaTest;
using testing_util::Ids;
using testing_util::Random;
using testing_util::RandomTensor;

// Builds the same layer on a given backend.
using LayerFactory =
    std::function<absl::StatusOr<std::unique_ptr<Layer>>(Backend*)>;

struct Tolerance {
  double rtol = 1e-4, atol = 1e-4;
};

class CudaLayersTest : public CudaTest {
 protected:
  Both RandomBoth(const Shape& shape, uint32_t seed, float scale = 1.0f) {
    Tensor c = RandomTensor(shape, seed, scale);
    return {c, ToCuda(c)};
  }

  void ExpectClose(const Tensor& cuda_tensor, const Tensor& cpu_tensor,
                   const std::string& what, Tolerance tol) {
    EXPECT_EQ(cuda_tensor.shape(), cpu_tensor.shape()) << what;
    EXPECT_TRUE(
        AllClose(Values(cuda_tensor), Values(cpu_tensor), tol.rtol, tol.atol))
        << what;
  }

  // Same random parameter values on both layers (not the real init: small
  // random values everywhere, e.g. layernorm weights != 1).
  void CopyParameters(Layer& cpu_layer, Layer& cuda_layer, uint32_t seed) {
    const std::vector<Parameter*> cp = cpu_layer.parameters();
    const std::vector<Parameter*> gp = cuda_layer.parameters();
    ASSERT_EQ(cp.size(), gp.size());
    for (size_t i = 0; i < cp.size(); ++i) {
      ASSERT_EQ(cp[i]->name, gp[i]->name);
      const std::vector<float> v = Random(cp[i]->value.numel(), seed + i, 0.5f);
      ASSERT_TRUE(
          cpu()->CopyFromHost(v.data(), v.size() * 4, cp[i]->value).ok());
      ASSERT_TRUE(
          cuda()->CopyFromHost(v.data(), v.size() * 4, gp[i]->value).ok());
    }
  }

  // Forward, BI, release, BW on both backends; compares y, dx (for float
  // inputs) and every parameter gradient. BW accumulates, so it runs twice
  // (two microbatches) to check += as well.
  void CheckLayer(const LayerFactory& make, const Both& x,
                  const std::string& what, Tolerance tol = {}) {
    SCOPED_TRACE(what);
    absl::StatusOr<std::unique_ptr<Layer>> cpu_layer = make(cpu());
    absl::StatusOr<std::unique_ptr<Layer>> cuda_layer = make(cuda());
    ASSERT_TRUE(cpu_layer.ok()) << cpu_layer.status();
    ASSERT_TRUE(cuda_layer.ok()) << cuda_layer.status();
    CopyParameters(**cpu_layer, **cuda_layer, 11);
    const bool float_input = x.cpu.dtype() == DType::kF32;
    for (int microbatch = 0; microbatch < 2; ++microbatch) {
      Stash cpu_stash, cuda_stash;
      absl::StatusOr<Tensor> y_cpu = (*cpu_layer)->Forward(x.cpu, cpu_stash);
      absl::StatusOr<Tensor> y_cuda =
          (*cuda_layer)->Forward(x.cuda, cuda_stash);
      ASSERT_TRUE(y_cpu.ok()) << y_cpu.status();
      ASSERT_TRUE(y_cuda.ok()) << y_cuda.status();
      ExpectClose(*y_cuda, *y_cpu, "forward", tol);

      const Both dy = RandomBoth(y_cpu->shape(), 21 + microbatch);
      absl::StatusOr<Tensor> dx_cpu =
          (*cpu_layer)->BackwardInput(dy.cpu, cpu_stash, float_input);
      absl::StatusOr<Tensor> dx_cuda =
          (*cuda_layer)->BackwardInput(dy.cuda, cuda_stash, float_input);
      ASSERT_TRUE(dx_cpu.ok()) << dx_cpu.status();
      ASSERT_TRUE(dx_cuda.ok()) << dx_cuda.status();
      ASSERT_EQ(dx_cuda->defined(), dx_cpu->defined());
      if (dx_cpu->defined()) ExpectClose(*dx_cuda, *dx_cpu, "input grad", tol);

      (*cpu_layer)->ReleaseForWeightBackward(cpu_stash);
      (*cuda_layer)->ReleaseForWeightBackward(cuda_stash);
      ASSERT_TRUE((*cpu_layer)->BackwardWeight(dy.cpu, cpu_stash).ok());
      ASSERT_TRUE((*cuda_layer)->BackwardWeight(dy.cuda, cuda_stash).ok());
      const std::vector<Parameter*> cp = (*cpu_layer)->parameters();
      const std::vector<Parameter*> gp = (*cuda_layer)->parameters();
      for (size_t i = 0; i < cp.size(); ++i) {
        ExpectClose(gp[i]->grad, cp[i]->grad,
                    absl::StrCat("grad of ", cp[i]->name, " after microbatch ",
                                 microbatch),
                    tol);
      }
    }
    ASSERT_TRUE(cuda()->Synchronize().ok());
  }
};

template <typename T>
absl::StatusOr<std::unique_ptr<Layer>> Upcast(
    absl::StatusOr<std::unique_ptr<T>> layer) {
  if (!layer.ok()) return layer.status();
  return std::unique_ptr<Layer>(std::move(*layer));
}

TEST_F(CudaLayersTest, Dense) {
  for (bool bias : {true, false}) {
    CheckLayer(
        [bias](Backend* b) {
          return Upcast(Dense::Create(b, "dense.", 24, 17, bias));
        },
        RandomBoth({2, 5, 24}, 1), absl::StrCat("dense bias=", bias));
  }
}

TEST_F(CudaLayersTest, Activations) {
  const std::vector<std::pair<Activation::Kind, const char*>> kinds = {
      {Activation::Kind::kRelu, "relu"},
      {Activation::Kind::kGelu, "gelu"},
      {Activation::Kind::kGeluTanh, "gelu_tanh"}};
  for (const auto& [kind, name] : kinds) {
    CheckLayer(
        [kind](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
          return std::make_unique<Activation>(b, kind);
        },
        RandomBoth({4, 33}, 2), name);
  }
}

TEST_F(CudaLayersTest, LayerNorm) {
  CheckLayer(
      [](Backend* b) {
        return Upcast(LayerNormLayer::Create(b, "norm.", 48, 1e-5f));
      },
      RandomBoth({3, 7, 48}, 3, 2.0f), "layer_norm");
}

TEST_F(CudaLayersTest, SelfAttention) {
  for (bool causal : {false, true}) {
    for (bool bias : {true, false}) {
      CheckLayer(
          [causal, bias](Backend* b) {
            return Upcast(
                SelfAttention::Create(b, "attn.", 32, 4, 32, causal, bias));
          },
          RandomBoth({2, 9, 32}, 4),
          absl::StrCat("attention causal=", causal, " bias=", bias),
          {.rtol = 1e-3, .atol = 1e-4});
    }
  }
}

TEST_F(CudaLayersTest, SelfAttentionWithWiderQkv) {
  // Q != d: in_proj [3Q, d], out_proj [d, Q].
  CheckLayer(
      [](Backend* b) {
        return Upcast(SelfAttention::Create(b, "attn.", 16, 2, 24, true, true));
      },
      RandomBoth({3, 5, 16}, 5), "attention Q=24 d=16",
      {.rtol = 1e-3, .atol = 1e-4});
}

TEST_F(CudaLayersTest, EmbeddingWithPositions) {
  std::vector<int64_t> ids(24);
  for (int i = 0; i < 24; ++i) ids[i] = (i * 7 + 3) % 50;
  ids[5] = ids[17] = 9;  // Repeats accumulate.
  const Tensor cpu_ids = Ids({3, 8}, ids);
  const Both x = {cpu_ids, ToCuda(cpu_ids)};
  for (int64_t positions : {0, 12}) {
    CheckLayer(
        [positions](Backend* b) {
          return Upcast(Embedding::Create(b, "embed.", 50, 16, positions));
        },
        x, absl::StrCat("embedding positions=", positions));
  }
}

TEST_F(CudaLayersTest, EmbeddingRejectsBadIdsLikeCpu) {
  const Tensor cpu_ids = Ids({1, 3}, {1, 50, 2});
  const Tensor cuda_ids = ToCuda(cpu_ids);
  auto cpu_layer = *Embedding::Create(cpu(), "embed.", 50, 16, 0);
  auto cuda_layer = *Embedding::Create(cuda(), "embed.", 50, 16, 0);
  Stash a, b;
  const absl::Status cpu_status = cpu_layer->Forward(cpu_ids, a).status();
  const absl::Status cuda_status = cuda_layer->Forward(cuda_ids, b).status();
  EXPECT_EQ(cuda_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_status.message(), cpu_status.message());
}

TEST_F(CudaLayersTest, TransformerBlocks) {
  for (bool pre_norm : {false, true}) {
    for (bool gelu_tanh : {false, true}) {
      const TransformerBlockOptions options = {.features = 32,
                                               .heads = 4,
                                               .mlp_features = 64,
                                               .causal = true,
                                               .pre_norm = pre_norm,
                                               .gelu_tanh = gelu_tanh};
      CheckLayer(
          [options](Backend* b) {
            return MakeTransformerBlock(b, "blocks.0.", options);
          },
          RandomBoth({2, 8, 32}, 6),
          absl::StrCat("transformer pre_norm=", pre_norm,
                       " gelu_tanh=", gelu_tanh),
          {.rtol = 1e-3, .atol = 2e-4});
    }
  }
}

TEST_F(CudaLayersTest, RmsNorm) {
  CheckLayer(
      [](Backend* b) {
        return Upcast(RmsNormLayer::Create(b, "norm.", 48, 1e-6f));
      },
      RandomBoth({3, 7, 48}, 7, 2.0f), "rms_norm");
}

TEST_F(CudaLayersTest, SwiGluMlp) {
  CheckLayer(
      [](Backend* b) { return Upcast(SwiGluMlp::Create(b, "mlp.", 32, 88)); },
      RandomBoth({2, 9, 32}, 8), "swiglu", {.rtol = 1e-3, .atol = 1e-4});
}

TEST_F(CudaLayersTest, LlamaAttentionWithGroupedHeadsAndRope) {
  // Sequence 40 turns the first pair by up to 39 radians: sincosf must be
  // the accurate one.
  for (const int64_t kv_heads : {4, 2, 1}) {
    for (const bool bias : {false, true}) {
      const LlamaAttentionOptions o = {.features = 32,
                                       .heads = 4,
                                       .kv_heads = kv_heads,
                                       .rope_theta = 10000.0,
                                       .bias = bias};
      CheckLayer(
          [o](Backend* b) {
            return Upcast(LlamaAttention::Create(b, "self_attn.", o));
          },
          RandomBoth({2, 40, 32}, 9),
          absl::StrCat("llama attention kv_heads=", kv_heads, " bias=", bias),
          {.rtol = 1e-3, .atol = 1e-4});
    }
  }
}

TEST_F(CudaLayersTest, LlamaAttentionWithItsOwnHeadDimAndScaledRope) {
  // Heads of 12 on 32 features; llama3 scaling past an original length of
  // 8 and yarn's attention factor, on a sequence of 40.
  const RopeScaling scalings[] = {
      {.type = RopeType::kLlama3,
       .factor = 32.0,
       .original_max_position_embeddings = 8,
       .low_freq_factor = 1.0,
       .high_freq_factor = 4.0},
      {.type = RopeType::kYarn,
       .factor = 4.0,
       .original_max_position_embeddings = 8},
      {.type = RopeType::kDynamic,
       .factor = 2.0,
       .original_max_position_embeddings = 8},
  };
  for (const RopeScaling& s : scalings) {
    const LlamaAttentionOptions o = {.features = 32,
                                     .heads = 4,
                                     .kv_heads = 2,
                                     .head_dim = 12,
                                     .rope_theta = 10000.0,
                                     .rope_scaling = s};
    CheckLayer(
        [o](Backend* b) {
          return Upcast(LlamaAttention::Create(b, "self_attn.", o));
        },
        RandomBoth({2, 40, 32}, 11),
        absl::StrCat("llama attention head_dim 12 ", RopeTypeName(s.type)),
        {.rtol = 1e-3, .atol = 1e-4});
  }
}

TEST_F(CudaLayersTest, LlamaBlock) {
  const LlamaBlockOptions o = {
      .features = 32, .heads = 4, .kv_heads = 2, .mlp_features = 64};
  CheckLayer([o](Backend* b) { return MakeLlamaBlock(b, "layers.0.", o); },
             RandomBoth({2, 8, 32}, 10), "llama block",
             {.rtol = 1e-3, .atol = 2e-4});
}

TEST_F(CudaLayersTest, CompositeResidualMlp) {
  CheckLayer(
      [](Backend* b) -> absl::StatusOr<std::unique_ptr<Layer>> {
        std::vector<std::unique_ptr<Layer>> layers;
        auto up = Dense::Create(b, "mlp.0.", 20, 40, true);
        auto down = Dense::Create(b, "mlp.2.", 40, 20, true);
        if (!up.ok()) return up.status();
        if (!down.ok()) return down.status();
        layers.push_back(std::move(*up));
        layers.push_back(
            std::make_unique<Activation>(b, Activation::Kind::kRelu));
        layers.push_back(std::move(*down));
        return std::unique_ptr<Layer>(std::make_unique<Residual>(
            b, std::make_unique<Chain>(std::move(layers))));
      },
      RandomBoth({6, 20}, 7), "residual(dense, relu, dense)");
}

TEST_F(CudaLayersTest, BothLossesMatchCpu) {
  const Both y = RandomBoth({4, 5, 7}, 8);
  const Both target = RandomBoth({4, 5, 7}, 9);
  absl::StatusOr<LossResult> mse_cpu =
      ComputeLoss(cpu(), LossKind::kMse, y.cpu, target.cpu, 0.5f);
  absl::StatusOr<LossResult> mse_cuda =
      ComputeLoss(cuda(), LossKind::kMse, y.cuda, target.cuda, 0.5f);
  ASSERT_TRUE(mse_cpu.ok() && mse_cuda.ok()) << mse_cuda.status();
  EXPECT_NEAR(mse_cuda->loss, mse_cpu->loss, 1e-6 * mse_cpu->loss);
  ExpectClose(mse_cuda->grad, mse_cpu->grad, "mse grad", {1e-6, 1e-9});

  std::vector<int64_t> classes(20);
  for (int i = 0; i < 20; ++i) classes[i] = (i * 3) % 7;
  const Tensor cpu_classes = Ids({4, 5}, classes);
  const Tensor cuda_classes = ToCuda(cpu_classes);
  absl::StatusOr<LossResult> ce_cpu =
      ComputeLoss(cpu(), LossKind::kCrossEntropy, y.cpu, cpu_classes, 0.5f);
  absl::StatusOr<LossResult> ce_cuda =
      ComputeLoss(cuda(), LossKind::kCrossEntropy, y.cuda, cuda_classes, 0.5f);
  ASSERT_TRUE(ce_cpu.ok() && ce_cuda.ok()) << ce_cuda.status();
  EXPECT_NEAR(ce_cuda->loss, ce_cpu->loss, 1e-5 * ce_cpu->loss);
  ExpectClose(ce_cuda->grad, ce_cpu->grad, "cross-entropy grad", {1e-4, 1e-7});
}

// Two steps of each torch.optim optimizer over a dense layer's parameters,
// on both backends; the second step covers sgd's momentum after the first
// and Adam's bias correction at step 2.
TEST_F(CudaLayersTest, OptimizerStepsMatchCpu) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerConfig::Kind::kSgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;

  OptimizerConfig adam;
  adam.kind = OptimizerConfig::Kind::kAdam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.05;

  // AdamW with clipping: the gradient norm comes from SumSquares and the
  // clipping from Scale.
  OptimizerConfig adamw;
  adamw.kind = OptimizerConfig::Kind::kAdamW;
  adamw.lr = 1e-2;
  adamw.clip_grad_norm = 0.5;

  for (const auto& [config, what] :
       std::vector<std::pair<OptimizerConfig, const char*>>{
           {sgd, "sgd nesterov"}, {adam, "adam"}, {adamw, "adamw clipped"}}) {
    SCOPED_TRACE(what);
    auto cpu_layer = *Dense::Create(cpu(), "dense.", 30, 20, true);
    auto cuda_layer = *Dense::Create(cuda(), "dense.", 30, 20, true);
    CopyParameters(*cpu_layer, *cuda_layer, 31);
    absl::StatusOr<std::unique_ptr<Optimizer>> cpu_opt =
        Optimizer::Create(cpu(), config, cpu_layer->parameters());
    absl::StatusOr<std::unique_ptr<Optimizer>> cuda_opt =
        Optimizer::Create(cuda(), config, cuda_layer->parameters());
    ASSERT_TRUE(cpu_opt.ok() && cuda_opt.ok()) << cuda_opt.status();
    for (int step = 0; step < 2; ++step) {
      const std::vector<Parameter*> cp = cpu_layer->parameters();
      const std::vector<Parameter*> gp = cuda_layer->parameters();
      for (size_t i = 0; i < cp.size(); ++i) {
        const std::vector<float> g =
            Random(cp[i]->grad.numel(), 41 + step * 10 + i);
        ASSERT_TRUE(
            cpu()->CopyFromHost(g.data(), g.size() * 4, cp[i]->grad).ok());
        ASSERT_TRUE(
            cuda()->CopyFromHost(g.data(), g.size() * 4, gp[i]->grad).ok());
      }
      absl::StatusOr<double> cpu_norm = (*cpu_opt)->Step();
      absl::StatusOr<double> cuda_norm = (*cuda_opt)->Step();
      ASSERT_TRUE(cpu_norm.ok() && cuda_norm.ok()) << cuda_norm.status();
      EXPECT_NEAR(*cuda_norm, *cpu_norm, 1e-9 * (1 + *cpu_norm));
      for (size_t i = 0; i < cp.size(); ++i) {
        ExpectClose(gp[i]->value, cp[i]->value,
                    absl::StrCat(cp[i]->name, " after step ", step),
                    {1e-5, 1e-6});
      }
    }
  }
}

}  // namespace
}  // namespace conveyor::engine
