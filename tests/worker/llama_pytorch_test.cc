// A tiny Llama (4 blocks, grouped-query attention with 4 query and 2
// key/value heads, rotary embedding, RMS norms, SwiGLU), with its lm_head
// tied to the embedding and with one of its own, and shaped as Llama 3.2
// (tied, GQA, RoPE scaling of rope_type llama3 with factor 32, low 1, high
// 4 and an original length of 8, so that the scaling changes the
// frequencies at the test's 16 positions; here also heads of 12 on 32
// features, a head_dim other than hidden / heads), must equal the same
// model written in plain PyTorch from HF's LlamaForCausalLM semantics
// (tests/worker/llama_reference.py, run in float64 from the same float32
// init file): the initial model's logits, and the loss of every step and the
// parameters after 5 AdamW steps with gradient clipping, trained in process
// and pipelined over 2, 3 and 4 ranks (1f1b, zb-h1, interleaved 1f1b).
// Skipped where Debian's python3-torch is not installed.
//
// Tolerances, from the conditioning. The logits are float32 sums of a few
// dozen products per layer over 4 blocks: relative error ~1e-6, so 1e-5 of
// the largest logit. A parameter after 5 steps is its init plus 5 Adam
// updates, lr * m / (sqrt(v) + eps) each, and Adam divides a gradient by its
// own size: where a gradient element is tiny, its float32 rounding noise is
// a large part of it, and the update of that element can differ by a
// visible fraction of lr (the trap of comparing what is rounding noise). So
// each tensor is compared norm-wise, where such elements weigh nothing:
// within 1e-4 of the parameters' norm (the issue's bound) and 1e-3 of the
// norm of what training changed (seen: 1.4e-5 and 1.8e-5 at most); and each
// element within 1e-4 of its value plus a tenth of one step (lr), which no
// element near a sign flip of its gradient reaches in 5 steps but any wrong
// gradient does. A gradient that is truly zero stays exactly zero in both
// (the embedding rows of tokens absent from a step: nothing is added to
// them), and every other parameter takes part in every logit. Tied, every
// embedding row is also an output row, whose gradient the softmax makes
// nonzero in every step.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/safetensors.h"
#include "engine/stage.h"
#include "gtest/gtest.h"
#include "job/job_spec.h"
#include "job/microbatch_documents.h"
#include "job/trainer.h"
#include "tests/engine/test_util.h"
#include "tests/worker/run_job.h"

