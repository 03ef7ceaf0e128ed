// The CUDA backend's kernel fronts: for each Backend operation, the sizes
// and scratch memory its launcher (engine/cuda/internal/kernels.h) needs,
// and for the operations that hand a value to the host (losses, sums, the
// embedding's id check) the wait for it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/internal/cuda_backend_impl.h"  // defines: Scratch, Ptr
#include "engine/cuda/internal/kernels.h"  // defines: the kernel launchers

namespace conveyor::engine {

namespace ci = cuda_internal;

// --- Elementwise -------------------------------------------------------------

void CudaBackend::Fill(const Tensor& x, float value) {
  Activate();
  ci::Fill(F(x), x.numel(), value, stream());
}

void CudaBackend::Scale(const Tensor& x, float alpha) {
  Activate();
  ci::Scale(F(x), x.numel(), alpha, stream());
}

void CudaBackend::DoAxpy(float alpha, const Tensor& x, const Tensor& y) {
  Activate();
  ci::Axpy(alpha, F(x), F(y), x.numel(), stream());
}

void CudaBackend::DoAdd(const Tensor& a, const Tensor& b, const Tensor& out) {
  Activate();
  ci::Add(F(a), F(b), F(out), a.numel(), stream());
}

void CudaBackend::DoAddRowBias(const Tensor& x, const Tensor& bias) {
  const int64_t cols = bias.numel();
  Activate();
  ci::AddRowBias(F(x), F(bias), x.numel() / cols, cols, stream());
}

void CudaBackend::DoSumRows(const Tensor& x, float beta, const Tensor& out) {
  const int64_t cols = out.numel();
  const int64_t rows = x.numel() / cols;
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 1);
  Scratch scratch = floats > 0
                        ? ScratchOrDefer(floats * sizeof(float), "SumRows")
                        : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::SumRows(F(x), rows, cols, beta, F(out), scratch.as<float>(), stream());
}

void CudaBackend::DoRelu(const Tensor& x, const Tensor& y) {
  Activate();
  ci::Relu(F(x), F(y), x.numel(), stream());
}

void CudaBackend::DoReluBackward(const Tensor& x, const Tensor& dy,
                                 const Tensor& dx) {
  Activate();
  ci::ReluBackward(F(x), F(dy), F(dx), x.numel(), stream());
}

void CudaBackend::DoGelu(const Tensor& x, bool tanh, const Tensor& y) {
  Activate();
  ci::Gelu(F(x), tanh, F(y), x.numel(), stream());
}

void CudaBackend::DoGeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                                 const Tensor& dx) {
  Activate();
  ci::GeluBackward(F(x), tanh, F(dy), F(dx), x.numel(), stream());
}

// --- Layer normalization -----------------------------------------------------

void CudaBackend::DoLayerNorm(const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, float eps, const Tensor& y,
                              const Tensor& mean, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::LayerNorm(F(x), gamma.defined() ? F(gamma) : nullptr,
                beta.defined() ? F(beta) : nullptr, eps, rows, cols, F(y),
                F(mean), F(rstd), stream());
}

void CudaBackend::DoLayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                           const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy,
                                           const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::LayerNormBackwardInput(F(x), gamma.defined() ? F(gamma) : nullptr,
                             F(mean), F(rstd), F(dy), rows, cols, F(dx),
                             stream());
}

void CudaBackend::DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                            const Tensor& rstd,
                                            const Tensor& dy,
                                            const Tensor& dgamma,
                                            const Tensor& dbeta) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 2);
  Scratch scratch = floats > 0 ? ScratchOrDefer(floats * sizeof(float),
                                                "LayerNormBackwardWeight")
                               : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::LayerNormBackwardWeight(F(x), F(mean), F(rstd), F(dy), rows, cols,
                              F(dgamma), F(dbeta), scratch.as<float>(),
                              stream());
}

// --- Llama-family pieces -----------------------------------------------------

