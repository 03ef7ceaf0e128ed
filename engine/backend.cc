#include "engine/backend.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<Tensor> Backend::Zeros(const Shape& shape, DType dtype) {
  ASSIGN_OR_RETURN(Tensor t, Empty(shape, dtype));
  if (t.bytes() > 0) {
    if (dtype == DType::kF32) {
      Fill(t, 0.0f);
    } else {
      // Only f32 has a fill kernel; other dtypes are zeroed through a host
      // copy, which is rare (token ids come from data, not from zeros).
      std::string zeros(t.bytes(), '\0');
      RETURN_IF_ERROR(CopyFromHost(zeros.data(), zeros.size(), t));
    }
  }
  return t;
}

namespace {

void CheckSameNumel(const Tensor& a, const Tensor& b, const char* what) {
  CONVEYOR_CHECK(a.numel() == b.numel(), what);
}

// Rows of a tensor viewed as [rows, its last dimension].
int64_t Rows(const Tensor& x) {
  return x.numel() / std::max<int64_t>(x.dim(-1), 1);
}

// `batch` row-major matrices `stride` apart, each `rows` rows `ld` apart of
// `cols` columns.
int64_t Extent(int64_t batch, int64_t stride, int64_t rows, int64_t cols,
               int64_t ld) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

}  // namespace

int64_t GemmExtentA(const GemmBatch& g) {
  return Extent(g.batch, g.stride_a, g.trans_a ? g.k : g.m,
                g.trans_a ? g.m : g.k, g.lda);
}

int64_t GemmExtentB(const GemmBatch& g) {
  return Extent(g.batch, g.stride_b, g.trans_b ? g.n : g.k,
                g.trans_b ? g.k : g.n, g.ldb);
}

absl::Status Backend::RecordEvent(void* /*event*/) {
  return absl::FailedPreconditionError(
      absl::StrCat(Name(), " has no streams to record an event on"));
}

absl::Status Backend::WaitForEvent(void* /*event*/) {
  return absl::FailedPreconditionError(
      absl::StrCat(Name(), " has no streams to wait for an event on"));
}

void Backend::Copy(const Tensor& src, const Tensor& dst) {
  CONVEYOR_CHECK(src.bytes() == dst.bytes() && src.dtype() == dst.dtype(),
                 "copy between different shapes or dtypes");
  DoCopy(src, dst);
}

void Backend::Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                   const Tensor& b, float beta, const Tensor& c) {
  // Host backends share their memory (the CPU backend's precisions);
  // device backends must own all three.
  CONVEYOR_CHECK(
      host_resident() ||
          (a.backend() == this && b.backend() == this && c.backend() == this),
      "gemm operands of another backend");
  const Tensor a2 = a.As2D(), b2 = b.As2D(), c2 = c.As2D();
  GemmBatch g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = trans_a ? a2.dim(1) : a2.dim(0);
  g.k = trans_a ? a2.dim(0) : a2.dim(1);
  g.n = trans_b ? b2.dim(0) : b2.dim(1);
  CONVEYOR_CHECK((trans_b ? b2.dim(1) : b2.dim(0)) == g.k,
                 "gemm inner dimensions differ");
  CONVEYOR_CHECK(c2.dim(0) == g.m && c2.dim(1) == g.n,
                 "gemm output has the wrong shape");
  g.alpha = alpha;
  g.beta = beta;
  CONVEYOR_CHECK((a2.dtype() == DType::kF32 || a2.dtype() == DType::kBF16) &&
                     (b2.dtype() == DType::kF32 || b2.dtype() == DType::kBF16),
                 "gemm operands must be F32 or BF16");
  if (a2.dtype() == DType::kBF16) {
    g.a_bf16 = static_cast<const uint16_t*>(a2.raw());
  } else {
    g.a = a2.data<float>();
  }
  g.lda = a2.dim(1);
  if (b2.dtype() == DType::kBF16) {
    g.b_bf16 = static_cast<const uint16_t*>(b2.raw());
  } else {
    g.b = b2.data<float>();
  }
  g.ldb = b2.dim(1);
  g.c = c2.data<float>();
  g.ldc = c2.dim(1);
  GemmStridedBatched(g);
}