namespace conveyor::worker {
namespace {

using testing_util::Programs;
using testing_util::Reference;
using testing_util::Result;
using testing_util::RunJob;

constexpr int kBlocks = 4, kSeq = 16, kBatch = 8, kSteps = 5;
constexpr double kLr = 0.01;

// 322 bytes: 20 windows of 16, so the 5 steps of 8 wrap around it.
constexpr char kCorpus[] =
    "the quick brown fox jumps over the lazy dog. pack my box with five dozen "
    "liquor jugs! how vexingly quick daft zebras jump; sphinx of black quartz, "
    "judge my vow. the dog sleeps and the fox runs over the box of quartz. a "
    "lazy zebra packs five jugs of liquor into my brown box, and the sphinx "
    "judges how quick the dog jumps. ";

// The models compared: the lm_head separate or tied, Llama 3.2's shape, and
// Llama 3.2's shape trained on packed documents (every space ends one, so
// each 16-token window packs several: positions restart at each, attention
// stays within each, and no loss is taken across a boundary).
enum class Model {
  kSeparateLmHead,
  kTiedEmbeddings,
  kLlama32,
  kPackedDocuments
};

bool Tied(Model m) { return m != Model::kSeparateLmHead; }
bool Llama32(Model m) {
  return m == Model::kLlama32 || m == Model::kPackedDocuments;
}

constexpr int kEod = ' ';
constexpr int kMicrobatches = 4;

// The data section of `model`'s jobs.
std::string DataYaml(const std::filesystem::path& corpus, Model model) {
  return absl::StrCat(
      "data: {source: tokens, path: ", corpus.string(), ", seq_len: ", kSeq,
      model == Model::kPackedDocuments
          ? absl::StrCat(", documents: {eod_token: ", kEod,
                         ", reset_position_ids: true, document_mask: true, "
                         "eod_mask_loss: true}")
          : "",
      "}\n");
}

// Llama 3.2's rope scaling with an original length of 8 (its is 8192).
constexpr char kLlama3Scaling[] =
    "{rope_type: llama3, factor: 32, low_freq_factor: 1, high_freq_factor: "
    "4, original_max_position_embeddings: 8}";
constexpr char kLlama3ScalingJson[] =
    R"({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,)"
    R"( "high_freq_factor": 4.0, "original_max_position_embeddings": 8})";
constexpr int kLlama32HeadDim = 12;

std::string ModelYaml(const std::string& init, const std::vector<int>& cuts,
                      Model model) {
  const bool tied = Tied(model);
  std::string layers = "    - embedding: {vocab_size: 256, features: 32}\n";
  const std::string block_options =
      Llama32(model) ? absl::StrCat(", head_dim: ", kLlama32HeadDim,
                                    ", rope_scaling: ", kLlama3Scaling)
                     : "";
  for (int b = 1; b <= kBlocks; ++b) {
    layers += absl::StrCat(
        "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 64, "
        "rope_theta: 1000",
        block_options, "}\n");
    for (int cut : cuts) {
      if (cut == b) layers += "    - boundary\n";
    }
  }
  layers += absl::StrCat("    - rmsnorm\n    - lm_head: {vocab_size: 256",
                         tied ? ", tied: true" : "", "}\n");
  return absl::StrCat("model:\n  input_shape: [", kSeq, "]\n  init: ", init,
                      "\n  layers:\n", layers, "  loss: cross_entropy\n");
}

// One model (tied or not): its init file, its initial logits, and the
// PyTorch reference's results, computed once per test process.
struct Variant {
  Model model = Model::kSeparateLmHead;
  bool tied = false;
  std::filesystem::path dir;
  std::vector<float> logits;
  std::unique_ptr<engine::SafetensorsReader> reference, init;
  std::string error;  // Why the set-up failed; empty when it did not.