void CudaBackend::DoRmsNorm(const Tensor& x, const Tensor& weight, float eps,
                            const Tensor& y, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::RmsNorm(F(x), F(weight), eps, rows, cols, F(y), F(rstd), stream());
}

void CudaBackend::DoRmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                                         const Tensor& rstd, const Tensor& dy,
                                         const Tensor& dx) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::RmsNormBackwardInput(F(x), F(weight), F(rstd), F(dy), rows, cols, F(dx),
                           stream());
}

void CudaBackend::DoRmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                                          const Tensor& dy,
                                          const Tensor& dweight) {
  const int64_t cols = x.dim(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  const int64_t floats = ci::ColumnSumScratchFloats(rows, cols, 1);
  Scratch scratch = floats > 0 ? ScratchOrDefer(floats * sizeof(float),
                                                "RmsNormBackwardWeight")
                               : Scratch();
  if (floats > 0 && !scratch.ok()) return;
  ci::RmsNormBackwardWeight(F(x), F(rstd), F(dy), rows, cols, F(dweight),
                            scratch.as<float>(), stream());
}

void CudaBackend::DoSiluMul(const Tensor& gate, const Tensor& up,
                            const Tensor& y) {
  Activate();
  ci::SiluMul(F(gate), F(up), F(y), gate.numel(), stream());
}

void CudaBackend::DoSiluMulBackward(const Tensor& gate, const Tensor& up,
                                    const Tensor& dy, const Tensor& dgate,
                                    const Tensor& dup) {
  Activate();
  ci::SiluMulBackward(F(gate), F(up), F(dy), F(dgate), F(dup), gate.numel(),
                      stream());
}

void CudaBackend::DoRope(const Tensor& x, const RopeFrequencies& freqs,
                         bool inverse, const Tensor& y, const Tensor& positions,
                         int64_t first_position) {
  const int64_t dim = x.dim(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(dim, 1);
  const int64_t batch = x.rank() >= 3 ? x.dim(0) : 1;
  if (rows == 0 || batch == 0) return;
  Activate();
  ci::Rope(
      {.x = F(x),
       .y = F(y),
       .rows = rows,
       .seq = x.dim(-2),
       .dim = dim,
       .rows_per_batch = rows / batch,
       .inv_freq = F(freqs.inv_freq),
       .attention_factor = freqs.attention_factor,
       .positions = positions.defined() ? Ptr<int64_t>(positions) : nullptr,
       .first_position = first_position,
       .inverse = inverse},
      stream());
}

// --- Attention pieces --------------------------------------------------------

void CudaBackend::DoSoftmax(const Tensor& x, float scale, bool causal,
                            const Tensor& y) {
  const int64_t cols = x.dim(-1);
  const int64_t rows_per = x.rank() >= 2 ? x.dim(-2) : 1;
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::Softmax(F(x), scale, causal, rows, std::max<int64_t>(rows_per, 1), cols,
              F(y), /*lse=*/nullptr, stream());
}

void CudaBackend::DoSoftmaxInSpans(const Tensor& x, float scale, bool causal,
                                   const Tensor& spans, const Tensor& y) {
  const int64_t seq = x.dim(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(seq, 1);
  Activate();
  ci::SoftmaxInSpans(F(x), scale, causal, rows, seq, Ptr<int64_t>(spans),
                     rows / seq / spans.dim(0), F(y), /*lse=*/nullptr,
                     stream());
}

void CudaBackend::DoSoftmaxBackward(const Tensor& y, const Tensor& dy,
                                    float scale, const Tensor& dx) {
  const int64_t cols = y.dim(-1), rows = y.numel() / std::max<int64_t>(cols, 1);
  Activate();
  ci::SoftmaxBackward(F(y), F(dy), scale, rows, cols, F(dx), stream());
}

namespace {

ci::AttentionArgs AttentionSizes(const Tensor& q, const Tensor& k, float scale,
                                 const AttentionMask& mask, bool bf16) {
  return {.batch = q.dim(0),
          .heads = q.dim(1),
          .groups = k.dim(1),
          .seq = q.dim(2),
          .dim = q.dim(3),
          .scale = scale,
          .causal = mask.causal,
          .spans = mask.spans.defined() ? mask.spans.data<int64_t>() : nullptr,
          .bf16 = bf16};
}

}  // namespace

bool CudaBackend::AttentionFits(const Tensor& q, absl::string_view what) {
  if (q.dim(3) <= ci::kMaxHeadDim) return true;
  if (deferred_error_.ok()) {
    deferred_error_ = absl::UnimplementedError(absl::StrCat(
        name_, ": ", what, " skipped: head_dim ", q.dim(3),
        " is above the fused attention kernel's ", ci::kMaxHeadDim));
  }
  return false;
}

bool CudaBackend::MaterializesAttention(const Tensor& q) const {
  using Kind = CudaBackendOptions::AttentionKernel;
  if (options_.attention != Kind::kAuto) {
    return options_.attention == Kind::kMaterialize;
  }
  // Two [B, H, S, S] f32 buffers (the backward's scores and their
  // gradients), counted in double: no overflow for any shape.
  const double bytes = 2.0 * 4.0 * static_cast<double>(q.dim(0)) *
                       static_cast<double>(q.dim(1)) *
                       static_cast<double>(q.dim(2)) *
                       static_cast<double>(q.dim(2));
  return bytes <= static_cast<double>(options_.attention_materialize_bytes);
}

namespace {

// One strided batch over (sample, key/value head): the query heads of a
// group are contiguous, so a group's r query heads are one [r * S, ...]
// matrix (engine/layers/head_gemm.h's layout, on raw pointers).
GemmBatch GroupGemm(int64_t groups, bool trans_a, bool trans_b, int64_t m,
                    int64_t n, int64_t k, const float* a, int64_t lda,
                    int64_t stride_a, const float* b, int64_t ldb,
                    int64_t stride_b, float* c, int64_t ldc, int64_t stride_c) {
  return {.batch = groups,
          .trans_a = trans_a,
          .trans_b = trans_b,
          .m = m,
          .n = n,
          .k = k,
          .a = a,
          .lda = lda,
          .stride_a = stride_a,
          .b = b,
          .ldb = ldb,
          .stride_b = stride_b,
          .c = c,
          .ldc = ldc,
          .stride_c = stride_c};
}

// B, H, G, S, D of an attention call, and the query heads per group.
struct AttentionShape {
  int64_t b, h, g, s, d, r;
};
AttentionShape ShapeOf(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), k.dim(1),
          q.dim(2), q.dim(3), q.dim(1) / k.dim(1)};
}

}  // namespace

void CudaBackend::AttentionProbabilities(const Tensor& q, const Tensor& k,
                                         float scale, const AttentionMask& mask,
                                         float* p, float* lse) {
  const auto [b, h, g, s, d, r] = ShapeOf(q, k);
  GemmStridedBatched(GroupGemm(b * g, false, true, r * s, s, d, F(q), d,
                               r * s * d, F(k), d, s * d, p, s, r * s * s));
  if (mask.spans.defined()) {
    ci::SoftmaxInSpans(p, scale, mask.causal, b * h * s, s,
                       Ptr<int64_t>(mask.spans), h, p, lse, stream());
  } else {
    ci::Softmax(p, scale, mask.causal, b * h * s, s, s, p, lse, stream());
  }
}

// The probabilities into a [B, H, S, S] scratch, then out = probs v.
void CudaBackend::MaterializedAttention(const Tensor& q, const Tensor& k,
                                        const Tensor& v, float scale,
                                        const AttentionMask& mask,
                                        const Tensor& out, const Tensor& lse) {
  const auto [b, h, g, s, d, r] = ShapeOf(q, k);
  Scratch probs =
      ScratchOrDefer(b * h * s * s * sizeof(float), "Attention scores");
  if (!probs.ok()) return;
  float* p = probs.as<float>();
  AttentionProbabilities(q, k, scale, mask, p, F(lse));
  GemmStridedBatched(GroupGemm(b * g, false, false, r * s, d, s, p, s,
                               r * s * s, F(v), d, s * d, F(out), d,
                               r * s * d));
}

void CudaBackend::MaterializedAttentionBackward(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
    float scale, const AttentionMask& mask, const Tensor& dq, const Tensor& dk,
    const Tensor& dv) {
  const auto [b, h, g, s, d, r] = ShapeOf(q, k);
  const size_t bytes = b * h * s * s * sizeof(float);
  Scratch probs = ScratchOrDefer(bytes, "AttentionBackward scores");
  Scratch grads = ScratchOrDefer(bytes, "AttentionBackward score gradients");
  if (!probs.ok() || !grads.ok()) return;
  float* p = probs.as<float>();
  float* dp = grads.as<float>();
  // The forward's probabilities again (the same kernels: the same bits).
  AttentionProbabilities(q, k, scale, mask, p, /*lse=*/nullptr);
  GemmStridedBatched(GroupGemm(b * g, false, true, r * s, s, d, F(dout), d,
                               r * s * d, F(v), d, s * d, dp, s, r * s * s));
  // A key or value head's gradient sums over its group's query heads: the
  // contraction over the group's r * S rows does that in the same GEMM.
  GemmStridedBatched(GroupGemm(b * g, true, false, s, d, r * s, p, s, r * s * s,
                               F(dout), d, r * s * d, F(dv), d, s * d));
  ci::SoftmaxBackward(p, dp, scale, b * h * s, s, dp, stream());
  GemmStridedBatched(GroupGemm(b * g, false, false, r * s, d, s, dp, s,
                               r * s * s, F(k), d, s * d, F(dq), d, r * s * d));
  GemmStridedBatched(GroupGemm(b * g, true, false, s, d, r * s, dp, s,
                               r * s * s, F(q), d, r * s * d, F(dk), d, s * d));
}

void CudaBackend::DoAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                              float scale, const AttentionMask& mask,
                              const Tensor& out, const Tensor& lse) {
  if (mask.spans.defined()) Ptr<int64_t>(mask.spans);  // Checks the backend.
  Activate();
  if (MaterializesAttention(q)) {
    MaterializedAttention(q, k, v, scale, mask, out, lse);
    return;
  }
  if (!AttentionFits(q, "Attention")) return;
  ci::AttentionForward(AttentionSizes(q, k, scale, mask, bf16()), F(q), F(k),
                       F(v), F(out), F(lse), stream());
}

