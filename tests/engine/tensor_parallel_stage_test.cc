// A stage split over tensor-parallel ranks (and replicated over the rest of
// its mesh) must compute what one Stage computes on the whole microbatch:
// outputs, input gradients, the whole weight gradients gathered from the
// shards, and the updated parameters sliced back to every rank.
//
// Tolerance: the ranks split each row-parallel projection's inner sum
// (o_proj over heads x head_dim, down_proj over mlp_features) into T partial
// sums added afterwards, and the replicas split the gradients' sums over
// rows; both only reorder f32 additions. A reordered sum of n terms moves by
// at most about n u sum|terms| (u = 2^-24); with n <= 24 here and terms of
// the output's own size, that is ~1e-6 of the largest magnitude per
// projection, compounded over two blocks and their backward. 1e-4 of the
// largest magnitude leaves an order of magnitude to spare, while a wrong
// slice, a missing or doubled reduction, or a rank on another rank's heads
// is off by O(1).
#include "engine/tensor_parallel_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cancellation.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "engine/precision.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::Ids;
using testing_util::RandomTensor;
using testing_util::ToVector;

// Grouped-query attention (4 query heads sharing 2 key/value heads) splits
// over 2 ranks; T = 4 needs as many key/value heads.
constexpr char kGqa[] =
    "model:\n  input_shape: [4]\n  init: {seed: 5}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 16}\n"
    "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24}\n"
    "    - boundary\n"
    "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, "
    "attention_bias: true}\n"
    "    - rmsnorm\n"
    "    - lm_head: {vocab_size: 11}\n";
constexpr char kWide[] =
    "model:\n  input_shape: [4]\n  init: {seed: 7}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 16}\n"
    "    - llama_block: {heads: 4, kv_heads: 4, mlp_features: 24}\n"
    "    - boundary\n"
    "    - llama_block: {heads: 4, kv_heads: 4, mlp_features: 24}\n"
    "    - rmsnorm\n"
    "    - lm_head: {vocab_size: 11}\n";
// One stage: the head shares the embedding's weight.
constexpr char kTied[] =
    "model:\n  input_shape: [4]\n  init: {seed: 9}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 16}\n"
    "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24}\n"
    "    - rmsnorm\n"
    "    - lm_head: {vocab_size: 11, tied: true}\n";

// The JaxPP transformer block, post-norm and pre-norm (in_proj stacks q, k
// and v; out_proj and mlp.2 have biases, added once after the all-reduce).
constexpr char kPostNorm[] =
    "model:\n  input_shape: [4]\n  init: {seed: 11}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 16, max_positions: 4}\n"
    "    - transformer_block: {heads: 4, mlp_features: 24, causal: true}\n"
    "    - boundary\n"
    "    - transformer_block: {heads: 4, mlp_features: 24}\n"
    "    - layernorm\n"
    "    - lm_head: {vocab_size: 11}\n";
constexpr char kPreNorm[] =
    "model:\n  input_shape: [4]\n  init: {seed: 12}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 16, max_positions: 4}\n"
    "    - transformer_block: {heads: 4, mlp_features: 24, causal: true, "
    "norm: pre}\n"
    "    - boundary\n"
    "    - transformer_block: {heads: 4, mlp_features: 24, causal: true, "
    "norm: pre}\n"
    "    - layernorm\n"
    "    - lm_head: {vocab_size: 11}\n";

constexpr int kVocab = 11, kSeq = 4, kFeatures = 16;
constexpr int64_t kRows = 4;  // Splits over 1, 2 and 4 replicas.
constexpr double kTolerance = 1e-4;

ModelSpec Parse(const char* yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "tp.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

::testing::AssertionResult Close(const Tensor& got, const Tensor& want) {
  return testing_util::CloseToScale(got, want, kTolerance);
}

struct Case {
  const char* name;
  const char* yaml;
  int stage;
  int devices;
  int tensor_parallel;
};

std::string Describe(const Case& c) {
  return absl::StrCat(c.name, "_stage", c.stage, "_", c.devices, "dev_tp",
                      c.tensor_parallel);
}

void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

Tensor Input(const Case& c, int mb) {
  if (c.stage == 0) {
    std::vector<int64_t> ids(kRows * kSeq);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7 + mb * 3 + i / 5) % kVocab);
    }
    return Ids({kRows, kSeq}, ids);
  }
  return RandomTensor({kRows, kSeq, kFeatures}, 10 + mb);
}

