// A stage run data parallel over a CPU mesh must compute what one Stage
// computes on the whole microbatch: outputs, input gradients, summed weight
// gradients, the updated parameters on every replica, and the activation
// bytes.
#include "engine/mesh_stage.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Two stages each: the second stage of the MLP has an input gradient to
// gather; the transformer's first stage takes token ids (no input gradient)
// and its second has attention, layer norm and an LM head.
constexpr char kMlp[] =
    "model:\n  input_shape: [3]\n  init: {seed: 5}\n  loss: mse\n"
    "  layers:\n"
    "    - dense: {features: 6}\n"
    "    - boundary\n"
    "    - dense: {features: 5}\n"
    "    - gelu\n"
    "    - layernorm\n"
    "    - dense: {features: 7}\n";
constexpr char kTransformer[] =
    "model:\n  input_shape: [4]\n  init: {seed: 5}\n  loss: cross_entropy\n"
    "  layers:\n"
    "    - embedding: {vocab_size: 11, features: 8, max_positions: 4}\n"
    "    - transformer_block: {heads: 2, mlp_features: 16, causal: true, "
    "norm: pre}\n"
    "    - boundary\n"
    "    - transformer_block: {heads: 2, mlp_features: 16, causal: true}\n"
    "    - layernorm\n"
    "    - lm_head: {vocab_size: 11}\n";

constexpr int kVocab = 11, kSeq = 4, kFeatures = 8;
constexpr int64_t kRows = 6;  // Splits over 1, 2 and 3 devices.

ModelSpec Parse(const char* yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "mesh.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<float> Read(const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_TRUE(t.backend()->CopyToHost(t, v.data(), v.size() * 4).ok());
  return v;
}

// Close within 1e-5 relative, with an absolute floor of 1e-5 of the largest
// magnitude (testing_util::CloseToScale).
::testing::AssertionResult Close(const Tensor& got, const Tensor& want,
                                 double rtol = 1e-5) {
  return testing_util::CloseToScale(got, want, rtol);
}

struct Case {
  const char* name;
  const char* yaml;
  int stage;
  int devices;
  Precision precision;
  OptimizerConfig::Kind optimizer;
};

std::string Describe(const Case& c) {
  return absl::StrCat(
      c.name, "_stage", c.stage, "_", c.devices, "dev_",
      PrecisionName(c.precision), "_",
      c.optimizer == OptimizerConfig::Kind::kSgd ? "sgd" : "adam");
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return Describe(info.param);
}

// gtest prints a failing case with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

// The stage's input for microbatch `mb`: token ids for the embedding stage,
// activations otherwise, on the host (fp32) CPU backend, as a channel or
// data source hands them over.
Tensor Input(const Case& c, int mb) {
  if (std::string(c.name) == "transformer" && c.stage == 0) {
    std::vector<int64_t> ids(kRows * kSeq);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int64_t>((i * 7 + mb * 3 + i / 5) % kVocab);
    }
    return Ids({kRows, kSeq}, ids);
  }
  if (std::string(c.name) == "transformer") {
    return RandomTensor({kRows, kSeq, kFeatures}, 10 + mb);
  }
  return RandomTensor({kRows, c.stage == 0 ? 3 : 6}, 10 + mb);
}

Shape OutputShape(const Case& c) {
  if (std::string(c.name) == "transformer") {
    return {kRows, kSeq, c.stage == 0 ? kFeatures : kVocab};
  }
  return {kRows, c.stage == 0 ? 6 : 7};
}

class MeshStageTest : public ::testing::TestWithParam<Case> {};

