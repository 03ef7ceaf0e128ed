#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/layer_kinds.h"
#include "engine/rope.h"

namespace conveyor::engine {
namespace {

constexpr char kLayout[] =
    "embedding (no learned positions), llama_block x N, rmsnorm, lm_head "
    "(no bias, the embedding's vocabulary)";

absl::Status NotLlama(const LayerSpec& layer, absl::string_view why) {
  return LayerError(layer, absl::StrCat("generation needs the Llama layout (",
                                        kLayout, "): ", why));
}

// The first layer that breaks the layout, or OK.
absl::Status CheckLayout(const ModelSpec& model) {
  const std::vector<LayerSpec>& layers = model.layers;
  const size_t n = layers.size();
  if (n < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", n, " layers; generation needs the Llama layout (",
        kLayout, ") with at least one llama_block"));
  }
  const LayerSpec& embed = layers[0];
  if (embed.kind != LayerKind::kEmbedding) {
    return NotLlama(embed, "the first layer must be an embedding");
  }
  if (embed.max_positions > 0) {
    return NotLlama(embed,
                    "learned positions (max_positions) are not part of it: "
                    "positions enter through the blocks' rotary embedding");
  }
  for (size_t i = 1; i + 2 < n; ++i) {
    if (layers[i].kind != LayerKind::kLlamaBlock) {
      return NotLlama(layers[i],
                      "every layer between the embedding and the final "
                      "rmsnorm must be a llama_block");
    }
  }
  if (layers[n - 2].kind != LayerKind::kRmsNorm) {
    return NotLlama(layers[n - 2], "the layer before lm_head must be rmsnorm");
  }
  const LayerSpec& head = layers[n - 1];
  if (head.kind != LayerKind::kLmHead || head.bias ||
      head.vocab_size != embed.vocab_size) {
    return NotLlama(head,
                    "the last layer must be an lm_head without bias over the "
                    "embedding's vocabulary");
  }
  return absl::OkStatus();
}

// A double uniform in [0, 1) from the top 53 bits of one draw: the same
// on every platform, unlike std::uniform_real_distribution.
double UnitDouble(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

}  // namespace

struct Generator::Block {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, mlp = 0;
  float eps = 1e-6f;
  // The rotary frequencies; for dynamic scaling they follow the length fed
  // so far, as HF's dynamic update does (the cached keys keep the rotation
  // they were stored with, as in HF).
  std::optional<RopeFrequencyCache> rope;
  bool bias = false;
  Tensor input_norm, q, q_bias, k, k_bias, v, v_bias, o, post_norm, gate, up,
      down;
  // [kv_heads, max_tokens, head_dim]: rotated keys, and values, by
  // position.
  Tensor k_cache, v_cache;
};

absl::Status ValidateSamplingOptions(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature must be a finite number >= 0; got ", o.temperature));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0 (0 = all tokens); got ", o.top_k));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SampleToken(std::span<const float> logits,
                                    const SamplingOptions& o,
                                    std::mt19937_64& rng) {
  RETURN_IF_ERROR(ValidateSamplingOptions(o));
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (vocab == 0) return absl::InvalidArgumentError("no logits to sample from");
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat("the model produced a non-finite logit (", logits[i],
                       " for token ", i, "); are its weights finite?"));
    }
  }
  if (o.temperature == 0.0 || o.top_k == 1) {
    // max_element keeps the first of equal maxima: the lowest id.
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  }
  const int64_t k = o.top_k == 0 ? vocab : std::min(o.top_k, vocab);
  std::vector<int64_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, the lower id first among equals: a total order, so the
  // candidates and their order are the same on every platform.
  std::partial_sort(
      ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) {
        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
      });
  const double top = logits[ids[0]];
  std::vector<double> weights(k);
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    // Subtracting the maximum first keeps exp in range for any temperature:
    // the largest weight is exactly 1.
    weights[i] = std::exp((logits[ids[i]] - top) / o.temperature);
    total += weights[i];
  }
  const double u = UnitDouble(rng) * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    cumulative += weights[i];
    if (u < cumulative) return ids[i];
  }
  return ids[k - 1];  // u within rounding of the total
}

Generator::Generator(Backend* backend, int64_t vocab, int64_t features,
                     int64_t max_tokens)
    : backend_(backend),
      vocab_(vocab),
      features_(features),
      max_tokens_(max_tokens) {}