void CudaBackend::DoAttentionBackward(const Tensor& q, const Tensor& k,
                                      const Tensor& v, const Tensor& out,
                                      const Tensor& lse, const Tensor& dout,
                                      float scale, const AttentionMask& mask,
                                      const Tensor& dq, const Tensor& dk,
                                      const Tensor& dv) {
  if (mask.spans.defined()) Ptr<int64_t>(mask.spans);
  Activate();
  if (MaterializesAttention(q)) {
    MaterializedAttentionBackward(q, k, v, dout, scale, mask, dq, dk, dv);
    return;
  }
  if (!AttentionFits(q, "AttentionBackward")) return;
  Scratch delta =
      ScratchOrDefer(lse.numel() * sizeof(float), "AttentionBackward");
  if (!delta.ok()) return;
  ci::AttentionBackward(AttentionSizes(q, k, scale, mask, bf16()), F(q), F(k),
                        F(v), F(out), F(lse), F(dout), F(dq), F(dk), F(dv),
                        delta.as<float>(), stream());
}

void CudaBackend::DoSplitHeads(const Tensor& qkv, int64_t heads,
                               const Tensor& q, const Tensor& k,
                               const Tensor& v) {
  Activate();
  ci::PermuteQkv(F(qkv), q.dim(0), q.dim(2), heads, q.dim(3), F(q), F(k), F(v),
                 /*to_heads=*/true, stream());
}

