#include "engine/layers/attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/documents.h"
#include "engine/layers/dense.h"

namespace conveyor::engine {

absl::StatusOr<std::unique_ptr<SelfAttention>> SelfAttention::Create(
    Backend* backend, const std::string& prefix, int64_t features,
    int64_t heads, int64_t qkv_features, bool causal, bool bias,
    bool out_bias) {
  if (heads < 1 || qkv_features % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention: qkv features (", qkv_features,
                     ") must be a multiple of heads (", heads, ")"));
  }
  std::unique_ptr<SelfAttention> a(new SelfAttention(
      backend, features, heads, qkv_features, causal, bias, out_bias));
  ASSIGN_OR_RETURN(a->in_weight_,
                   MakeParameter(backend, prefix + "in_proj_weight",
                                 {3 * qkv_features, features}));
  ASSIGN_OR_RETURN(a->out_weight_,
                   MakeParameter(backend, prefix + "out_proj.weight",
                                 {features, qkv_features}));
  if (bias) {
    ASSIGN_OR_RETURN(
        a->in_bias_,
        MakeParameter(backend, prefix + "in_proj_bias", {3 * qkv_features}));
  }
  if (a->out_bias_on_) {
    ASSIGN_OR_RETURN(
        a->out_bias_,
        MakeParameter(backend, prefix + "out_proj.bias", {features}));
  }
  return a;
}

std::vector<Parameter*> SelfAttention::parameters() {
  if (out_bias_on_) return {&in_weight_, &in_bias_, &out_weight_, &out_bias_};
  if (bias_) return {&in_weight_, &in_bias_, &out_weight_};
  return {&in_weight_, &out_weight_};
}

absl::StatusOr<Tensor> SelfAttention::Forward(const Tensor& x, Stash& stash) {
  CONVEYOR_CHECK(x.rank() == 3 && x.dim(2) == features_,
                 "attention takes [batch, seq, features]");
  const int64_t b = x.dim(0), s = x.dim(1), h = heads_,
                d = qkv_features_ / heads_;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor qkv,
                   be.Empty({b, s, 3 * qkv_features_}, DType::kF32));
  be.Gemm(false, true, 1.0f, x, in_weight_.gemm_value(), 0.0f, qkv);
  if (bias_) be.AddRowBias(qkv, in_bias_.value);
  ASSIGN_OR_RETURN(Tensor q, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor k, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor v, be.Empty({b, h, s, d}, DType::kF32));
  be.SplitHeads(qkv, h, q, k, v);
  ASSIGN_OR_RETURN(const AttentionMask mask,
                   CurrentAttentionMask(causal_, b, s, "attention"));
  ASSIGN_OR_RETURN(Tensor context, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor lse, be.Empty({b, h, s}, DType::kF32));
  be.Attention(q, k, v, 1.0f / std::sqrt(static_cast<float>(d)), mask, context,
               lse);
  ASSIGN_OR_RETURN(Tensor merged, be.Empty({b, s, qkv_features_}, DType::kF32));
  be.MergeHeads(context, merged);
  ASSIGN_OR_RETURN(Tensor y, be.Empty({b, s, features_}, DType::kF32));
  be.Gemm(false, true, 1.0f, merged, out_weight_.gemm_value(), 0.0f, y);
  if (out_bias_on_) be.AddRowBias(y, out_bias_.value);
  // The spans last (undefined without documents): the backward's mask, as
  // the documents are current only in Forward.
  stash.saved = {x, q, k, v, context, merged, lse, mask.spans};
  return y;
}

absl::StatusOr<Tensor> SelfAttention::BackwardInput(const Tensor& dy,
                                                    Stash& stash,
                                                    bool need_dx) {
  const Tensor &x = stash.saved[0], &q = stash.saved[1], &k = stash.saved[2],
               &v = stash.saved[3], &context = stash.saved[4],
               &lse = stash.saved[6];
  const int64_t b = x.dim(0), s = x.dim(1), h = heads_,
                d = qkv_features_ / heads_;
  Backend& be = *backend_;
  ASSIGN_OR_RETURN(Tensor d_merged,
                   be.Empty({b, s, qkv_features_}, DType::kF32));
  be.Gemm(false, false, 1.0f, dy, out_weight_.gemm_value(), 0.0f, d_merged);
  ASSIGN_OR_RETURN(Tensor d_context, be.Empty({b, h, s, d}, DType::kF32));
  be.MergeHeadsBackward(d_merged, d_context);
  const AttentionMask mask{.causal = causal_, .spans = stash.saved[7]};
  ASSIGN_OR_RETURN(Tensor dq, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dk, be.Empty({b, h, s, d}, DType::kF32));
  ASSIGN_OR_RETURN(Tensor dv, be.Empty({b, h, s, d}, DType::kF32));
  be.AttentionBackward(q, k, v, context, lse, d_context,
                       1.0f / std::sqrt(static_cast<float>(d)), mask, dq, dk,
                       dv);
  ASSIGN_OR_RETURN(Tensor d_qkv,
                   be.Empty({b, s, 3 * qkv_features_}, DType::kF32));
  be.SplitHeadsBackward(dq, dk, dv, h, d_qkv);
  stash.output_grads = {d_qkv};
  if (!need_dx) return Tensor();
  ASSIGN_OR_RETURN(Tensor dx, be.Empty(x.shape(), DType::kF32));
  be.Gemm(false, false, 1.0f, d_qkv, in_weight_.gemm_value(), 0.0f, dx);
  return dx;
}

void SelfAttention::ReleaseForWeightBackward(Stash& stash) {
  // BW reads x, merged and d_qkv; q, k, v, the context and its row
  // statistics were for BI only.
  for (size_t i = 1; i < stash.saved.size(); ++i) {
    if (i != 5) stash.saved[i] = Tensor();
  }
}

absl::Status SelfAttention::BackwardWeight(const Tensor& dy, Stash& stash) {
  const Tensor& x = stash.saved[0];
  const Tensor& merged = stash.saved[5];
  const Tensor& d_qkv = stash.output_grads[0];
  backend_->Gemm(true, false, 1.0f, dy, merged, 1.0f, out_weight_.grad);
  backend_->Gemm(true, false, 1.0f, d_qkv, x, 1.0f, in_weight_.grad);
  if (out_bias_on_) backend_->SumRows(dy, 1.0f, out_bias_.grad);
  if (bias_) backend_->SumRows(d_qkv, 1.0f, in_bias_.grad);
  return absl::OkStatus();
}

}  // namespace conveyor::engine