void Backend::Axpy(float alpha, const Tensor& x, const Tensor& y) {
  CheckSameNumel(x, y, "axpy operands differ in size");
  DoAxpy(alpha, x, y);
}

void Backend::Add(const Tensor& a, const Tensor& b, const Tensor& out) {
  CheckSameNumel(a, b, "add operands differ in size");
  CheckSameNumel(a, out, "add output differs in size");
  DoAdd(a, b, out);
}

void Backend::AddRowBias(const Tensor& x, const Tensor& bias) {
  const int64_t cols = bias.numel();
  CONVEYOR_CHECK(cols > 0 && x.numel() % cols == 0,
                 "bias does not divide the rows");
  DoAddRowBias(x, bias);
}

void Backend::SumRows(const Tensor& x, float beta, const Tensor& out) {
  const int64_t cols = out.numel();
  CONVEYOR_CHECK(cols > 0 && x.numel() % cols == 0,
                 "sum-rows output does not divide the input");
  DoSumRows(x, beta, out);
}

void Backend::Relu(const Tensor& x, const Tensor& y) {
  CheckSameNumel(x, y, "relu output differs in size");
  DoRelu(x, y);
}

void Backend::ReluBackward(const Tensor& x, const Tensor& dy,
                           const Tensor& dx) {
  CheckSameNumel(x, dy, "relu gradient differs in size");
  CheckSameNumel(x, dx, "relu gradient differs in size");
  DoReluBackward(x, dy, dx);
}

void Backend::Gelu(const Tensor& x, bool tanh, const Tensor& y) {
  CheckSameNumel(x, y, "gelu output differs in size");
  DoGelu(x, tanh, y);
}

void Backend::GeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                           const Tensor& dx) {
  CheckSameNumel(x, dy, "gelu gradient differs in size");
  CheckSameNumel(x, dx, "gelu gradient differs in size");
  DoGeluBackward(x, tanh, dy, dx);
}

void Backend::LayerNorm(const Tensor& x, const Tensor& gamma,
                        const Tensor& beta, float eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd) {
  const int64_t cols = x.dim(-1), rows = Rows(x);
  CONVEYOR_CHECK(
      y.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
      "layernorm shapes disagree");
  CONVEYOR_CHECK(!gamma.defined() || gamma.numel() == cols,
                 "layernorm weight has the wrong size");
  CONVEYOR_CHECK(!beta.defined() || beta.numel() == cols,
                 "layernorm bias has the wrong size");
  DoLayerNorm(x, gamma, beta, eps, y, mean, rstd);
}

void Backend::LayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                     const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, const Tensor& dx) {
  const int64_t rows = Rows(x);
  CONVEYOR_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel(),
                 "layernorm gradient shapes disagree");
  CONVEYOR_CHECK(mean.numel() == rows && rstd.numel() == rows,
                 "layernorm statistics have the wrong size");
  CONVEYOR_CHECK(!gamma.defined() || gamma.numel() == x.dim(-1),
                 "layernorm weight has the wrong size");
  DoLayerNormBackwardInput(x, gamma, mean, rstd, dy, dx);
}

void Backend::LayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dy,
                                      const Tensor& dgamma,
                                      const Tensor& dbeta) {
  const int64_t cols = x.dim(-1), rows = Rows(x);
  CONVEYOR_CHECK(dgamma.numel() == cols && dbeta.numel() == cols,
                 "layernorm weight gradient shapes disagree");
  CONVEYOR_CHECK(
      dy.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
      "layernorm gradient shapes disagree");
  DoLayerNormBackwardWeight(x, mean, rstd, dy, dgamma, dbeta);
}

void Backend::RmsNorm(const Tensor& x, const Tensor& weight, float eps,
                      const Tensor& y, const Tensor& rstd) {
  CONVEYOR_CHECK(y.numel() == x.numel() && rstd.numel() == Rows(x),
                 "rmsnorm shapes disagree");
  CONVEYOR_CHECK(weight.numel() == x.dim(-1),
                 "rmsnorm weight has the wrong size");
  DoRmsNorm(x, weight, eps, y, rstd);
}

