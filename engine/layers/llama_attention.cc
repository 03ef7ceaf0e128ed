#include "engine/layers/llama_attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/documents.h"
#include "engine/layers/dense.h"
#include "engine/layers/head_gemm.h"

namespace conveyor::engine {
// Grouped-query attention as one strided batch of GEMMs per product
// (HeadGemm): with q [B, H, S, D] and k, v [B, G, S, D], the H / G query
// heads of group g are contiguous, so q's rows of one (batch, group) form
// one [H/G * S, D] matrix that multiplies that group's [S, D] key or value
// matrix; the batch runs over B * G.

absl::StatusOr<std::unique_ptr<LlamaAttention>> LlamaAttention::Create(
    Backend* backend, const std::string& prefix,
    const LlamaAttentionOptions& o) {
  if (o.heads < 1 ||
      (o.head_dim == 0 &&
       (o.features % o.heads != 0 || (o.features / o.heads) % 2 != 0)) ||
      o.head_dim < 0 || o.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama attention: features (", o.features, "), heads (", o.heads,
        ") and head_dim (", o.head_dim,
        ") must give an even head size (head_dim 0: features / heads)"));
  }
  if (o.kv_heads < 1 || o.heads % o.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama attention: kv_heads (", o.kv_heads,
                     ") must divide heads (", o.heads, ")"));
  }
  const int64_t head_dim = o.head_dim > 0 ? o.head_dim : o.features / o.heads;
  if (const auto problem =
          CheckRopeScaling(o.rope_scaling, o.rope_theta, head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama attention: rope ", problem->key, ": ", problem->message));
  }
  std::unique_ptr<LlamaAttention> a(new LlamaAttention(backend, o, head_dim));
  const int64_t d = o.features, q_width = o.heads * head_dim,
                kv_width = o.kv_heads * head_dim;
  ASSIGN_OR_RETURN(
      a->q_, MakeParameter(backend, prefix + "q_proj.weight", {q_width, d}));
  ASSIGN_OR_RETURN(
      a->k_, MakeParameter(backend, prefix + "k_proj.weight", {kv_width, d}));
  ASSIGN_OR_RETURN(
      a->v_, MakeParameter(backend, prefix + "v_proj.weight", {kv_width, d}));
  ASSIGN_OR_RETURN(
      a->out_, MakeParameter(backend, prefix + "o_proj.weight", {d, q_width}));
  if (o.bias) {
    ASSIGN_OR_RETURN(a->q_bias_,
                     MakeParameter(backend, prefix + "q_proj.bias", {q_width}));
    ASSIGN_OR_RETURN(
        a->k_bias_, MakeParameter(backend, prefix + "k_proj.bias", {kv_width}));
    ASSIGN_OR_RETURN(
        a->v_bias_, MakeParameter(backend, prefix + "v_proj.bias", {kv_width}));
  }
  return a;
}

std::vector<Parameter*> LlamaAttention::parameters() {
  if (o_.bias) {
    return {&q_, &q_bias_, &k_, &k_bias_, &v_, &v_bias_, &out_};
  }
  return {&q_, &k_, &v_, &out_};
}

// Stash: saved = {x, q, k, v, probs, merged} with q and k rotated and in
// heads layout; BI adds output_grads = {dq, dk, dv} in [B, S, width] layout.
absl::StatusOr<Tensor> LlamaAttention::Forward(const Tensor& x, Stash& stash) {
  CONVEYOR_CHECK(x.rank() == 3 && x.dim(2) == o_.features,
                 "llama attention takes [batch, seq, features]");
  const int64_t b = x.dim(0), s = x.dim(1), h = o_.heads, g = o_.kv_heads,
                d = head_dim_, r = h / g;
  Backend& be = *backend_;
  // Projections, then [B, S, heads * D] -> [B, heads, S, D] (the transpose
  // MergeHeadsBackward performs), then the rotation, in place.
  auto project = [&](const Parameter& w, const Parameter& bias,
                     int64_t heads) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Tensor flat, be.Empty({b, s, heads * d}, DType::kF32));
    be.Gemm(false, true, 1.0f, x, w.value, 0.0f, flat);
    if (o_.bias) be.AddRowBias(flat, bias.value);
    ASSIGN_OR_RETURN(Tensor split, be.Empty({b, heads, s, d}, DType::kF32));
    be.MergeHeadsBackward(flat, split);
    return split;
  };
  ASSIGN_OR_RETURN(Tensor q, project(q_, q_bias_, h));
  ASSIGN_OR_RETURN(Tensor k, project(k_, k_bias_, g));
  ASSIGN_OR_RETURN(Tensor v, project(v_, v_bias_, g));
  // Packed documents (engine/documents.h): positions restart at each one,
  // and attention stays within it.
  const DeviceDocuments* documents = CurrentDocuments();
  Tensor positions;
  if (documents != nullptr) {
    RETURN_IF_ERROR(CheckDocumentsFit(*documents, b, s, "llama_attention"));
    positions = documents->positions;
  }
  ASSIGN_OR_RETURN(const RopeFrequencies freqs, rope_.Get(be, s));
  be.Rope(q, freqs, /*inverse=*/false, q, positions);
  be.Rope(k, freqs, /*inverse=*/false, k, positions);

  ASSIGN_OR_RETURN(Tensor scores, be.Empty({b, h, s, s}, DType::kF32));
  be.GemmStridedBatched(
      HeadGemm(b * g, false, true, r * s, s, d, q, d, k, d, 0.0f, scores));
  ASSIGN_OR_RETURN(Tensor probs, be.Empty({b, h, s, s}, DType::kF32));
  RETURN_IF_ERROR(AttentionSoftmax(be, scores,
                                   1.0f / std::sqrt(static_cast<float>(d)),
                                   /*causal=*/true, probs, "llama_attention"));
  ASSIGN_OR_RETURN(Tensor context, be.Empty({b, h, s, d}, DType::kF32));
  be.GemmStridedBatched(HeadGemm(b * g, false, false, r * s, d, s, probs, s, v,
                                 d, 0.0f, context));
  ASSIGN_OR_RETURN(Tensor merged, be.Empty({b, s, h * d}, DType::kF32));
  be.MergeHeads(context, merged);
  ASSIGN_OR_RETURN(Tensor y, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, true, 1.0f, merged, out_.value, 0.0f, y);
  // positions last: undefined without documents; BI turns the gradients
  // back by the same positions.
  stash.saved = {x, q, k, v, probs, merged, positions};
  return y;
}