  ~Variant() { std::filesystem::remove_all(dir); }
};

std::unique_ptr<Variant> MakeVariant(Model model) {
  auto v = std::make_unique<Variant>();
  v->model = model;
  v->tied = Tied(model);
  v->dir = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("llama_pytorch_test_", getpid(), "_",
                        static_cast<int>(model));
  std::filesystem::remove_all(v->dir);
  std::filesystem::create_directories(v->dir);
  std::ofstream(v->dir / "corpus.txt", std::ios::binary) << kCorpus;

  // The init file: the unsplit model drawn from a seed (a tied model's
  // embedding once). Its logits on step 0's inputs are compared below.
  auto job = job::ParseJobSpec(
      absl::StrCat("name: init\n", ModelYaml("{seed: 11}", {}, model),
                   DataYaml(v->dir / "corpus.txt", model),
                   "training: {steps: 1, batch_size: 8}\n",
                   "optimizer: {kind: sgd, lr: 0.1}\n"),
      "init.yaml");
  if (!job.ok()) {
    v->error = job.status().ToString();
    return v;
  }
  engine::Backend* cpu = engine::CpuBackend::Get();
  auto stage = engine::Stage::Create(cpu, job->model, 0);
  if (!stage.ok()) {
    v->error = stage.status().ToString();
    return v;
  }
  absl::Status s = (*stage)->InitializeFromSeed(11);
  if (s.ok() && Llama32(model)) {
    // HF's init (std 0.02) leaves attention nearly uniform, where positions
    // hardly matter: q and k 8 times larger make the scores 64 times so,
    // and the rotation (and its scaling) visible in every logit.
    for (engine::Parameter* p : (*stage)->parameters()) {
      if (absl::StrContains(p->name, "self_attn.q_proj.weight") ||
          absl::StrContains(p->name, "self_attn.k_proj.weight")) {
        cpu->Scale(p->value, 8.0f);
      }
    }
  }
  if (s.ok()) {
    s = job::SaveParameters(cpu, (*stage)->parameters(),
                            (v->dir / "init.safetensors").string(), {});
  }
  if (!s.ok()) {
    v->error = s.ToString();
    return v;
  }
  std::vector<int64_t> ids;
  const std::string corpus = kCorpus;
  for (int w = 0; w < kBatch; ++w) {
    for (int i = 0; i < kSeq; ++i) {
      ids.push_back(static_cast<unsigned char>(corpus[w * kSeq + i]));
    }
  }
  if (model == Model::kPackedDocuments) {
    // Step 0's documents, as the trainer hands them to its stages.
    auto data = engine::DataSource::Create(job->data,
                                           job::ModelSampleShapes(job->model));
    if (!data.ok()) {
      v->error = data.status().ToString();
      return v;
    }
    auto documents =
        job::DocumentsFor(**data, job->data.documents, 0, 0, 1, kBatch);
    if (documents.ok()) {
      s = (*stage)->SetDocuments(0, *std::move(documents));
    } else {
      s = documents.status();
    }
    if (!s.ok()) {
      v->error = s.ToString();
      return v;
    }
  }
  auto logits =
      (*stage)->Forward(0, engine::testing_util::Ids({kBatch, kSeq}, ids));
  if (!logits.ok()) {
    v->error = logits.status().ToString();
    return v;
  }
  v->logits = engine::testing_util::ToVector(*logits);

  const std::string config = absl::StrCat(
      R"({"blocks": )", kBlocks,
      R"(, "features": 32, "heads": 4, "kv_heads": 2, "rope_theta": 1000,)",
      R"( "rms_eps": 1e-6, "seq": )", kSeq, R"(, "batch": )", kBatch,
      R"(, "steps": )", kSteps, R"(, "lr": )", kLr,
      R"(, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,)",
      R"( "clip": 0.5, "tied": )", v->tied ? "true" : "false",
      Llama32(model) ? absl::StrCat(R"(, "head_dim": )", kLlama32HeadDim,
                                    R"(, "rope_scaling": )", kLlama3ScalingJson)
                     : "",
      model == Model::kPackedDocuments
          ? absl::StrCat(R"(, "eod": )", kEod,
                         R"(, "reset_position_ids": true,)",
                         R"( "document_mask": true, "eod_mask_loss": true,)",
                         R"( "microbatches": )", kMicrobatches)
          : "",
      "}");
  const std::string command =
      absl::StrCat("/usr/bin/python3 ", CONVEYOR_LLAMA_REFERENCE, " ",
                   (v->dir / "init.safetensors").string(), " ",
                   (v->dir / "corpus.txt").string(), " ",
                   (v->dir / "reference.safetensors").string(), " '", config,
                   "' 2>", (v->dir / "reference.log").string());
  if (std::system(command.c_str()) != 0) {
    std::stringstream log;
    log << std::ifstream(v->dir / "reference.log").rdbuf();
    v->error = absl::StrCat(command, " failed:\n", log.str());
    return v;
  }
  for (auto [name, reader] : {std::pair{"reference.safetensors", &v->reference},
                              std::pair{"init.safetensors", &v->init}}) {
    auto file = engine::SafetensorsReader::Open((v->dir / name).string());
    if (!file.ok()) {
      v->error = file.status().ToString();
      return v;
    }
    *reader = std::make_unique<engine::SafetensorsReader>(*std::move(file));
  }
  return v;
}

class LlamaPyTorchTest : public ::testing::TestWithParam<Model> {
 protected:
  static void TearDownTestSuite() { variants_.clear(); }