Generator::~Generator() = default;

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(
    Backend* backend, const ModelSpec& model, const ParameterSource& params,
    int64_t max_tokens) {
  RETURN_IF_ERROR(CheckLayout(model));
  if (max_tokens < 1 || max_tokens > kMaxModelDimension) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be in [1, ",
                                                   kMaxModelDimension,
                                                   "]; got ", max_tokens));
  }
  const LayerSpec& embed = model.layers.front();
  const int64_t vocab = embed.vocab_size, d = embed.features;
  std::unique_ptr<Generator> g(new Generator(backend, vocab, d, max_tokens));
  Backend& be = *backend;
  auto load = [&](const LayerSpec& layer, absl::string_view name,
                  const Shape& shape) -> absl::StatusOr<Tensor> {
    const std::string full = absl::StrCat("layers.", layer.index, ".", name);
    ASSIGN_OR_RETURN(const std::vector<float> values, params.Read(full, shape));
    if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", full, " has ", values.size(),
                       " values; the model needs ", ShapeString(shape)));
    }
    ASSIGN_OR_RETURN(Tensor t, be.Empty(shape, DType::kF32));
    RETURN_IF_ERROR(be.CopyFromHost(values.data(), values.size() * 4, t));
    return t;
  };

  ASSIGN_OR_RETURN(g->embedding_, load(embed, "weight", {vocab, d}));
  const size_t n = model.layers.size();
  g->blocks_.resize(n - 3);
  for (size_t i = 1; i + 2 < n; ++i) {
    const LayerSpec& l = model.layers[i];
    Block& b = g->blocks_[i - 1];
    b.heads = l.heads;
    b.kv_heads = l.kv_heads;
    b.head_dim = l.head_dim;
    b.mlp = l.mlp_features;
    b.eps = static_cast<float>(l.eps);
    b.rope.emplace(l.rope_scaling, l.rope_theta, l.head_dim);
    b.bias = l.bias;
    const int64_t q = b.heads * b.head_dim, kv = b.kv_heads * b.head_dim,
                  m = b.mlp;
    ASSIGN_OR_RETURN(b.input_norm, load(l, "input_layernorm.weight", {d}));
    ASSIGN_OR_RETURN(b.q, load(l, "self_attn.q_proj.weight", {q, d}));
    ASSIGN_OR_RETURN(b.k, load(l, "self_attn.k_proj.weight", {kv, d}));
    ASSIGN_OR_RETURN(b.v, load(l, "self_attn.v_proj.weight", {kv, d}));
    if (b.bias) {
      ASSIGN_OR_RETURN(b.q_bias, load(l, "self_attn.q_proj.bias", {q}));
      ASSIGN_OR_RETURN(b.k_bias, load(l, "self_attn.k_proj.bias", {kv}));
      ASSIGN_OR_RETURN(b.v_bias, load(l, "self_attn.v_proj.bias", {kv}));
    }
    ASSIGN_OR_RETURN(b.o, load(l, "self_attn.o_proj.weight", {d, q}));
    ASSIGN_OR_RETURN(b.post_norm,
                     load(l, "post_attention_layernorm.weight", {d}));
    ASSIGN_OR_RETURN(b.gate, load(l, "mlp.gate_proj.weight", {m, d}));
    ASSIGN_OR_RETURN(b.up, load(l, "mlp.up_proj.weight", {m, d}));
    ASSIGN_OR_RETURN(b.down, load(l, "mlp.down_proj.weight", {d, m}));
    // Rows past position() are never read (the GEMMs stop at the last
    // position), so the caches need no clearing.
    const Shape cache = {b.kv_heads, max_tokens, b.head_dim};
    ASSIGN_OR_RETURN(b.k_cache, be.Empty(cache, DType::kF32));
    ASSIGN_OR_RETURN(b.v_cache, be.Empty(cache, DType::kF32));
  }
  const LayerSpec& norm = model.layers[n - 2];
  ASSIGN_OR_RETURN(g->final_norm_, load(norm, "weight", {d}));
  g->final_eps_ = static_cast<float>(norm.eps);
  const LayerSpec& head = model.layers[n - 1];
  if (head.tied) {
    g->lm_head_ = g->embedding_;  // One matrix, read by both.
  } else {
    ASSIGN_OR_RETURN(g->lm_head_, load(head, "weight", {vocab, d}));
  }
  return g;
}

