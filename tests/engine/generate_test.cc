// The generator against the training forward: a small random Llama (two
// blocks, grouped-query attention, with and without q/k/v biases) fed token
// by token, all at once, and prompt-then-token, gives at every position the
// logits the engine's Stage computes over the whole sequence; greedy
// decoding follows the argmax; sampling is reproducible from its seed and
// keeps to the top k; other layouts, bad ids, a full cache and bad options
// are refused.
#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model_spec.h"
#include "engine/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 37;
constexpr int64_t kSeq = 12;

// Every parameter from a map, as a checkpoint would give it.
class MapSource final : public ParameterSource {
 public:
  absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                          const Shape& shape) const override {
    auto it = values_.find(name);
    if (it == values_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
    }
    if (static_cast<int64_t>(it->second.size()) != NumElements(shape)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": wrong shape"));
    }
    return it->second;
  }

  std::map<std::string, std::vector<float>> values_;
};

std::string LlamaYaml(bool bias, const std::string& extra_embedding = "") {
  const std::string block = absl::StrCat(
      "    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 24, "
      "rope_theta: 1000, attention_bias: ",
      bias ? "true" : "false", "}\n");
  return absl::StrCat("model:\n  input_shape: [", kSeq,
                      "]\n  init: {seed: 5}\n  loss: cross_entropy\n"
                      "  layers:\n    - embedding: {vocab_size: ",
                      kVocab, ", features: 16", extra_embedding, "}\n", block,
                      block, "    - rmsnorm: {eps: 1e-5}\n",
                      "    - lm_head: {vocab_size: ", kVocab, "}\n");
}

ModelSpec Parse(const std::string& yaml) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(yaml, "gen.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Random weights of a scale that makes every part of the block matter (HF's
// init, N(0, 0.02^2), would leave the logits near zero): projections with
// unit-variance outputs, norm weights around 1, biases around 0.
MapSource RandomWeights(const ModelSpec& spec) {
  MapSource source;
  uint32_t seed = 100;
  for (const ParamSpec* p : spec.Params()) {
    const int64_t n = p->NumElements();
    std::vector<float> v;
    if (p->shape.size() == 2) {
      const bool embedding = p->name == "layers.0.weight";
      const float scale =
          embedding ? 1.0f : 1.0f / std::sqrt(static_cast<float>(p->shape[1]));
      v = testing_util::Random(n, seed++, scale);
    } else if (p->name.find("norm") != std::string::npos ||
               p->init == ParamInit::kOnes) {
      v = testing_util::Random(n, seed++, 0.2f);
      for (float& x : v) x += 1.0f;
    } else {
      v = testing_util::Random(n, seed++, 0.3f);
    }
    source.values_[p->name] = std::move(v);
  }
  return source;
}

std::vector<int64_t> RandomIds(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> ids(n);
  for (int64_t& id : ids) id = static_cast<int64_t>(gen() % kVocab);
  return ids;
}

// The training forward over the whole sequence: logits [S][vocab].
std::vector<std::vector<float>> ReferenceLogits(
    const ModelSpec& spec, const ParameterSource& source,
    const std::vector<int64_t>& ids) {
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(CpuBackend::Get(), spec, 0);
  EXPECT_TRUE(stage.ok()) << stage.status();
  EXPECT_TRUE((*stage)->LoadFrom(source).ok());
  const int64_t s = static_cast<int64_t>(ids.size());
  absl::StatusOr<Tensor> y =
      (*stage)->Forward(0, testing_util::Ids({1, s}, ids));
  EXPECT_TRUE(y.ok()) << y.status();
  const std::vector<float> flat = testing_util::ToVector(*y);
  std::vector<std::vector<float>> rows(s);
  for (int64_t i = 0; i < s; ++i) {
    rows[i].assign(flat.begin() + i * kVocab, flat.begin() + (i + 1) * kVocab);
  }
  return rows;
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// The two computations differ only in summation order (GEMMs of one row
// against the whole sequence, OpenBLAS's kernels for each shape). Each
// float32 operation rounds by at most 2^-24 relative; through two blocks
// (norms, dot products of <= 24 terms, a softmax over <= 12 positions) the
// differences stay within a few hundred roundings of the logits' size, so
// 1e-5 of the largest logit (~170 roundings) holds for any summation order
// while an error in the attention (a wrong position, mask or head group)
// moves logits by a good fraction of their size.
::testing::AssertionResult LogitsMatch(const std::vector<float>& got,
                                       const std::vector<float>& want) {
  const float tol = 1e-5f * std::max(MaxAbs(want), 1.0f);
  return testing_util::AllClose(got, want, 0.0, tol);
}

class GeneratorTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    spec_ = Parse(LlamaYaml(/*bias=*/GetParam()));
    source_ = RandomWeights(spec_);
    ids_ = RandomIds(kSeq, 7);
    reference_ = ReferenceLogits(spec_, source_, ids_);
  }

  std::unique_ptr<Generator> Make(int64_t max_tokens = kSeq) {
    absl::StatusOr<std::unique_ptr<Generator>> g =
        Generator::Create(CpuBackend::Get(), spec_, source_, max_tokens);
    EXPECT_TRUE(g.ok()) << g.status();
    return *std::move(g);
  }

  std::span<const int64_t> Ids(int64_t begin, int64_t end) const {
    return std::span<const int64_t>(ids_).subspan(begin, end - begin);
  }

  ModelSpec spec_;
  MapSource source_;
  std::vector<int64_t> ids_;
  std::vector<std::vector<float>> reference_;
};