void Backend::RmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, const Tensor& dy,
                                   const Tensor& dx) {
  CONVEYOR_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() &&
                     rstd.numel() == Rows(x),
                 "rmsnorm gradient shapes disagree");
  CONVEYOR_CHECK(weight.numel() == x.dim(-1),
                 "rmsnorm weight has the wrong size");
  DoRmsNormBackwardInput(x, weight, rstd, dy, dx);
}

void Backend::RmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                                    const Tensor& dy, const Tensor& dweight) {
  CONVEYOR_CHECK(dy.numel() == x.numel() && rstd.numel() == Rows(x) &&
                     dweight.numel() == x.dim(-1),
                 "rmsnorm weight gradient shapes disagree");
  DoRmsNormBackwardWeight(x, rstd, dy, dweight);
}

void Backend::SiluMul(const Tensor& gate, const Tensor& up, const Tensor& y) {
  CheckSameNumel(gate, up, "silu-mul operands differ in size");
  CheckSameNumel(gate, y, "silu-mul output differs in size");
  DoSiluMul(gate, up, y);
}

void Backend::SiluMulBackward(const Tensor& gate, const Tensor& up,
                              const Tensor& dy, const Tensor& dgate,
                              const Tensor& dup) {
  CONVEYOR_CHECK(up.numel() == gate.numel() && dy.numel() == gate.numel() &&
                     dgate.numel() == gate.numel() &&
                     dup.numel() == gate.numel(),
                 "silu-mul gradient shapes disagree");
  DoSiluMulBackward(gate, up, dy, dgate, dup);
}

void Backend::Rope(const Tensor& x, const RopeFrequencies& freqs, bool inverse,
                   const Tensor& y, const Tensor& positions,
                   int64_t first_position) {
  CONVEYOR_CHECK(x.rank() >= 2 && x.dim(-1) % 2 == 0,
                 "rope takes [..., seq, head_dim] with an even head_dim");
  CheckSameNumel(x, y, "rope output differs in size");
  const Tensor& f = freqs.inv_freq;
  CONVEYOR_CHECK(
      f.defined() && f.dtype() == DType::kF32 && f.numel() == x.dim(-1) / 2,
      "rope takes head_dim / 2 f32 inverse frequencies");
  CONVEYOR_CHECK(host_resident() || f.backend() == this,
                 "rope frequencies of another backend");
  CONVEYOR_CHECK(std::isfinite(freqs.attention_factor),
                 "rope attention factor must be finite");
  if (positions.defined()) {
    const int64_t batch = x.rank() >= 3 ? x.dim(0) : 1;
    CONVEYOR_CHECK(positions.dtype() == DType::kI64 &&
                       positions.numel() == batch * x.dim(-2),
                   "rope positions must be i64 [batch, seq]");
    CONVEYOR_CHECK(host_resident() || positions.backend() == this,
                   "rope positions of another backend");
    CONVEYOR_CHECK(first_position == 0,
                   "rope takes positions or a first position, not both");
  } else {
    CONVEYOR_CHECK(first_position >= 0, "rope positions start at 0");
  }
  DoRope(x, freqs, inverse, y, positions, first_position);
}

void Backend::Softmax(const Tensor& x, float scale, bool causal,
                      const Tensor& y) {
  CheckSameNumel(x, y, "softmax output differs in size");
  DoSoftmax(x, scale, causal, y);
}

void Backend::SoftmaxInSpans(const Tensor& x, float scale, bool causal,
                             const Tensor& spans, const Tensor& y) {
  CheckSameNumel(x, y, "softmax output differs in size");
  CONVEYOR_CHECK(x.rank() >= 2 && x.dim(-1) == x.dim(-2),
                 "softmax in spans takes square [..., seq, seq] scores");
  CONVEYOR_CHECK(spans.dtype() == DType::kI64 && spans.rank() == 3 &&
                     spans.dim(1) == x.dim(-1) && spans.dim(2) == 2,
                 "softmax spans must be i64 [samples, seq, 2]");
  const int64_t matrices = x.numel() / (x.dim(-1) * x.dim(-2));
  CONVEYOR_CHECK(spans.dim(0) > 0 && matrices % spans.dim(0) == 0,
                 "softmax spans' samples must divide the score matrices");
  DoSoftmaxInSpans(x, scale, causal, spans, y);
}