void CudaBackend::DoSplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                                       const Tensor& dv, int64_t heads,
                                       const Tensor& dqkv) {
  Activate();
  ci::PermuteQkv(F(dqkv), dq.dim(0), dq.dim(2), heads, dq.dim(3), F(dq), F(dk),
                 F(dv), /*to_heads=*/false, stream());
}

void CudaBackend::DoMergeHeads(const Tensor& x, const Tensor& out) {
  Activate();
  ci::PermuteMerge(F(x), x.dim(0), x.dim(1), x.dim(2), x.dim(3), F(out),
                   /*to_merged=*/true, stream());
}

void CudaBackend::DoMergeHeadsBackward(const Tensor& dout, const Tensor& dx) {
  Activate();
  ci::PermuteMerge(F(dx), dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3), F(dout),
                   /*to_merged=*/false, stream());
}

// --- Embedding ---------------------------------------------------------------

absl::Status CudaBackend::DoEmbeddingForward(const Tensor& ids,
                                             const Tensor& table,
                                             const Tensor& out) {
  const int64_t n = ids.numel(), vocab = table.dim(0), d = table.dim(1);
  if (n == 0) return absl::OkStatus();
  Activate();
  ci::ResetScalars(scalars_.get(), stream());
  ci::EmbeddingForward(Ptr<int64_t>(ids), n, F(table), vocab, d, F(out),
                       scalars_.get(), stream());
  // The status depends on the ids, which only the device has read.
  RETURN_IF_ERROR(FetchScalars("embedding"));
  if (host_scalars_->first_bad != ci::kNoBadPosition) {
    const auto i = static_cast<int64_t>(host_scalars_->first_bad);
    ASSIGN_OR_RETURN(int64_t id, FetchId(ids, i));
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " at position ", i,
                     " is outside the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

void CudaBackend::DoEmbeddingBackward(const Tensor& ids, const Tensor& dy,
                                      const Tensor& dtable) {
  const int64_t n = ids.numel(), vocab = dtable.dim(0), d = dtable.dim(1);
  if (n == 0 || d == 0) return;
  Activate();
  const size_t bytes = ci::EmbeddingBackwardScratchBytes(n, vocab);
  Scratch scratch = ScratchOrDefer(bytes, "EmbeddingBackward");
  if (!scratch.ok()) return;
  ci::EmbeddingBackward(Ptr<int64_t>(ids), n, F(dy), vocab, d, F(dtable),
                        scratch.as<void>(), bytes, stream());
}

// --- Storage casts -----------------------------------------------------------

void CudaBackend::DoCastToBf16(const Tensor& x, const Tensor& y) {
  Activate();
  ci::ToBf16(F(x), static_cast<uint16_t*>(y.raw()), x.numel(), stream());
}

void CudaBackend::DoCastFromBf16(const Tensor& x, const Tensor& y) {
  Activate();
  ci::FromBf16(static_cast<const uint16_t*>(x.raw()), F(y), x.numel(),
               stream());
}

// --- Losses ------------------------------------------------------------------

absl::StatusOr<float> CudaBackend::DoMseLoss(const Tensor& y,
                                             const Tensor& target,
                                             float grad_scale,
                                             const Tensor& dy) {
  const int64_t n = y.numel();
  if (n == 0) return 0.0f;
  Activate();
  const float g = grad_scale * 2.0f / static_cast<float>(n);
  ci::MseLoss(F(y), F(target), n, g, F(dy), partials_.get(), scalars_.get(),
              stream());
  RETURN_IF_ERROR(FetchScalars("mse"));
  return static_cast<float>(host_scalars_->sum / static_cast<double>(n));
}

absl::StatusOr<float> CudaBackend::DoCrossEntropyLoss(const Tensor& logits,
                                                      const Tensor& targets,
                                                      float grad_scale,
                                                      const Tensor& dlogits) {
  const int64_t vocab = logits.dim(-1);
  const int64_t n = logits.numel() / std::max<int64_t>(vocab, 1);
  if (n == 0) return 0.0f;
  Activate();
  ASSIGN_OR_RETURN(void* row_loss, allocator_->Allocate(n * sizeof(double)));
  const Scratch scratch(allocator_.get(), row_loss);
  ci::ResetScalars(scalars_.get(), stream());
  ci::CrossEntropyLoss(F(logits), Ptr<int64_t>(targets), n, vocab, grad_scale,
                       F(dlogits), scratch.as<double>(), partials_.get(),
                       scalars_.get(), stream());
  RETURN_IF_ERROR(FetchScalars("cross_entropy"));
  if (host_scalars_->first_bad != ci::kNoBadPosition) {
    const auto i = static_cast<int64_t>(host_scalars_->first_bad);
    ASSIGN_OR_RETURN(int64_t target, FetchId(targets, i));
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: target ", target, " at position ", i,
                     " is outside [0, ", vocab, ")"));
  }
  // The mean over the rows not ignored (engine/loss_kind.h); 0 for none.
  const auto counted = static_cast<double>(host_scalars_->counted);
  return counted > 0 ? static_cast<float>(host_scalars_->sum / counted) : 0.0f;
}