  void SetUp() override {
    // Importing torch takes seconds: asked once per process.
    static const bool torch =
        std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    if (!torch) {
      GTEST_SKIP() << "needs /usr/bin/python3 with torch (Debian's "
                      "python3-torch; scripts/install-deps --with-torch)";
    }
    std::unique_ptr<Variant>& v = variants_[GetParam()];
    if (v == nullptr) v = MakeVariant(GetParam());
    ASSERT_EQ(v->error, "");
    v_ = v.get();
  }

  std::string JobYaml(const std::vector<int>& cuts, const std::string& schedule,
                      int virtual_stages) const {
    return absl::StrCat(
        "name: llama\n",
        ModelYaml(absl::StrCat(
                      "{from: ", (v_->dir / "init.safetensors").string(), "}"),
                  cuts, v_->model),
        DataYaml(v_->dir / "corpus.txt", v_->model),
        "training: {steps: ", kSteps, ", batch_size: ", kBatch,
        ", microbatches: ", kMicrobatches, "}\n",
        "optimizer: {kind: adamw, lr: ", kLr,
        ", betas: [0.9, 0.95], eps: 1e-8, weight_decay: 0.1, "
        "clip_grad_norm: 0.5}\n",
        "pipeline: {schedule: ", schedule, ", virtual_stages: ", virtual_stages,
        "}\n");
  }

  void ExpectEqualsReference(const Result& got, const std::string& what) const {
    for (const absl::Status& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> losses = *v_->reference->ReadF32("losses");
    ASSERT_EQ(got.losses.size(), losses.size()) << what;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], losses[i], 1e-5 * losses[i])
          << what << ": step " << i + 1;
    }
    int checked = 0;
    for (const auto& [name, values] : got.params) {
      SCOPED_TRACE(what + ": " + name);
      auto want = v_->reference->ReadF32(name);
      auto init = v_->init->ReadF32(name);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(init.ok()) << init.status();
      ASSERT_EQ(values.size(), want->size());
      // Norm-wise: the parameters (the issue's 1e-4) and, sharper, what
      // training changed in them.
      double diff = 0, norm = 0, update = 0;
      int bad = 0;
      for (size_t i = 0; i < values.size(); ++i) {
        const double d = double{values[i]} - (*want)[i];
        const double u = double{(*want)[i]} - (*init)[i];
        diff += d * d;
        norm += double{(*want)[i]} * (*want)[i];
        update += u * u;
        if (std::abs(d) > 1e-4 * std::abs((*want)[i]) + 0.1 * kLr &&
            bad++ < 3) {
          ADD_FAILURE() << "[" << i << "]: " << values[i] << " vs "
                        << (*want)[i];
        }
      }
      EXPECT_EQ(bad, 0);
      EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm));
      EXPECT_LE(std::sqrt(diff), 1e-3 * std::sqrt(update));
      ++checked;
    }
    // The embedding, the lm_head unless it is the embedding, the final norm
    // and 9 tensors per block.
    EXPECT_EQ(checked, (v_->tied ? 2 : 3) + 9 * kBlocks) << what;
    // A tied copy ends bitwise equal to its original.
    if (v_->tied) {
      ASSERT_EQ(got.tied_copies.size(), 1u) << what;
      EXPECT_EQ(got.tied_copies.at("layers.0.weight"),
                got.params.at("layers.0.weight"))
          << what;
    } else {
      EXPECT_TRUE(got.tied_copies.empty()) << what;
    }
  }

  static std::map<Model, std::unique_ptr<Variant>> variants_;
  const Variant* v_ = nullptr;
};

std::map<Model, std::unique_ptr<Variant>> LlamaPyTorchTest::variants_;

TEST_P(LlamaPyTorchTest, InitialLogitsEqualPyTorch) {
  const std::vector<float> want = *v_->reference->ReadF32("logits");
  ASSERT_EQ(v_->logits.size(), want.size());
  double largest = 0;
  for (float v : want) largest = std::max(largest, std::abs(double{v}));
  ASSERT_GT(largest, 0.1);  // Not a degenerate model.
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(v_->logits[i], want[i], 1e-5 * largest) << i;
  }
}