TEST_P(GeneratorTest, TokenByTokenMatchesTheFullForwardAtEveryPosition) {
  std::unique_ptr<Generator> g = Make();
  // The reference must be worth matching: logits of a useful size.
  ASSERT_GT(MaxAbs(reference_.back()), 0.5f);
  for (int64_t i = 0; i < kSeq; ++i) {
    absl::StatusOr<std::vector<float>> logits = g->Feed(Ids(i, i + 1));
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(LogitsMatch(*logits, reference_[i])) << "position " << i;
    EXPECT_EQ(g->position(), i + 1);
  }
}

TEST_P(GeneratorTest, WholePromptsMatchTheFullForward) {
  std::unique_ptr<Generator> g = Make();
  for (int64_t len = 1; len <= kSeq; ++len) {
    g->Reset();
    absl::StatusOr<std::vector<float>> logits = g->Feed(Ids(0, len));
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(LogitsMatch(*logits, reference_[len - 1])) << "length " << len;
  }
}

TEST_P(GeneratorTest, PromptThenTokensMatchTheFullForward) {
  std::unique_ptr<Generator> g = Make();
  absl::StatusOr<std::vector<float>> logits = g->Feed(Ids(0, 5));
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(LogitsMatch(*logits, reference_[4]));
  for (int64_t i = 5; i < 8; ++i) {
    logits = g->Feed(Ids(i, i + 1));
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(LogitsMatch(*logits, reference_[i])) << "position " << i;
  }
  // A later chunk of several tokens continues from the cache too.
  logits = g->Feed(Ids(8, kSeq));
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(LogitsMatch(*logits, reference_[kSeq - 1]));
  EXPECT_EQ(g->position(), kSeq);
}

TEST_P(GeneratorTest, GreedyPicksTheFullForwardsArgmax) {
  std::unique_ptr<Generator> g = Make();
  const std::vector<int64_t> prompt(ids_.begin(), ids_.begin() + 4);
  absl::StatusOr<std::vector<int64_t>> out =
      g->Generate(prompt, kSeq - 4, {.temperature = 0.0});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), static_cast<size_t>(kSeq - 4));
  std::vector<int64_t> sequence = prompt;
  sequence.insert(sequence.end(), out->begin(), out->end());
  const std::vector<std::vector<float>> ref =
      ReferenceLogits(spec_, source_, sequence);
  for (int64_t i = 3; i + 1 < kSeq; ++i) {
    // The chosen token is the reference's argmax, up to a tie within the
    // tolerance (which rounding may break either way).
    const std::vector<float>& row = ref[i];
    const float best = *std::max_element(row.begin(), row.end());
    const float tol = 1e-5f * std::max(MaxAbs(row), 1.0f);
    EXPECT_GE(row[sequence[i + 1]], best - tol) << "position " << i;
  }
  // Generate starts from an empty cache whatever came before.
  absl::StatusOr<std::vector<int64_t>> again =
      g->Generate(prompt, kSeq - 4, {.temperature = 0.0});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *out);
}