// --- Optimizers --------------------------------------------------------------

void CudaBackend::DoSgdUpdate(const SgdParams& p, const Tensor& param,
                              const Tensor& grad, const Tensor& momentum) {
  Activate();
  ci::SgdUpdate(p, F(param), F(grad),
                p.momentum != 0.0f ? F(momentum) : nullptr, param.numel(),
                stream());
}

namespace {

// Adam's bias corrections in double on the host, exactly as the CPU
// backend: the step size and sqrt(1 - beta2^t).
std::pair<float, float> AdamCorrections(const AdamParams& p) {
  const double bias1 = 1.0 - std::pow(static_cast<double>(p.beta1), p.step);
  const double bias2 = 1.0 - std::pow(static_cast<double>(p.beta2), p.step);
  return {static_cast<float>(p.lr / bias1),
          static_cast<float>(std::sqrt(bias2))};
}

}  // namespace

void CudaBackend::DoAdamUpdate(const AdamParams& p, const Tensor& param,
                               const Tensor& grad, const Tensor& exp_avg,
                               const Tensor& exp_avg_sq) {
  const auto [step_size, bias2_sqrt] = AdamCorrections(p);
  Activate();
  ci::AdamUpdate(p, step_size, bias2_sqrt, F(param), F(grad), F(exp_avg),
                 F(exp_avg_sq), param.numel(), stream());
}