TEST_P(MeshStageTest, EqualsOneStageOnTheWholeMicrobatch) {
  const Case& c = GetParam();
  const ModelSpec spec = Parse(c.yaml);
  Backend* backend = CpuBackend::Get(c.precision);

  auto single = *Stage::Create(backend, spec, c.stage);
  ASSERT_TRUE(single->InitializeFromSeed(*spec.seed).ok());
  auto collective =
      *CreateHostMeshCollective(std::vector<Backend*>(c.devices, backend));
  absl::StatusOr<std::unique_ptr<MeshStage>> created =
      MeshStage::Create(collective.get(), spec, c.stage);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<MeshStage> mesh = *std::move(created);
  ASSERT_EQ(mesh->size(), c.devices);
  EXPECT_EQ(mesh->index(), c.stage);
  ASSERT_TRUE(mesh->InitializeFromSeed(*spec.seed).ok());

  // Every replica starts from the seed's values.
  const std::vector<Parameter*> want = single->parameters();
  for (int d = 0; d < c.devices; ++d) {
    const std::vector<Parameter*> got = mesh->replica(d)->parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(Read(got[i]->value), Read(want[i]->value))
          << "device " << d << " " << got[i]->name;
    }
  }

  // Two microbatches in flight at once, as a pipeline schedule has them.
  constexpr int kMicrobatches = 2;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    const Tensor x = Input(c, mb);
    absl::StatusOr<Tensor> y_mesh = mesh->Forward(mb, x);
    ASSERT_TRUE(y_mesh.ok()) << y_mesh.status();
    absl::StatusOr<Tensor> y_single = single->Forward(mb, x);
    ASSERT_TRUE(y_single.ok()) << y_single.status();
    EXPECT_EQ(y_mesh->backend(), collective->backend(0));
    EXPECT_TRUE(Close(*y_mesh, *y_single)) << "output of microbatch " << mb;
  }
  EXPECT_EQ(mesh->in_flight(), kMicrobatches);
  // Activations scale with rows, so the shards together hold what the whole
  // microbatch does.
  EXPECT_EQ(mesh->live_activation_bytes(), single->live_activation_bytes());

  // Backwards in the opposite order, as 1F1B's cooldown runs them.
  for (int mb = kMicrobatches - 1; mb >= 0; --mb) {
    const Tensor dy = RandomTensor(OutputShape(c), 20 + mb, 0.1f);
    absl::StatusOr<Tensor> dx_mesh = mesh->BackwardInput(mb, dy);
    ASSERT_TRUE(dx_mesh.ok()) << dx_mesh.status();
    absl::StatusOr<Tensor> dx_single = single->BackwardInput(mb, dy);
    ASSERT_TRUE(dx_single.ok()) << dx_single.status();
    ASSERT_EQ(dx_mesh->defined(), dx_single->defined());
    ASSERT_EQ(dx_mesh->defined(), c.stage > 0);
    if (dx_mesh->defined()) {
      EXPECT_TRUE(Close(*dx_mesh, *dx_single))
          << "input gradient of microbatch " << mb;
    }
  }
  EXPECT_EQ(mesh->live_activation_bytes(), single->live_activation_bytes());
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    ASSERT_TRUE(mesh->BackwardWeight(mb).ok());
    ASSERT_TRUE(single->BackwardWeight(mb).ok());
  }
  EXPECT_EQ(mesh->in_flight(), 0);
  EXPECT_EQ(mesh->live_activation_bytes(), 0u);
  EXPECT_EQ(mesh->peak_activation_bytes(), single->peak_activation_bytes());

  ASSERT_TRUE(mesh->BeforeOptimizerStep().ok());
  const std::vector<Parameter*> params = mesh->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(Close(params[i]->grad, want[i]->grad))
        << "gradient of " << params[i]->name;
    for (int d = 1; d < c.devices; ++d) {
      const std::vector<float> g =
          Read(mesh->replica(d)->parameters()[i]->grad);
      EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f))
          << "device " << d << " keeps its gradient of " << params[i]->name;
    }
  }

  // The key part of an attention's in_proj_bias (elements [d, 2d)) has a
  // true gradient of zero: the key bias adds q.b_k to every score of a row,
  // and softmax ignores a constant added to a row. Backward computes
  // rounding noise there, whose sign depends on the summation order. In
  // fp32 that noise is a few ulps of the terms it cancels, which are of the
  // gradient's own size: 1e-4 of the other biases' largest gradient leaves
  // two orders of magnitude (bf16 rounds the GEMM inputs, 2^-8 relative,
  // so there the noise is not asserted).
  for (size_t i = 0; c.precision == Precision::kFp32 && i < params.size();
       ++i) {
    if (!params[i]->name.ends_with("attn.in_proj_bias")) continue;
    const std::vector<float> g = Read(params[i]->grad);
    const size_t d = g.size() / 3;
    float others = 0, key = 0;
    for (size_t e = 0; e < g.size(); ++e) {
      float& m = e >= d && e < 2 * d ? key : others;
      m = std::max(m, std::abs(g[e]));
    }
    EXPECT_GT(others, 0.0f) << params[i]->name;
    EXPECT_LE(key, 1e-4f * others)
        << "the key bias of " << params[i]->name << " has a gradient";
  }

  // So the update is not compared across summation orders: Adam divides
  // each gradient by the root of its own square, turning that noise into a
  // step of about lr in a random direction, and which direction depends on
  // the machine's GEMM kernel (this test failed under OpenBLAS's Haswell
  // kernels for exactly that element). The gradients were compared above;
  // the reference now steps on the mesh's summed gradients, so the two
  // optimizers see the same inputs and must agree bitwise.
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> g = Read(params[i]->grad);
    ASSERT_TRUE(
        backend->CopyFromHost(g.data(), g.size() * sizeof(float), want[i]->grad)
            .ok());
  }
  OptimizerConfig config;
  config.kind = c.optimizer;
  config.lr = c.optimizer == OptimizerConfig::Kind::kSgd ? 0.5 : 0.05;
  config.momentum = c.optimizer == OptimizerConfig::Kind::kSgd ? 0.9 : 0.0;
  auto opt_mesh = *Optimizer::Create(backend, config, params);
  auto opt_single = *Optimizer::Create(backend, config, want);
  ASSERT_TRUE(opt_mesh->Step().ok());
  ASSERT_TRUE(opt_single->Step().ok());
  ASSERT_TRUE(mesh->AfterOptimizerStep().ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(Read(params[i]->value), Read(want[i]->value))
        << "updated " << params[i]->name;
    for (int d = 1; d < c.devices; ++d) {
      EXPECT_EQ(Read(mesh->replica(d)->parameters()[i]->value),
                Read(params[i]->value))
          << "device " << d << " " << params[i]->name;
    }
  }

  // The next forward runs on the updated parameters on every replica.
  const Tensor x = Input(c, 0);
  absl::StatusOr<Tensor> y_mesh = mesh->Forward(0, x);
  absl::StatusOr<Tensor> y_single = single->Forward(0, x);
  ASSERT_TRUE(y_mesh.ok() && y_single.ok());
  EXPECT_TRUE(Close(*y_mesh, *y_single, 1e-4)) << "output after the update";
  mesh->DropInFlight();
  EXPECT_EQ(mesh->in_flight(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, MeshStageTest,
    ::testing::Values(
        Case{"mlp", kMlp, 1, 1, Precision::kFp32, OptimizerConfig::Kind::kSgd},
        Case{"mlp", kMlp, 1, 2, Precision::kFp32, OptimizerConfig::Kind::kSgd},
        Case{"mlp", kMlp, 1, 3, Precision::kFp32, OptimizerConfig::Kind::kAdam},
        Case{"mlp", kMlp, 0, 3, Precision::kFp32, OptimizerConfig::Kind::kSgd},
        Case{"mlp", kMlp, 1, 2, Precision::kBf16, OptimizerConfig::Kind::kAdam},
        Case{"transformer", kTransformer, 0, 2, Precision::kFp32,
             OptimizerConfig::Kind::kAdam},
        Case{"transformer", kTransformer, 1, 2, Precision::kFp32,
             OptimizerConfig::Kind::kSgd},
        Case{"transformer", kTransformer, 1, 3, Precision::kFp32,
             OptimizerConfig::Kind::kAdam},
        Case{"transformer", kTransformer, 0, 3, Precision::kBf16,
             OptimizerConfig::Kind::kSgd},
        Case{"transformer", kTransformer, 1, 3, Precision::kBf16,
             OptimizerConfig::Kind::kAdam}),
    CaseName);

TEST(MeshStageTest, RejectsAMicrobatchThatDoesNotSplit) {
  const ModelSpec spec = Parse(kMlp);
  auto collective = *CreateHostMeshCollective(
      {CpuBackend::Get(), CpuBackend::Get(), CpuBackend::Get()});
  auto mesh = *MeshStage::Create(collective.get(), spec, 1);
  ASSERT_TRUE(mesh->InitializeFromSeed(1).ok());
  absl::StatusOr<Tensor> y = mesh->Forward(0, RandomTensor({4, 6}, 1));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(), HasSubstr("4 rows"));
  EXPECT_THAT(y.status().message(), HasSubstr("over 3 replicas"));
  EXPECT_EQ(mesh->in_flight(), 0);  // Refused before any replica ran.

  // The output gradient is checked the same way.
  ASSERT_TRUE(mesh->Forward(0, RandomTensor({3, 6}, 1)).ok());
  absl::StatusOr<Tensor> dx = mesh->BackwardInput(0, RandomTensor({2, 7}, 2));
  EXPECT_EQ(dx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dx.status().message(), HasSubstr("2 rows"));
}

