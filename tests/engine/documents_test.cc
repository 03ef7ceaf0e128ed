// Packed documents (engine/documents.h): the layout's checks and spans, the
// softmax within documents and the cross-entropy that ignores masked targets,
// each against a reference computed here; and the property that defines the
// feature: a stage run on a row packing two documents, with positions reset
// and attention kept within each document, gives each document's tokens the
// outputs, and the parameters the gradients, of running the documents as
// separate rows.
#include "engine/documents.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/loss_kind.h"
#include "engine/model_spec.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::FromVector;
using testing_util::Ids;
using testing_util::RandomTensor;
using testing_util::ToVector;

std::vector<int64_t> ToIds(const Tensor& t) {
  const int64_t* p = t.data<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

TEST(DocumentsTest, SpansCoverEachTokensDocument) {
  MicrobatchDocuments d;
  d.rows = 2;
  d.seq_len = 5;
  d.segments = {0, 0, 1, 2, 2, 0, 0, 0, 0, 0};
  d.positions = {3, 4, 0, 0, 1, 7, 8, 9, 10, 11};
  absl::StatusOr<DeviceDocuments> up = UploadDocuments(CpuBackend::Get(), d);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(up->spans.shape(), (Shape{2, 5, 2}));
  EXPECT_EQ(ToIds(up->spans),
            (std::vector<int64_t>{0, 2, 0, 2, 2, 3, 3, 5, 3, 5,  //
                                  0, 5, 0, 5, 0, 5, 0, 5, 0, 5}));
  EXPECT_EQ(ToIds(up->positions), d.positions);

  // A replica's rows.
  const MicrobatchDocuments second = d.Rows(1, 2);
  EXPECT_EQ(second.rows, 1);
  EXPECT_EQ(second.segments, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(second.positions, (std::vector<int64_t>{7, 8, 9, 10, 11}));

  // Either half alone.
  MicrobatchDocuments positions_only = d;
  positions_only.segments.clear();
  up = UploadDocuments(CpuBackend::Get(), positions_only);
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_FALSE(up->spans.defined());
  EXPECT_TRUE(up->positions.defined());
}

TEST(DocumentsTest, RefusesMalformedLayouts) {
  MicrobatchDocuments d;
  d.rows = 1;
  d.seq_len = 4;
  d.segments = {0, 2, 2, 2};  // Skips a document.
  EXPECT_THAT(d.Validate().message(), HasSubstr("contiguous"));
  d.segments = {1, 1, 1, 1};  // Does not start at 0.
  EXPECT_THAT(d.Validate().message(), HasSubstr("starts at segment 0"));
  d.segments = {0, 1, 0, 0};  // Goes back.
  EXPECT_FALSE(d.Validate().ok());
  d.segments = {0, 0, 1};
  EXPECT_THAT(d.Validate().message(), HasSubstr("3 segment ids for 1 rows"));
  d.segments.clear();
  d.positions = {0, 1, -1, 0};
  EXPECT_THAT(d.Validate().message(), HasSubstr("position -1"));
  EXPECT_EQ(UploadDocuments(CpuBackend::Get(), d).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The reference: per row, softmax in double over the keys the query may see.
TEST(DocumentsTest, SoftmaxInSpansIsTheSoftmaxOverTheDocumentsKeys) {
  Backend* be = CpuBackend::Get();
  const int64_t samples = 2, heads = 3, seq = 11;
  const std::vector<int32_t> segments = {0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 3,
                                         0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  MicrobatchDocuments d{samples, seq, {}, segments};
  absl::StatusOr<DeviceDocuments> up = UploadDocuments(be, d);
  ASSERT_TRUE(up.ok()) << up.status();
  const Tensor x = RandomTensor({samples, heads, seq, seq}, 5, 3.0f);
  const std::vector<float> xs = ToVector(x);
  for (const bool causal : {false, true}) {
    Tensor y = *be->Empty(x.shape(), DType::kF32);
    be->SoftmaxInSpans(x, 0.7f, causal, up->spans, y);
    const std::vector<float> ys = ToVector(y);
    for (int64_t m = 0; m < samples * heads; ++m) {
      const int64_t sample = m / heads;
      for (int64_t q = 0; q < seq; ++q) {
        const int32_t* s = segments.data() + sample * seq;
        auto visible = [&](int64_t k) {
          return s[k] == s[q] && (!causal || k <= q);
        };
        double max = -1e300, sum = 0;
        for (int64_t k = 0; k < seq; ++k) {
          if (visible(k))
            max = std::max(max, 0.7 * xs[(m * seq + q) * seq + k]);
        }
        for (int64_t k = 0; k < seq; ++k) {
          if (visible(k))
            sum += std::exp(0.7 * xs[(m * seq + q) * seq + k] - max);
        }
        for (int64_t k = 0; k < seq; ++k) {
          const float got = ys[(m * seq + q) * seq + k];
          if (!visible(k)) {
            EXPECT_EQ(got, 0.0f) << m << " " << q << " " << k;
          } else {
            // Probabilities of a row of 11: float rounding of exp and the
            // sum, a few units of 1e-7 relative.
            const double want =
                std::exp(0.7 * xs[(m * seq + q) * seq + k] - max) / sum;
            EXPECT_NEAR(got, want, 1e-6 * want + 1e-9)
                << m << " " << q << " " << k << " causal=" << causal;
          }
        }
      }
    }
  }
}

TEST(DocumentsTest, CrossEntropyLeavesIgnoredTargetsOut) {
  Backend* be = CpuBackend::Get();
  const int64_t vocab = 19;
  const Tensor logits = RandomTensor({5, vocab}, 7, 2.0f);
  const Tensor targets = Ids({5}, {4, kIgnoredTarget, 18, kIgnoredTarget, 0});
  Tensor d = *be->Empty({5, vocab}, DType::kF32);
  absl::StatusOr<float> loss = be->CrossEntropyLoss(logits, targets, 0.5f, d);
  ASSERT_TRUE(loss.ok()) << loss.status();

  // The same rows without the ignored ones.
  const std::vector<float> all = ToVector(logits);
  std::vector<float> kept;
  for (int r : {0, 2, 4}) {
    kept.insert(kept.end(), all.begin() + r * vocab,
                all.begin() + (r + 1) * vocab);
  }
  Tensor kd = *be->Empty({3, vocab}, DType::kF32);
  absl::StatusOr<float> kept_loss = be->CrossEntropyLoss(
      FromVector({3, vocab}, kept), Ids({3}, {4, 18, 0}), 0.5f, kd);
  ASSERT_TRUE(kept_loss.ok()) << kept_loss.status();
  EXPECT_NEAR(*loss, *kept_loss, 1e-6 * *kept_loss);
  const std::vector<float> g = ToVector(d), kg = ToVector(kd);
  for (int64_t c = 0; c < vocab; ++c) {
    EXPECT_EQ(g[0 * vocab + c], kg[0 * vocab + c]);
    EXPECT_EQ(g[2 * vocab + c], kg[1 * vocab + c]);
    EXPECT_EQ(g[4 * vocab + c], kg[2 * vocab + c]);
    EXPECT_EQ(g[1 * vocab + c], 0.0f);
    EXPECT_EQ(g[3 * vocab + c], 0.0f);
  }

  // Nothing left: loss 0 and no gradient, not NaN.
  loss = be->CrossEntropyLoss(logits, Ids({5}, std::vector<int64_t>(5, -1)),
                              1.0f, d);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(*loss, 0.0f);
  for (float v : ToVector(d)) ASSERT_EQ(v, 0.0f);

  // Any other negative target is still an error.
  EXPECT_THAT(be->CrossEntropyLoss(logits, Ids({5}, {0, -2, 0, 0, 0}), 1.0f, d)
                  .status()
                  .message(),
              HasSubstr("target -2 at position 1"));
}

// A byte-level GPT stage: learned positions, two causal pre-norm blocks and
// a head, as examples/gpt.yaml.
constexpr char kGpt[] = R"(model:
  input_shape: [8]
  init: {seed: 3}
  layers:
    - embedding: {vocab_size: 23, features: 16, max_positions: 8}
    - transformer_block: {heads: 2, mlp_features: 32, causal: true, norm: pre}
    - transformer_block: {heads: 2, mlp_features: 32, causal: true, norm: pre}
    - layernorm
    - lm_head: {vocab_size: 23}
  loss: cross_entropy
)";

struct StageRun {
  std::vector<float> y;
  std::map<std::string, std::vector<float>> grads;
};

// Forward and backward of `ids` [1, n] with output gradient `dy`.
StageRun RunStage(const ModelSpec& spec, const std::vector<int64_t>& ids,
                  const std::vector<float>& dy,
                  const MicrobatchDocuments* docs) {
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(CpuBackend::Get(), spec, 0);
  CONVEYOR_CHECK(stage.ok(), stage.status().ToString());
  CONVEYOR_CHECK((*stage)->InitializeFromSeed(3).ok(), "init");
  const int64_t n = static_cast<int64_t>(ids.size());
  if (docs != nullptr) {
    const absl::Status set = (*stage)->SetDocuments(0, *docs);
    CONVEYOR_CHECK(set.ok(), set.ToString());
  }
  absl::StatusOr<Tensor> y = (*stage)->Forward(0, Ids({1, n}, ids));
  CONVEYOR_CHECK(y.ok(), y.status().ToString());
  StageRun run;
  run.y = ToVector(*y);
  const int64_t vocab = y->dim(-1);
  CONVEYOR_CHECK((*stage)->Backward(0, FromVector({1, n, vocab}, dy)).ok(),
                 "backward");
  for (Parameter* p : (*stage)->parameters()) {
    run.grads[p->name] = ToVector(p->grad);
  }
  return run;
}

TEST(DocumentsTest, APackedRowEqualsItsDocumentsRunApart) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(kGpt, "gpt.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int64_t vocab = 23, a = 3, b = 5, n = a + b;
  const std::vector<int64_t> doc_a = {5, 9, 0}, doc_b = {22, 1, 7, 7, 3};
  std::vector<int64_t> packed = doc_a;
  packed.insert(packed.end(), doc_b.begin(), doc_b.end());
  const std::vector<float> dy = ToVector(RandomTensor({1, n, vocab}, 11));
  const std::vector<float> dy_a(dy.begin(), dy.begin() + a * vocab);
  const std::vector<float> dy_b(dy.begin() + a * vocab, dy.end());

  MicrobatchDocuments docs;
  docs.rows = 1;
  docs.seq_len = n;
  docs.positions = {0, 1, 2, 0, 1, 2, 3, 4};
  docs.segments = {0, 0, 0, 1, 1, 1, 1, 1};
  const StageRun together = RunStage(*spec, packed, dy, &docs);
  const StageRun first = RunStage(*spec, doc_a, dy_a, nullptr);
  const StageRun second = RunStage(*spec, doc_b, dy_b, nullptr);

  // Outputs: the same kernels on the same values, except for GEMMs whose
  // row counts differ (OpenBLAS may block them differently): float32
  // rounding of sums of a few dozen terms, far below 1e-5 of the logits'
  // scale, while a token that saw the other document moves by O(1).
  std::vector<float> apart = first.y;
  apart.insert(apart.end(), second.y.begin(), second.y.end());
  float scale = 0;
  for (float v : apart) scale = std::max(scale, std::abs(v));
  ASSERT_EQ(together.y.size(), apart.size());
  for (size_t i = 0; i < apart.size(); ++i) {
    ASSERT_NEAR(together.y[i], apart[i], 1e-5f * scale) << "logit " << i;
  }
  // Gradients: the packed row's are the sum of the documents'. Every
  // parameter takes part in both documents' logits except the rows of
  // tokens and positions a document does not use, which are exactly 0 in
  // both.
  for (const auto& [name, g] : together.grads) {
    const std::vector<float>& ga = first.grads.at(name);
    const std::vector<float>& gb = second.grads.at(name);
    float norm = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      norm = std::max(norm, std::abs(ga[i] + gb[i]));
    }
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(g[i], ga[i] + gb[i], 1e-5f * norm + 1e-7f)
          << name << "[" << i << "]";
    }
  }

  // Without the documents, the packed row differs: the check above is not
  // vacuous.
  const StageRun unmasked = RunStage(*spec, packed, dy, nullptr);
  float moved = 0;
  for (size_t i = a * vocab; i < apart.size(); ++i) {
    moved = std::max(moved, std::abs(unmasked.y[i] - apart[i]));
  }
  EXPECT_GT(moved, 1e-2f * scale);
}

TEST(DocumentsTest, DocumentsThatDoNotFitTheLayerAreRefused) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(kGpt, "gpt.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(CpuBackend::Get(), *spec, 0);
  ASSERT_TRUE(stage.ok()) << stage.status();
  MicrobatchDocuments docs;
  docs.rows = 1;
  docs.seq_len = 4;
  docs.positions = {0, 1, 0, 1};
  ASSERT_TRUE((*stage)->SetDocuments(0, docs).ok());
  const absl::StatusOr<Tensor> y =
      (*stage)->Forward(0, Ids({2, 8}, std::vector<int64_t>(16, 1)));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(),
              HasSubstr("embedding: the microbatch's documents"));
  EXPECT_EQ((*stage)->in_flight(), 0);
}

}  // namespace
}  // namespace conveyor::engine