Shape OutputShape(const Case& c, const ModelSpec& spec) {
  const bool last = c.stage == spec.num_stages - 1;
  return {kRows, kSeq, last ? kVocab : kFeatures};
}

class TensorParallelStageTest : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelStageTest, EqualsOneStageOnTheWholeMicrobatch) {
  const Case& c = GetParam();
  const ModelSpec spec = Parse(c.yaml);
  Backend* backend = CpuBackend::Get();
  auto single = *Stage::Create(backend, spec, c.stage);
  ASSERT_TRUE(single->InitializeFromSeed(*spec.seed).ok());
  auto collective =
      *CreateHostMeshCollective(std::vector<Backend*>(c.devices, backend));
  absl::StatusOr<std::unique_ptr<TensorParallelStage>> created =
      TensorParallelStage::Create(collective.get(), spec, c.stage,
                                  c.tensor_parallel);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<TensorParallelStage> tp = *std::move(created);
  ASSERT_TRUE(tp->InitializeFromSeed(*spec.seed).ok());

  // The master is the whole stage; each rank holds 1/T of the split
  // parameters (q_proj by rows, o_proj by columns) and all of the rest.
  const std::vector<Parameter*> want = single->parameters();
  const std::vector<Parameter*> params = tp->parameters();
  ASSERT_EQ(params.size(), want.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(ToVector(params[i]->value), ToVector(want[i]->value))
        << want[i]->name;
  }
  for (int d = 0; d < c.devices; ++d) {
    const int r = d % c.tensor_parallel;
    for (Parameter* p : tp->rank(d)->parameters()) {
      const Parameter* whole = nullptr;
      for (Parameter* w : want) {
        if (w->name == p->name) whole = w;
      }
      ASSERT_NE(whole, nullptr) << p->name;
      const std::vector<float> got = ToVector(p->value),
                               all = ToVector(whole->value);
      if (p->name.ends_with("q_proj.weight")) {
        // Rows [r, r + 1) / T of the whole: this rank's query heads.
        const size_t n = got.size();
        EXPECT_EQ(got, std::vector<float>(all.begin() + r * n,
                                          all.begin() + (r + 1) * n))
            << p->name << " on device " << d;
      } else if (p->name.ends_with("o_proj.weight")) {
        const int64_t cols = p->value.dim(1), whole_cols = whole->value.dim(1);
        ASSERT_EQ(cols * c.tensor_parallel, whole_cols) << p->name;
        for (int64_t row = 0; row < p->value.dim(0); ++row) {
          for (int64_t col = 0; col < cols; ++col) {
            ASSERT_EQ(got[row * cols + col],
                      all[row * whole_cols + r * cols + col])
                << p->name << " on device " << d;
          }
        }
      } else if (p->name.ends_with("in_proj_weight")) {
        // The rank's rows of each of q, k and v.
        const size_t block = all.size() / 3, n = got.size() / 3;
        for (size_t b = 0; b < 3; ++b) {
          EXPECT_EQ(std::vector<float>(got.begin() + b * n,
                                       got.begin() + (b + 1) * n),
                    std::vector<float>(all.begin() + b * block + r * n,
                                       all.begin() + b * block + (r + 1) * n))
              << p->name << " block " << b << " on device " << d;
        }
      } else if (p->name.ends_with("layernorm.weight") ||
                 p->name.ends_with("out_proj.bias")) {
        EXPECT_EQ(got, all) << p->name << " is whole on every rank";
      }
    }
  }