TEST_P(GeneratorTest, TopKOneIsGreedy) {
  std::unique_ptr<Generator> g = Make();
  const std::vector<int64_t> prompt(ids_.begin(), ids_.begin() + 3);
  absl::StatusOr<std::vector<int64_t>> greedy =
      g->Generate(prompt, 8, {.temperature = 0.0});
  absl::StatusOr<std::vector<int64_t>> top1 =
      g->Generate(prompt, 8, {.temperature = 1.5, .top_k = 1, .seed = 9});
  ASSERT_TRUE(greedy.ok() && top1.ok());
  EXPECT_EQ(*top1, *greedy);
}

TEST_P(GeneratorTest, SamplingIsReproducibleFromItsSeed) {
  std::unique_ptr<Generator> g = Make(40);
  std::unique_ptr<Generator> other = Make(40);
  const std::vector<int64_t> prompt = {3, 1, 4};
  const SamplingOptions a = {.temperature = 2.0, .seed = 42};
  absl::StatusOr<std::vector<int64_t>> first = g->Generate(prompt, 30, a);
  absl::StatusOr<std::vector<int64_t>> same = other->Generate(prompt, 30, a);
  absl::StatusOr<std::vector<int64_t>> reseeded =
      g->Generate(prompt, 30, {.temperature = 2.0, .seed = 43});
  ASSERT_TRUE(first.ok() && same.ok() && reseeded.ok());
  EXPECT_EQ(*same, *first);
  // 30 draws at a high temperature over 37 tokens: two seeds agreeing on
  // all of them would take a broken random stream.
  EXPECT_NE(*reseeded, *first);
  for (int64_t id : *first) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, kVocab);
  }
}

INSTANTIATE_TEST_SUITE_P(Bias, GeneratorTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithQkvBias" : "NoBias";
                         });

// Heads of 6 on 16 features and HF's RoPE scalings, past an original
// length of 4 within the 12 positions: token by token, the generator's
// logits are the training forward's. Dynamic scaling follows the length fed
// so far, as HF's does (a forward of 12 grows theta for every position), so
// it equals the whole-sequence forward where the prompt is the whole
// sequence.
TEST(GeneratorRopeTest, HeadDimAndRopeScalingMatchTheFullForward) {
  const std::string scalings[] = {
      "{rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: "
      "4, original_max_position_embeddings: 4}",
      "{rope_type: yarn, factor: 4, original_max_position_embeddings: 4}",
      "{rope_type: dynamic, factor: 2, original_max_position_embeddings: 4}"};
  for (const std::string& scaling : scalings) {
    SCOPED_TRACE(scaling);
    std::string yaml = LlamaYaml(/*bias=*/false);
    const std::string block =
        "{heads: 4, kv_heads: 2, mlp_features: 24, rope_theta: 1000, "
        "attention_bias: false}";
    for (size_t at = yaml.find(block); at != std::string::npos;
         at = yaml.find(block, at + 1)) {
      yaml.replace(at, block.size(),
                   absl::StrCat("{heads: 4, kv_heads: 2, head_dim: 6, "
                                "mlp_features: 24, rope_theta: 1000, "
                                "rope_scaling: ",
                                scaling, "}"));
    }
    const ModelSpec spec = Parse(yaml);
    ASSERT_EQ(spec.layers[1].head_dim, 6);
    const MapSource source = RandomWeights(spec);
    const std::vector<int64_t> ids = RandomIds(kSeq, 7);
    const auto reference = ReferenceLogits(spec, source, ids);
    absl::StatusOr<std::unique_ptr<Generator>> g =
        Generator::Create(CpuBackend::Get(), spec, source, kSeq);
    ASSERT_TRUE(g.ok()) << g.status();
    const bool dynamic = absl::StrContains(scaling, "dynamic");
    for (int64_t i = 0; i < (dynamic ? 0 : kSeq); ++i) {
      absl::StatusOr<std::vector<float>> logits =
          (*g)->Feed(std::span<const int64_t>(ids).subspan(i, 1));
      ASSERT_TRUE(logits.ok()) << logits.status();
      EXPECT_TRUE(LogitsMatch(*logits, reference[i])) << "position " << i;
    }
    (*g)->Reset();
    absl::StatusOr<std::vector<float>> whole = (*g)->Feed(ids);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_TRUE(LogitsMatch(*whole, reference[kSeq - 1]));
  }
}