void Backend::SoftmaxBackward(const Tensor& y, const Tensor& dy, float scale,
                              const Tensor& dx) {
  CONVEYOR_CHECK(dy.numel() == y.numel() && dx.numel() == y.numel(),
                 "softmax gradient shapes disagree");
  DoSoftmaxBackward(y, dy, scale, dx);
}

namespace {

// Attention's shapes, shared by the forward and the backward.
void CheckAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionMask& mask, const Tensor& out,
                    const Tensor& lse) {
  CONVEYOR_CHECK(q.rank() == 4 && k.rank() == 4 && v.shape() == k.shape() &&
                     out.shape() == q.shape(),
                 "attention takes q, out [B, H, S, D] and k, v [B, G, S, D]");
  CONVEYOR_CHECK(k.dim(0) == q.dim(0) && k.dim(2) == q.dim(2) &&
                     k.dim(3) == q.dim(3) && k.dim(1) > 0 &&
                     q.dim(1) % k.dim(1) == 0,
                 "attention's key/value heads must divide its query heads");
  CONVEYOR_CHECK(lse.dtype() == DType::kF32 &&
                     lse.shape() == Shape({q.dim(0), q.dim(1), q.dim(2)}),
                 "attention's lse must be f32 [B, H, S]");
  if (mask.spans.defined()) {
    CONVEYOR_CHECK(mask.spans.dtype() == DType::kI64 &&
                       mask.spans.shape() == Shape({q.dim(0), q.dim(2), 2}),
                   "attention spans must be i64 [B, S, 2]");
  }
}

}  // namespace

void Backend::Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                        float scale, const AttentionMask& mask,
                        const Tensor& out, const Tensor& lse) {
  CheckAttention(q, k, v, mask, out, lse);
  DoAttention(q, k, v, scale, mask, out, lse);
}

void Backend::AttentionBackward(const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out,
                                const Tensor& lse, const Tensor& dout,
                                float scale, const AttentionMask& mask,
                                const Tensor& dq, const Tensor& dk,
                                const Tensor& dv) {
  CheckAttention(q, k, v, mask, out, lse);
  CONVEYOR_CHECK(dout.shape() == q.shape() && dq.shape() == q.shape() &&
                     dk.shape() == k.shape() && dv.shape() == k.shape(),
                 "attention gradient shapes disagree");
  DoAttentionBackward(q, k, v, out, lse, dout, scale, mask, dq, dk, dv);
}

void Backend::SplitHeads(const Tensor& qkv, int64_t heads, const Tensor& q,
                         const Tensor& k, const Tensor& v) {
  CONVEYOR_CHECK(q.rank() == 4 && q.dim(1) == heads &&
                     qkv.numel() == 3 * q.numel() && k.numel() == q.numel() &&
                     v.numel() == q.numel(),
                 "split-heads shapes disagree");
  DoSplitHeads(qkv, heads, q, k, v);
}

void Backend::SplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                                 const Tensor& dv, int64_t heads,
                                 const Tensor& dqkv) {
  CONVEYOR_CHECK(dq.rank() == 4 && dq.dim(1) == heads &&
                     dqkv.numel() == 3 * dq.numel() &&
                     dk.numel() == dq.numel() && dv.numel() == dq.numel(),
                 "split-heads shapes disagree");
  DoSplitHeadsBackward(dq, dk, dv, heads, dqkv);
}

void Backend::MergeHeads(const Tensor& x, const Tensor& out) {
  CONVEYOR_CHECK(x.rank() == 4 && out.numel() == x.numel(),
                 "merge-heads shapes disagree");
  DoMergeHeads(x, out);
}

void Backend::MergeHeadsBackward(const Tensor& dout, const Tensor& dx) {
  CONVEYOR_CHECK(dx.rank() == 4 && dout.numel() == dx.numel(),
                 "merge-heads shapes disagree");
  DoMergeHeadsBackward(dout, dx);
}

absl::Status Backend::EmbeddingForward(const Tensor& ids, const Tensor& table,
                                       const Tensor& out) {
  CONVEYOR_CHECK(ids.dtype() == DType::kI64 && table.rank() == 2,
                 "embedding takes i64 ids and a [vocab, d] table");
  CONVEYOR_CHECK(out.numel() == ids.numel() * table.dim(1),
                 "embedding output has the wrong size");
  return DoEmbeddingForward(ids, table, out);
}