absl::Status Generator::CheckIds(std::span<const int64_t> ids) const {
  if (ids.empty()) return absl::InvalidArgumentError("no token ids to feed");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", ids[i], " (at index ", i,
                       ") is outside the vocabulary [0, ", vocab_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Generator::Feed(
    std::span<const int64_t> ids) {
  RETURN_IF_ERROR(CheckIds(ids));
  const int64_t count = static_cast<int64_t>(ids.size());
  if (count > max_tokens_ - position_) {
    return absl::OutOfRangeError(absl::StrCat(
        "feeding ", count, " token(s) at position ", position_,
        " would pass the ", max_tokens_, " positions the cache holds"));
  }
  const int64_t start = position_;
  absl::StatusOr<Tensor> logits;
  if (start == 0) {
    logits = Step(ids);
  } else {
    // After the first chunk, one token at a time: the softmax kernel's
    // causal mask assumes a chunk's first row is position 0, and a lone row
    // needs no mask.
    for (const int64_t& id : ids) {
      logits = Step(std::span<const int64_t>(&id, 1));
      if (!logits.ok()) break;
    }
  }
  if (!logits.ok()) {
    position_ = start;  // What the failed call wrote is never read.
    return logits.status();
  }
  std::vector<float> host(vocab_);
  RETURN_IF_ERROR(backend_->CopyToHost(*logits, host.data(), host.size() * 4));
  return host;
}

absl::StatusOr<Tensor> Generator::Step(std::span<const int64_t> ids) {
  const int64_t s = static_cast<int64_t>(ids.size()), d = features_;
  CONVEYOR_CHECK(position_ == 0 || s == 1,
                 "a chunk after the first must be one token");
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor id_tensor, be.Empty({s}, DType::kI64));
  RETURN_IF_ERROR(be.CopyFromHost(ids.data(), ids.size() * 8, id_tensor));
  ASSIGN_OR_RETURN(Tensor x, be.Empty({s, d}, DType::kF32));
  RETURN_IF_ERROR(be.EmbeddingForward(id_tensor, embedding_, x));
  for (Block& block : blocks_) {
    RETURN_IF_ERROR(Attend(block, x));
    RETURN_IF_ERROR(Mlp(block, x));
  }
  position_ += s;
  // Only the last position's logits are wanted: norm and project one row.
  const Tensor last = x.Rows(s - 1, s);
  ASSIGN_OR_RETURN(Tensor normed, be.Empty({1, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor rstd, be.Empty({1}, DType::kF32));
  be.RmsNorm(last, final_norm_, final_eps_, normed, rstd);
  ASSIGN_OR_RETURN(Tensor logits, be.Empty({1, vocab_}, DType::kF32));
  be.Gemm(false, true, 1.0f, normed, lm_head_, 0.0f, logits);
  return logits;
}

absl::Status Generator::Attend(Block& b, const Tensor& x) {
  const int64_t s = x.dim(0), d = features_, p = position_, t = p + s,
                h = b.heads, g = b.kv_heads, hd = b.head_dim, r = h / g,
                cap = max_tokens_;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor normed, be.Empty({s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor rstd, be.Empty({s}, DType::kF32));
  be.RmsNorm(x, b.input_norm, b.eps, normed, rstd);
  // [s, heads * hd] -> [1, heads, s, hd], as the training layer does.
  auto project = [&](const Tensor& w, const Tensor& bias,
                     int64_t heads) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Tensor flat, be.Empty({1, s, heads * hd}, DType::kF32));
    be.Gemm(false, true, 1.0f, normed, w, 0.0f, flat);
    if (b.bias) be.AddRowBias(flat, bias);
    ASSIGN_OR_RETURN(Tensor split, be.Empty({1, heads, s, hd}, DType::kF32));
    be.MergeHeadsBackward(flat, split);
    return split;
  };
  ASSIGN_OR_RETURN(Tensor q, project(b.q, b.q_bias, h));
  ASSIGN_OR_RETURN(Tensor k, project(b.k, b.k_bias, g));
  ASSIGN_OR_RETURN(Tensor v, project(b.v, b.v_bias, g));
  ASSIGN_OR_RETURN(const RopeFrequencies freqs, b.rope->Get(be, t));
  be.Rope(q, freqs, /*inverse=*/false, q, Tensor(), /*first_position=*/p);
  be.Rope(k, freqs, /*inverse=*/false, k, Tensor(), /*first_position=*/p);
  // Append the new rows to each kv head's cache.
  const Tensor k_heads = k.Reshape({g, s, hd}), v_heads = v.Reshape({g, s, hd});
  for (int64_t j = 0; j < g; ++j) {
    auto rows = [&](const Tensor& cache) {
      return cache.Rows(j, j + 1).Reshape({cap, hd}).Rows(p, t);
    };
    be.Copy(k_heads.Rows(j, j + 1).Reshape({s, hd}), rows(b.k_cache));
    be.Copy(v_heads.Rows(j, j + 1).Reshape({s, hd}), rows(b.v_cache));
  }

  // One strided batch of GEMMs per product, over the kv_heads groups: query
  // head j belongs to group j / r, and a group's r query heads are
  // contiguous in [h, s, ...], so each group is one [r * s, ...] matrix
  // against its cached [t, hd] keys or values.
  // scores [h, s, t] = q k^T over positions 0 .. t-1.
  ASSIGN_OR_RETURN(Tensor scores, be.Empty({h, s, t}, DType::kF32));
  be.GemmStridedBatched({.batch = g,
                         .trans_b = true,
                         .m = r * s,
                         .n = t,
                         .k = hd,
                         .a = q.data<float>(),
                         .lda = hd,
                         .stride_a = r * s * hd,
                         .b = b.k_cache.data<float>(),
                         .ldb = hd,
                         .stride_b = cap * hd,
                         .c = scores.data<float>(),
                         .ldc = t,
                         .stride_c = r * s * t});
  // A chunk starts at position 0 (then s == t and the kernel's mask is the
  // causal one) or is one row, which sees every cached position.
  ASSIGN_OR_RETURN(Tensor probs, be.Empty({h, s, t}, DType::kF32));
  be.Softmax(scores, 1.0f / std::sqrt(static_cast<float>(hd)),
             /*causal=*/p == 0, probs);
  // context [h, s, hd] = probs v.
  ASSIGN_OR_RETURN(Tensor context, be.Empty({1, h, s, hd}, DType::kF32));
  be.GemmStridedBatched({.batch = g,
                         .m = r * s,
                         .n = hd,
                         .k = t,
                         .a = probs.data<float>(),
                         .lda = t,
                         .stride_a = r * s * t,
                         .b = b.v_cache.data<float>(),
                         .ldb = hd,
                         .stride_b = cap * hd,
                         .c = context.data<float>(),
                         .ldc = hd,
                         .stride_c = r * s * hd});
  ASSIGN_OR_RETURN(Tensor merged, be.Empty({1, s, h * hd}, DType::kF32));
  be.MergeHeads(context, merged);
  ASSIGN_OR_RETURN(Tensor out, be.Empty({s, d}, DType::kF32));
  be.Gemm(false, true, 1.0f, merged, b.o, 0.0f, out);
  be.Axpy(1.0f, out, x);
  return absl::OkStatus();
}

absl::Status Generator::Mlp(const Block& b, const Tensor& x) {
  const int64_t s = x.dim(0), d = features_;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor normed, be.Empty({s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor rstd, be.Empty({s}, DType::kF32));
  be.RmsNorm(x, b.post_norm, b.eps, normed, rstd);
  ASSIGN_OR_RETURN(Tensor gate, be.Empty({s, b.mlp}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor up, be.Empty({s, b.mlp}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor hidden, be.Empty({s, b.mlp}, DType::kF32));
  be.Gemm(false, true, 1.0f, normed, b.gate, 0.0f, gate);
  be.Gemm(false, true, 1.0f, normed, b.up, 0.0f, up);
  be.SiluMul(gate, up, hidden);
  ASSIGN_OR_RETURN(Tensor out, be.Empty({s, d}, DType::kF32));
  be.Gemm(false, true, 1.0f, hidden, b.down, 0.0f, out);
  be.Axpy(1.0f, out, x);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Generator::Generate(
    std::span<const int64_t> prompt, int64_t new_tokens,
    const SamplingOptions& options) {
  RETURN_IF_ERROR(ValidateSamplingOptions(options));
  if (new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the number of new tokens must be >= 0; got ", new_tokens));
  }
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        "the prompt is empty: generation starts from at least one token");
  }
  RETURN_IF_ERROR(CheckIds(prompt));
  // The last token drawn is returned, never fed.
  const int64_t needed = static_cast<int64_t>(prompt.size()) +
                         std::max<int64_t>(new_tokens - 1, 0);
  if (needed > max_tokens_) {
    return absl::OutOfRangeError(
        absl::StrCat("a prompt of ", prompt.size(), " tokens and ", new_tokens,
                     " new tokens need ", needed,
                     " positions; the cache holds ", max_tokens_));
  }
  Reset();
  std::vector<int64_t> out;
  if (new_tokens == 0) return out;
  out.reserve(static_cast<size_t>(new_tokens));
  std::mt19937_64 rng(options.seed);
  ASSIGN_OR_RETURN(std::vector<float> logits, Feed(prompt));
  for (int64_t i = 0; i < new_tokens; ++i) {
    ASSIGN_OR_RETURN(const int64_t id, SampleToken(logits, options, rng));
    out.push_back(id);
    if (i + 1 < new_tokens) {
      ASSIGN_OR_RETURN(logits, Feed(std::span<const int64_t>(&id, 1)));
    }
  }
  return out;
}

}  // namespace conveyor::engine