  constexpr int kMicrobatches = 2;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    const Tensor x = Input(c, mb);
    absl::StatusOr<Tensor> y_tp = tp->Forward(mb, x);
    ASSERT_TRUE(y_tp.ok()) << y_tp.status();
    absl::StatusOr<Tensor> y_single = single->Forward(mb, x);
    ASSERT_TRUE(y_single.ok()) << y_single.status();
    EXPECT_EQ(y_tp->backend(), collective->backend(0));
    EXPECT_TRUE(Close(*y_tp, *y_single)) << "output of microbatch " << mb;
  }
  EXPECT_EQ(tp->in_flight(), kMicrobatches);
  for (int mb = kMicrobatches - 1; mb >= 0; --mb) {
    const Tensor dy = RandomTensor(OutputShape(c, spec), 20 + mb, 0.1f);
    absl::StatusOr<Tensor> dx_tp = tp->BackwardInput(mb, dy);
    ASSERT_TRUE(dx_tp.ok()) << dx_tp.status();
    absl::StatusOr<Tensor> dx_single = single->BackwardInput(mb, dy);
    ASSERT_TRUE(dx_single.ok()) << dx_single.status();
    ASSERT_EQ(dx_tp->defined(), dx_single->defined());
    if (dx_tp->defined()) {
      EXPECT_TRUE(Close(*dx_tp, *dx_single))
          << "input gradient of microbatch " << mb;
    }
  }
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    ASSERT_TRUE(tp->BackwardWeight(mb).ok());
    ASSERT_TRUE(single->BackwardWeight(mb).ok());
  }
  EXPECT_EQ(tp->in_flight(), 0);
  EXPECT_EQ(tp->live_activation_bytes(), 0u);

  ASSERT_TRUE(tp->BeforeOptimizerStep().ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(Close(params[i]->grad, want[i]->grad))
        << "gradient of " << params[i]->name;
  }
  for (int d = 0; d < c.devices; ++d) {
    for (Parameter* p : tp->rank(d)->parameters()) {
      const std::vector<float> g = ToVector(p->grad);
      ASSERT_EQ(g, std::vector<float>(g.size(), 0.0f))
          << "device " << d << " keeps its gradient of " << p->name;
    }
  }

  // The reference steps on the gathered gradients (as mesh_stage_test does:
  // Adam would turn the summation-order noise of a near-zero gradient into
  // a step of about lr), so the updates must agree bitwise, and the ranks
  // must then compute on the updated slices.
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> g = ToVector(params[i]->grad);
    ASSERT_TRUE(
        backend->CopyFromHost(g.data(), g.size() * sizeof(float), want[i]->grad)
            .ok());
  }
  OptimizerConfig config;
  config.kind = OptimizerConfig::Kind::kAdam;
  config.lr = 0.05;
  auto opt_tp = *Optimizer::Create(backend, config, params);
  auto opt_single = *Optimizer::Create(backend, config, want);
  ASSERT_TRUE(opt_tp->Step().ok());
  ASSERT_TRUE(opt_single->Step().ok());
  ASSERT_TRUE(tp->AfterOptimizerStep().ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(ToVector(params[i]->value), ToVector(want[i]->value))
        << "updated " << params[i]->name;
  }
  const Tensor x = Input(c, 0);
  absl::StatusOr<Tensor> y_tp = tp->Forward(0, x);
  absl::StatusOr<Tensor> y_single = single->Forward(0, x);
  ASSERT_TRUE(y_tp.ok() && y_single.ok());
  EXPECT_TRUE(Close(*y_tp, *y_single)) << "output after the update";
  tp->DropInFlight();
  EXPECT_EQ(tp->in_flight(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, TensorParallelStageTest,
    ::testing::Values(Case{"gqa", kGqa, 0, 2, 2}, Case{"gqa", kGqa, 1, 2, 2},
                      Case{"gqa", kGqa, 1, 4, 2}, Case{"gqa", kGqa, 0, 4, 2},
                      Case{"gqa", kGqa, 1, 2, 1}, Case{"wide", kWide, 0, 4, 4},
                      Case{"wide", kWide, 1, 4, 4},
                      Case{"tied", kTied, 0, 2, 2},
                      Case{"postnorm", kPostNorm, 0, 2, 2},
                      Case{"postnorm", kPostNorm, 1, 4, 4},
                      Case{"prenorm", kPreNorm, 0, 4, 2},
                      Case{"prenorm", kPreNorm, 1, 2, 2}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return Describe(info.param);
    });

TEST(TensorParallelStageTest, RefusesASplitThatDoesNotDivide) {
  const ModelSpec spec = Parse(kGqa);
  Backend* cpu = CpuBackend::Get();
  auto four = *CreateHostMeshCollective({cpu, cpu, cpu, cpu});
  // kv_heads 2 does not split over 4 ranks; the error points at the layer.
  absl::Status status =
      TensorParallelStage::Create(four.get(), spec, 0, 4).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tp.yaml:"));
  EXPECT_THAT(status.message(), HasSubstr("kv_heads (2)"));
  EXPECT_THAT(CheckTensorParallel(spec, 3).message(), HasSubstr("heads (4)"));
  EXPECT_TRUE(CheckTensorParallel(spec, 2).ok());
  // T must divide the mesh.
  auto three = *CreateHostMeshCollective({cpu, cpu, cpu});
  EXPECT_THAT(
      TensorParallelStage::Create(three.get(), spec, 0, 2).status().message(),
      HasSubstr("must divide the mesh"));
  EXPECT_TRUE(StageSplits(spec, 0));
}

// Under bf16 GEMMs each rank's shards keep bf16 copies, brought up to date
// whenever the master's values are sliced back to the ranks (after an
// update, an initialization or a load).
TEST(TensorParallelStageTest, Bf16CopiesFollowTheSlicesOnEveryRank) {
  const ModelSpec spec = Parse(kGqa);
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  auto mesh = *CreateHostMeshCollective({bf16, bf16});
  auto tp = *TensorParallelStage::Create(mesh.get(), spec, 1, 2);
  ASSERT_TRUE(tp->InitializeFromSeed(5).ok());
  for (Parameter* p : tp->parameters()) bf16->Scale(p->value, 1.37f);
  ASSERT_TRUE(tp->AfterOptimizerStep().ok());
  int copies = 0;
  for (int d = 0; d < 2; ++d) {
    for (Parameter* p : tp->rank(d)->parameters()) {
      if (!p->value_bf16.defined()) continue;
      ++copies;
      std::vector<float> value(p->value.numel()), copy(p->value.numel());
      Tensor widened = *bf16->Empty(p->value.shape(), DType::kF32);
      bf16->CastFromBf16(p->value_bf16, widened);
      ASSERT_TRUE(
          bf16->CopyToHost(p->value, value.data(), value.size() * 4).ok());
      ASSERT_TRUE(bf16->CopyToHost(widened, copy.data(), copy.size() * 4).ok());
      for (size_t j = 0; j < value.size(); ++j) {
        ASSERT_EQ(copy[j], RoundToBf16(value[j]))
            << "rank " << d << " " << p->name << "[" << j << "]";
      }
    }
  }
  EXPECT_GT(copies, 0);
}

TEST(TensorParallelStageTest, AFailedActionLeavesNoRankWaiting) {
  const ModelSpec spec = Parse(kGqa);
  Backend* cpu = CpuBackend::Get();
  auto mesh = *CreateHostMeshCollective({cpu, cpu});
  auto tp = *TensorParallelStage::Create(mesh.get(), spec, 1, 2);
  ASSERT_TRUE(tp->InitializeFromSeed(5).ok());
  // Microbatch 0 twice: every rank refuses the second forward, and the
  // stage stays usable.
  const Tensor x = RandomTensor({kRows, kSeq, kFeatures}, 3);
  ASSERT_TRUE(tp->Forward(0, x).ok());
  EXPECT_FALSE(tp->Forward(0, x).ok());
  tp->DropInFlight();
  EXPECT_TRUE(tp->Forward(0, x).ok());
  // Rows that do not split over the replicas are refused before any rank
  // runs.
  auto four = *CreateHostMeshCollective({cpu, cpu, cpu, cpu});
  auto two_replicas = *TensorParallelStage::Create(four.get(), spec, 1, 2);
  EXPECT_THAT(two_replicas->Forward(0, RandomTensor({3, kSeq, kFeatures}, 1))
                  .status()
                  .message(),
              HasSubstr("do not split evenly"));
}

// A job cancelled while its ranks run stops every rank: each rank's thread
// carries the job's cancellation, so a minute-long delay on every rank ends
// at once, and no rank is left behind in a collective.
TEST(TensorParallelStageTest, CancellingTheJobStopsEveryRank) {
  const ModelSpec spec = Parse(
      "model:\n  input_shape: [4, 16]\n  init: {seed: 1}\n  loss: mse\n"
      "  layers:\n"
      "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24}\n"
      "    - delay: {forward_ms: 60000, backward_ms: 0}\n"
      "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24}\n");
  Backend* cpu = CpuBackend::Get();
  auto mesh = *CreateHostMeshCollective({cpu, cpu});
  auto tp = *TensorParallelStage::Create(mesh.get(), spec, 0, 2);
  ASSERT_TRUE(tp->InitializeFromSeed(1).ok());
  Cancellation cancellation;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancellation.Cancel(absl::CancelledError("job cancelled"));
  });
  absl::Status status;
  const auto start = std::chrono::steady_clock::now();
  {
    const CancellationScope scope(&cancellation);
    status = tp->Forward(0, RandomTensor({2, 4, 16}, 1)).status();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  canceller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  // Not a timing: a rank that missed the cancellation sleeps the whole
  // minute, so half of it separates the two outcomes on any machine.
  EXPECT_LT(waited, std::chrono::seconds(30));
  tp->DropInFlight();
}

}  // namespace
}  // namespace conveyor::engine