// A tied lm_head is the embedding: the source holds it once, and the
// generator's logits, token by token, are the training forward's.
TEST(GeneratorTiedTest, ATiedHeadReadsTheEmbedding) {
  std::string yaml = LlamaYaml(/*bias=*/false);
  const std::string head = absl::StrCat("lm_head: {vocab_size: ", kVocab, "}");
  yaml.replace(yaml.find(head), head.size(),
               absl::StrCat("lm_head: {vocab_size: ", kVocab, ", tied: true}"));
  const ModelSpec spec = Parse(yaml);
  const MapSource source = RandomWeights(spec);
  ASSERT_FALSE(source.values_.contains(
      absl::StrCat("layers.", spec.layers.size() - 1, ".weight")));
  const std::vector<int64_t> ids = RandomIds(kSeq, 3);
  const auto reference = ReferenceLogits(spec, source, ids);
  auto g = Generator::Create(CpuBackend::Get(), spec, source, kSeq);
  ASSERT_TRUE(g.ok()) << g.status();
  for (int64_t i = 0; i < kSeq; ++i) {
    auto logits = (*g)->Feed(std::span<const int64_t>(ids).subspan(i, 1));
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(LogitsMatch(*logits, reference[i])) << "position " << i;
  }
}

TEST(SampleTokenTest, GreedyTakesTheLowestIdAmongEqualMaxima) {
  std::mt19937_64 rng(0);
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(*SampleToken(logits, {.temperature = 0.0}, rng), 1);
  EXPECT_EQ(*SampleToken(logits, {.top_k = 1}, rng), 1);
  // Greedy draws nothing from the stream.
  std::mt19937_64 fresh(0);
  EXPECT_EQ(rng(), fresh());
}

TEST(SampleTokenTest, DrawsInProportionToTheSoftmax) {
  std::mt19937_64 rng(1);
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> logits;
  for (double x : p) logits.push_back(static_cast<float>(std::log(x)));
  std::vector<int> counts(p.size());
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) ++counts[*SampleToken(logits, {}, rng)];
  // Binomial standard deviation <= 0.0035; 0.02 is over 5 of them.
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), p[i], 0.02) << i;
  }
  // Temperature 2 flattens: softmax(log p / 2) is proportional to sqrt(p).
  std::fill(counts.begin(), counts.end(), 0);
  for (int i = 0; i < kDraws; ++i) {
    ++counts[*SampleToken(logits, {.temperature = 2.0}, rng)];
  }
  double norm = 0;
  for (double x : p) norm += std::sqrt(x);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(kDraws), std::sqrt(p[i]) / norm,
                0.02)
        << i;
  }
}

TEST(SampleTokenTest, TopKKeepsToTheKLargest) {
  std::mt19937_64 rng(2);
  // Token 1 and 3 are the two largest; token 4 ties token 3 but has the
  // higher id, so top 2 leaves it out.
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, 4.5f, 4.5f};
  std::vector<int> counts(logits.size());
  for (int i = 0; i < 2000; ++i) {
    ++counts[*SampleToken(logits, {.temperature = 1.0, .top_k = 2}, rng)];
  }
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  // A k past the vocabulary is all of it.
  EXPECT_TRUE(SampleToken(logits, {.top_k = 99}, rng).ok());
}