absl::StatusOr<Tensor> LlamaAttention::BackwardInput(const Tensor& dy,
                                                     Stash& stash,
                                                     bool need_dx) {
  const Tensor &x = stash.saved[0], &q = stash.saved[1], &k = stash.saved[2],
               &v = stash.saved[3], &probs = stash.saved[4];
  const int64_t b = x.dim(0), s = x.dim(1), h = o_.heads, g = o_.kv_heads,
                d = head_dim_, r = h / g;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor d_merged, be.Empty({b, s, h * d}, DType::kF32));
  be.Gemm(false, false, 1.0f, dy, out_.value, 0.0f, d_merged);
  ASSIGN_OR_RETURN(Tensor d_context, be.Empty({b, h, s, d}, DType::kF32));
  be.MergeHeadsBackward(d_merged, d_context);
  ASSIGN_OR_RETURN(Tensor d_probs, be.Empty({b, h, s, s}, DType::kF32));
  be.GemmStridedBatched(HeadGemm(b * g, false, true, r * s, s, d, d_context, d,
                                 v, d, 0.0f, d_probs));
  // A key or value head's gradient sums over its group's query heads: the
  // contraction over the group's r * S rows does that in the same GEMM.
  ASSIGN_OR_RETURN(Tensor dv, be.Empty({b, g, s, d}, DType::kF32));
  be.GemmStridedBatched(HeadGemm(b * g, true, false, s, d, r * s, probs, s,
                                 d_context, d, 0.0f, dv));
  ASSIGN_OR_RETURN(Tensor d_scores, be.Empty({b, h, s, s}, DType::kF32));
  be.SoftmaxBackward(probs, d_probs, 1.0f / std::sqrt(static_cast<float>(d)),
                     d_scores);
  ASSIGN_OR_RETURN(Tensor dq, be.Empty({b, h, s, d}, DType::kF32));
  be.GemmStridedBatched(
      HeadGemm(b * g, false, false, r * s, d, s, d_scores, s, k, d, 0.0f, dq));
  ASSIGN_OR_RETURN(Tensor dk, be.Empty({b, g, s, d}, DType::kF32));
  be.GemmStridedBatched(
      HeadGemm(b * g, true, false, s, d, r * s, d_scores, s, q, d, 0.0f, dk));
  // The rotation's transpose, then back to [B, S, heads * D].
  ASSIGN_OR_RETURN(const RopeFrequencies freqs, rope_.Get(be, s));
  const Tensor& positions = stash.saved[6];
  be.Rope(dq, freqs, /*inverse=*/true, dq, positions);
  be.Rope(dk, freqs, /*inverse=*/true, dk, positions);
  ASSIGN_OR_RETURN(Tensor dq_flat, be.Empty({b, s, h * d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dk_flat, be.Empty({b, s, g * d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dv_flat, be.Empty({b, s, g * d}, DType::kF32));
  be.MergeHeads(dq, dq_flat);
  be.MergeHeads(dk, dk_flat);
  be.MergeHeads(dv, dv_flat);
  stash.output_grads = {dq_flat, dk_flat, dv_flat};
  if (!need_dx) return Tensor();
  ASSIGN_OR_RETURN(Tensor dx, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, false, 1.0f, dq_flat, q_.value, 0.0f, dx);
  be.Gemm(false, false, 1.0f, dk_flat, k_.value, 1.0f, dx);
  be.Gemm(false, false, 1.0f, dv_flat, v_.value, 1.0f, dx);
  return dx;
}

void LlamaAttention::ReleaseForWeightBackward(Stash& stash) {
  // BW reads x, merged and the projections' gradients; q, k, v and the
  // probabilities (heads x seq x seq per sample) were for BI only.
  for (size_t i = 1; i <= 4 && i < stash.saved.size(); ++i) {
    stash.saved[i] = Tensor();
  }
}

absl::Status LlamaAttention::BackwardWeight(const Tensor& dy, Stash& stash) {
  const Tensor &x = stash.saved[0], &merged = stash.saved[5];
  Backend& be = *backend_;
  be.Gemm(true, false, 1.0f, dy, merged, 1.0f, out_.grad);
  Parameter* weights[] = {&q_, &k_, &v_};
  Parameter* biases[] = {&q_bias_, &k_bias_, &v_bias_};
  for (int i = 0; i < 3; ++i) {
    const Tensor& grad = stash.output_grads[i];
    be.Gemm(true, false, 1.0f, grad, x, 1.0f, weights[i]->grad);
    if (o_.bias) be.SumRows(grad, 1.0f, biases[i]->grad);
  }
  return absl::OkStatus();
}

}  // namespace conveyor::engine