void Backend::EmbeddingBackward(const Tensor& ids, const Tensor& dy,
                                const Tensor& dtable) {
  CONVEYOR_CHECK(ids.dtype() == DType::kI64 && dtable.rank() == 2,
                 "embedding takes i64 ids and a [vocab, d] table");
  CONVEYOR_CHECK(dy.numel() == ids.numel() * dtable.dim(1),
                 "embedding gradient has the wrong size");
  DoEmbeddingBackward(ids, dy, dtable);
}

void Backend::CastToBf16(const Tensor& x, const Tensor& y) {
  CONVEYOR_CHECK(x.dtype() == DType::kF32 && y.dtype() == DType::kBF16,
                 "CastToBf16 takes F32 to BF16");
  CheckSameNumel(x, y, "cast operands differ in size");
  DoCastToBf16(x, y);
}

void Backend::CastFromBf16(const Tensor& x, const Tensor& y) {
  CONVEYOR_CHECK(x.dtype() == DType::kBF16 && y.dtype() == DType::kF32,
                 "CastFromBf16 takes BF16 to F32");
  CheckSameNumel(x, y, "cast operands differ in size");
  DoCastFromBf16(x, y);
}

absl::StatusOr<float> Backend::MseLoss(const Tensor& y, const Tensor& target,
                                       float grad_scale, const Tensor& dy) {
  if (y.numel() != target.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mse: output ", ShapeString(y.shape()), " and target ",
                     ShapeString(target.shape()), " differ in size"));
  }
  CheckSameNumel(y, dy, "mse gradient differs in size");
  return DoMseLoss(y, target, grad_scale, dy);
}

absl::StatusOr<float> Backend::CrossEntropyLoss(const Tensor& logits,
                                                const Tensor& targets,
                                                float grad_scale,
                                                const Tensor& dlogits) {
  const int64_t n = Rows(logits);
  if (targets.numel() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross_entropy: ", n, " rows of logits but ",
                     targets.numel(), " targets"));
  }
  CONVEYOR_CHECK(targets.dtype() == DType::kI64,
                 "cross-entropy targets must be i64");
  CheckSameNumel(logits, dlogits, "cross-entropy gradient differs in size");
  return DoCrossEntropyLoss(logits, targets, grad_scale, dlogits);
}

void Backend::SgdUpdate(const SgdParams& p, const Tensor& param,
                        const Tensor& grad, const Tensor& momentum) {
  CONVEYOR_CHECK(param.numel() == grad.numel(), "sgd shapes disagree");
  CONVEYOR_CHECK(p.momentum == 0.0f || momentum.numel() == param.numel(),
                 "sgd momentum buffer has the wrong size");
  DoSgdUpdate(p, param, grad, momentum);
}

void Backend::AdamUpdate(const AdamParams& p, const Tensor& param,
                         const Tensor& grad, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq) {
  CONVEYOR_CHECK(param.numel() == grad.numel() &&
                     exp_avg.numel() == param.numel() &&
                     exp_avg_sq.numel() == param.numel(),
                 "adam shapes disagree");
  DoAdamUpdate(p, param, grad, exp_avg, exp_avg_sq);
}

void Backend::AdamUpdateMany(const AdamParams& p, float grad_scale,
                             const std::vector<AdamSlot>& slots) {
  for (const AdamSlot& s : slots) {
    CONVEYOR_CHECK(s.param.numel() == s.grad.numel() &&
                       s.exp_avg.numel() == s.param.numel() &&
                       s.exp_avg_sq.numel() == s.param.numel(),
                   "adam shapes disagree");
  }
  DoAdamUpdateMany(p, grad_scale, slots);
}

void Backend::DoAdamUpdateMany(const AdamParams& p, float grad_scale,
                               const std::vector<AdamSlot>& slots) {
  for (const AdamSlot& s : slots) {
    if (grad_scale != 1.0f) Scale(s.grad, grad_scale);
    DoAdamUpdate(p, s.param, s.grad, s.exp_avg, s.exp_avg_sq);
  }
}

}  // namespace conveyor::engine