TEST_P(LlamaPyTorchTest, RopeScalingChangesTheLogitsFarBeyondTheTolerance) {
  // Guards InitialLogitsEqualPyTorch against a scaling that does nothing at
  // 16 positions: without it the reference's logits move by far more than
  // the comparison's tolerance.
  if (!Llama32(v_->model)) GTEST_SKIP() << "no rope scaling";
  const std::vector<float> want = *v_->reference->ReadF32("logits");
  const std::vector<float> unscaled =
      *v_->reference->ReadF32("logits_unscaled");
  ASSERT_EQ(unscaled.size(), want.size());
  double largest = 0, moved = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::abs(double{want[i]}));
    moved = std::max(moved, std::abs(double{want[i]} - unscaled[i]));
  }
  RecordProperty("moved_over_tolerance",
                 absl::StrCat(moved / (1e-5 * largest)));
  EXPECT_GT(moved, 100 * 1e-5 * largest);
}

TEST_P(LlamaPyTorchTest, DocumentsChangeTheLogitsFarBeyondTheTolerance) {
  // Guards the packed-documents comparisons against documents that change
  // nothing: the reference's logits with every row one sequence differ by
  // far more than the tolerance.
  if (v_->model != Model::kPackedDocuments) GTEST_SKIP() << "no documents";
  const std::vector<float> want = *v_->reference->ReadF32("logits");
  const std::vector<float> plain =
      *v_->reference->ReadF32("logits_undocumented");
  ASSERT_EQ(plain.size(), want.size());
  double largest = 0, moved = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::abs(double{want[i]}));
    moved = std::max(moved, std::abs(double{want[i]} - plain[i]));
  }
  EXPECT_GT(moved, 100 * 1e-5 * largest);
}

TEST_P(LlamaPyTorchTest, LossFallsInPyTorchToo) {
  // Guards the comparison below against a reference that does nothing.
  const std::vector<float> losses = *v_->reference->ReadF32("losses");
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(losses.back(), losses.front() - 0.1);
}

TEST_P(LlamaPyTorchTest, InProcessTrainingEqualsPyTorch) {
  ExpectEqualsReference(Reference(JobYaml({}, "1f1b", 1)), "in process");
}

TEST_P(LlamaPyTorchTest, OneFOneBOverTwoRanksEqualsPyTorch) {
  ExpectEqualsReference(RunJob(Programs(JobYaml({2}, "1f1b", 1))),
                        "1f1b over 2 ranks");
}

TEST_P(LlamaPyTorchTest, ZeroBubbleOverThreeRanksEqualsPyTorch) {
  ExpectEqualsReference(RunJob(Programs(JobYaml({1, 3}, "zb-h1", 1))),
                        "zb-h1 over 3 ranks");
}

TEST_P(LlamaPyTorchTest, OneFOneBOverFourRanksEqualsPyTorch) {
  ExpectEqualsReference(RunJob(Programs(JobYaml({1, 2, 3}, "1f1b", 1))),
                        "1f1b over 4 ranks");
}

TEST_P(LlamaPyTorchTest, InterleavedOverTwoRanksEqualsPyTorch) {
  ExpectEqualsReference(
      RunJob(Programs(JobYaml({1, 2, 3}, "interleaved-1f1b", 2))),
      "interleaved 1f1b, 2 ranks of 2 stages");
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaPyTorchTest,
                         ::testing::Values(Model::kSeparateLmHead,
                                           Model::kTiedEmbeddings,
                                           Model::kLlama32,
                                           Model::kPackedDocuments),
                         [](const ::testing::TestParamInfo<Model>& info) {
                           switch (info.param) {
                             case Model::kSeparateLmHead:
                               return "SeparateLmHead";
                             case Model::kTiedEmbeddings:
                               return "TiedEmbeddings";
                             case Model::kLlama32:
                               return "Llama32RopeScalingAndHeadDim";
                             case Model::kPackedDocuments:
                               return "Llama32OnPackedDocuments";
                           }
                           return "";
                         });

}  // namespace
}  // namespace conveyor::worker
