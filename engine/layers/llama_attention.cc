#include "engine/layers/llama_attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/documents.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {
// Grouped-query attention through Backend::Attention: q [B, H, S, D] and
// k, v [B, G, S, D]; the fused kernel reads each query head's key/value head
// in place, so keys and values are never repeated per query head.

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

// Stash: saved = {x, q, k, v, context, merged, positions, lse, spans} with
// q and k rotated and in heads layout; BI adds output_grads = {dq, dk, dv} in
// [B, S, width] layout.
absl::StatusOr<Tensor> LlamaAttention::Forward(const Tensor& x, Stash& stash) {
  CONVEYOR_CHECK(x.rank() == 3 && x.dim(2) == o_.features,
                 "llama attention takes [batch, seq, features]");
  const int64_t b = x.dim(0), s = x.dim(1), h = o_.heads, g = o_.kv_heads,
                d = head_dim_;
  Backend& be = *backend_;
  // Projections, then [B, S, heads * D] -> [B, heads, S, D] (the transpose
  // MergeHeadsBackward performs), then the rotation, in place.
  auto project = [&](const Parameter& w, const Parameter& bias,
                     int64_t heads) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Tensor flat, be.Empty({b, s, heads * d}, DType::kF32));
    be.Gemm(false, true, 1.0f, x, w.gemm_value(), 0.0f, flat);
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

  ASSIGN_OR_RETURN(
      const AttentionMask mask,
      CurrentAttentionMask(/*causal=*/true, b, s, "llama_attention"));
  ASSIGN_OR_RETURN(Tensor context, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor lse, be.Empty({b, h, s}, DType::kF32));
  be.Attention(q, k, v, 1.0f / std::sqrt(static_cast<float>(d)), mask, context,
               lse);
  ASSIGN_OR_RETURN(Tensor merged, be.Empty({b, s, h * d}, DType::kF32));
  be.MergeHeads(context, merged);
  ASSIGN_OR_RETURN(Tensor y, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, true, 1.0f, merged, out_.gemm_value(), 0.0f, y);
  // positions and spans undefined without documents; BI turns the
  // gradients back by the same positions, under the same mask (documents
  // are current only in Forward).
  stash.saved = {x, q, k, v, context, merged, positions, lse, mask.spans};
  return y;
}

absl::StatusOr<Tensor> LlamaAttention::BackwardInput(const Tensor& dy,
                                                     Stash& stash,
                                                     bool need_dx) {
  const Tensor &x = stash.saved[0], &q = stash.saved[1], &k = stash.saved[2],
               &v = stash.saved[3], &context = stash.saved[4],
               &lse = stash.saved[7];
  const int64_t b = x.dim(0), s = x.dim(1), h = o_.heads, g = o_.kv_heads,
                d = head_dim_;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor d_merged, be.Empty({b, s, h * d}, DType::kF32));
  be.Gemm(false, false, 1.0f, dy, out_.gemm_value(), 0.0f, d_merged);
  ASSIGN_OR_RETURN(Tensor d_context, be.Empty({b, h, s, d}, DType::kF32));
  be.MergeHeadsBackward(d_merged, d_context);
  // A key or value head's gradient sums over its group's query heads.
  ASSIGN_OR_RETURN(Tensor dq, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dk, be.Empty({b, g, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dv, be.Empty({b, g, s, d}, DType::kF32));
  const AttentionMask mask{.causal = true, .spans = stash.saved[8]};
  be.AttentionBackward(q, k, v, context, lse, d_context,
                       1.0f / std::sqrt(static_cast<float>(d)), mask, dq, dk,
                       dv);
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
  be.Gemm(false, false, 1.0f, dq_flat, q_.gemm_value(), 0.0f, dx);
  be.Gemm(false, false, 1.0f, dk_flat, k_.gemm_value(), 1.0f, dx);
  be.Gemm(false, false, 1.0f, dv_flat, v_.gemm_value(), 1.0f, dx);
  return dx;
}

void LlamaAttention::ReleaseForWeightBackward(Stash& stash) {
  // BW reads x, merged and the projections' gradients; the rest was for BI
  // only.
  for (size_t i = 1; i < stash.saved.size(); ++i) {
    if (i != 5) stash.saved[i] = Tensor();
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