TEST(MeshStageTest, DropInFlightClearsEveryReplicaAndItsGradients) {
  const ModelSpec spec = Parse(kMlp);
  auto collective =
      *CreateHostMeshCollective({CpuBackend::Get(), CpuBackend::Get()});
  auto mesh = *MeshStage::Create(collective.get(), spec, 1);
  ASSERT_TRUE(mesh->InitializeFromSeed(1).ok());
  ASSERT_TRUE(mesh->Forward(0, RandomTensor({4, 6}, 1)).ok());
  ASSERT_TRUE(mesh->Forward(1, RandomTensor({4, 6}, 2)).ok());
  ASSERT_TRUE(mesh->BackwardInput(0, RandomTensor({4, 7}, 3)).ok());
  ASSERT_TRUE(mesh->BackwardWeight(0).ok());
  mesh->DropInFlight();  // As after a failed step.
  EXPECT_EQ(mesh->in_flight(), 0);
  for (int d = 0; d < 2; ++d) EXPECT_EQ(mesh->replica(d)->in_flight(), 0);
  // Replica 0's gradients are the optimizer's to zero; the others' are not
  // reachable by it, so the mesh zeroes them.
  for (Parameter* p : mesh->replica(1)->parameters()) {
    const std::vector<float> g = Read(p->grad);
    EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f)) << p->name;
  }
  ASSERT_TRUE(mesh->Forward(0, RandomTensor({4, 6}, 1)).ok());
}