void CudaBackend::DoAdamUpdateMany(const AdamParams& p, float grad_scale,
                                   const std::vector<AdamSlot>& slots) {
  const auto [step_size, bias2_sqrt] = AdamCorrections(p);
  Activate();
  ci::AdamTensorList list;
  auto launch = [&] {
    ci::AdamUpdateMany(p, step_size, bias2_sqrt, grad_scale, list, stream());
    list.count = 0;
  };
  for (const AdamSlot& s : slots) {
    list.param[list.count] = F(s.param);
    list.grad[list.count] = F(s.grad);
    list.exp_avg[list.count] = F(s.exp_avg);
    list.exp_avg_sq[list.count] = F(s.exp_avg_sq);
    list.numel[list.count] = s.param.numel();
    if (++list.count == ci::kAdamTensors) launch();
  }
  if (list.count > 0) launch();
}

absl::StatusOr<double> CudaBackend::SumSquares(const Tensor& x) {
  const int64_t n = x.numel();
  const float* p = F(x);
  if (n == 0) return 0.0;
  Activate();
  ci::SumSquares(p, n, partials_.get(), scalars_.get(), stream());
  RETURN_IF_ERROR(FetchScalars("sum of squares"));
  return host_scalars_->sum;
}

}  // namespace conveyor::engine