TEST(SampleTokenTest, RefusesBadOptionsAndLogits) {
  std::mt19937_64 rng(0);
  const std::vector<float> logits = {0.0f, 1.0f};
  for (double t :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<int64_t> r = SampleToken(logits, {.temperature = t}, rng);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_THAT(r.status().message(), HasSubstr("temperature"));
  }
  EXPECT_EQ(SampleToken(logits, {.top_k = -1}, rng).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleToken({}, {}, rng).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_EQ(SampleToken(nan, {}, rng).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

absl::Status CreateStatus(const std::string& yaml, int64_t max_tokens = 8) {
  const ModelSpec spec = Parse(yaml);
  const MapSource source = RandomWeights(spec);
  return Generator::Create(CpuBackend::Get(), spec, source, max_tokens)
      .status();
}

TEST(GeneratorCreateTest, RefusesATransformerBlockModel) {
  const absl::Status s = CreateStatus(
      "model:\n  input_shape: [8]\n  init: {seed: 1}\n"
      "  loss: cross_entropy\n  layers:\n"
      "    - embedding: {vocab_size: 11, features: 8}\n"
      "    - transformer_block: {heads: 2, mlp_features: 16, causal: true}\n"
      "    - rmsnorm\n    - lm_head: {vocab_size: 11}\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("transformer_block (layer 1)"));
  EXPECT_THAT(s.message(), HasSubstr("gen.yaml:7:"));
}

TEST(GeneratorCreateTest, RefusesLearnedPositions) {
  const absl::Status s = CreateStatus(LlamaYaml(false, ", max_positions: 12"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("embedding (layer 0)"));
  EXPECT_THAT(s.message(), HasSubstr("learned positions"));
}

TEST(GeneratorCreateTest, RefusesAnLmHeadWithBiasAndABadCacheSize) {
  std::string yaml = LlamaYaml(false);
  yaml.replace(yaml.rfind('}'), 1, ", bias: true}");
  const absl::Status s = CreateStatus(yaml);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lm_head (layer 4)"));
  EXPECT_EQ(CreateStatus(LlamaYaml(false), 0).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GeneratorCreateTest, PassesOnTheSourcesErrors) {
  const ModelSpec spec = Parse(LlamaYaml(true));
  MapSource source = RandomWeights(spec);
  source.values_.erase("layers.2.self_attn.k_proj.bias");
  const absl::Status s =
      Generator::Create(CpuBackend::Get(), spec, source, 8).status();
  EXPECT_THAT(s.message(), HasSubstr("layers.2.self_attn.k_proj.bias"));
}

TEST(GeneratorFeedTest, RefusesBadIdsAFullCacheAndBadOptions) {
  const ModelSpec spec = Parse(LlamaYaml(false));
  const MapSource source = RandomWeights(spec);
  std::unique_ptr<Generator> g =
      *Generator::Create(CpuBackend::Get(), spec, source, 4);
  for (std::vector<int64_t> bad :
       {std::vector<int64_t>{-1}, {2, kVocab}, std::vector<int64_t>{}}) {
    EXPECT_EQ(g->Feed(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(g->Feed(std::vector<int64_t>{1, 40}).status().message(),
              HasSubstr("token id 40 (at index 1) is outside the vocabulary"));
  EXPECT_EQ(g->position(), 0);
  ASSERT_TRUE(g->Feed(std::vector<int64_t>{1, 2, 3}).ok());
  const absl::Status full = g->Feed(std::vector<int64_t>{4, 5}).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(full.message(), HasSubstr("4 positions"));
  EXPECT_EQ(g->position(), 3);
  EXPECT_TRUE(g->Feed(std::vector<int64_t>{4}).ok());

  const std::vector<int64_t> prompt = {1, 2};
  // 2 prompt tokens + 3 new ones need 4 positions (the last is not fed).
  EXPECT_TRUE(g->Generate(prompt, 3, {}).ok());
  EXPECT_EQ(g->Generate(prompt, 4, {}).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(g->Generate(prompt, -1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Generate({}, 1, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Generate(prompt, 1, {.temperature = -0.5}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Generate(prompt, 1, {.top_k = -2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<int64_t>> none = g->Generate(prompt, 0, {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace conveyor::engine