// Under bf16 GEMMs every replica's matrices keep bf16 copies, and the
// broadcast after an update brings them up to date on every replica (a
// stale copy would have the replicas compute with old weights).
TEST(MeshStageTest, Bf16CopiesFollowTheBroadcastOnEveryReplica) {
  const ModelSpec spec = Parse(kMlp);
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  auto collective = *CreateHostMeshCollective({bf16, bf16});
  auto mesh = *MeshStage::Create(collective.get(), spec, 1);
  ASSERT_TRUE(mesh->InitializeFromSeed(1).ok());
  // As an optimizer step would: replica 0's values change...
  for (Parameter* p : mesh->replica(0)->parameters()) {
    bf16->Scale(p->value, 1.37f);
  }
  // ...and the mesh hands them to the others.
  ASSERT_TRUE(mesh->AfterOptimizerStep().ok());
  int copies = 0;
  for (int d = 0; d < 2; ++d) {
    std::vector<Parameter*> params = mesh->replica(d)->parameters();
    std::vector<Parameter*> first = mesh->replica(0)->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      Parameter* p = params[i];
      EXPECT_EQ(Read(p->value), Read(first[i]->value)) << p->name;
      if (!p->value_bf16.defined()) continue;
      if (d == 0) continue;  // Replica 0's copies are the optimizer's.
      ++copies;
      Tensor widened = *bf16->Empty(p->value.shape(), DType::kF32);
      bf16->CastFromBf16(p->value_bf16, widened);
      const std::vector<float> value = Read(p->value), copy = Read(widened);
      for (size_t j = 0; j < value.size(); ++j) {
        ASSERT_EQ(copy[j], RoundToBf16(value[j])) << p->name << "[" << j << "]";
      }
    }
  }
  EXPECT_GT(copies, 0);
}

TEST(MeshStageTest, CreateRejectsAnOutOfRangeStage) {
  const ModelSpec spec = Parse(kMlp);
  auto collective = *CreateHostMeshCollective({CpuBackend::Get()});
  EXPECT_EQ(MeshStage::Create(collective.get(), spec, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeshStage::Create(nullptr, spec, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::engine
