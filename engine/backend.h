// Backend: the device behind tensors. Allocation, copies, and every kernel the
// layers, losses and optimizers need, so layers are written once for CPU and
// CUDA alike.
//
// Execution model (what a CUDA backend implements with one compute stream):
// kernels are enqueued in call order and may run asynchronously; results are
// visible to later kernels on the same backend at once, and to the host only
// after Synchronize(). Calls returning host values (losses, SumSquares)
// synchronize themselves. Cross-stream ordering (compute vs communication)
// goes through RecordEvent and WaitForEvent on native events, so that the
// NCCL channel needs no concrete backend.
//
// Kernel arguments are f32 unless stated; shapes are the caller's contract:
// a mismatch is a bug in a layer and aborts (CONVEYOR_CHECK), while failures
// with outside causes (out of memory, bad token ids from data) return Status.
// Outputs named `out`/`y`/`dx` are overwritten; gradients of parameters are
// accumulated (+=), because a step accumulates over microbatches.
//
// Thread-compatible: one thread drives a backend at a time.
#ifndef CONVEYOR_ENGINE_BACKEND_H_
#define CONVEYOR_ENGINE_BACKEND_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tensor.h"

namespace conveyor::engine {

// One strided batch of GEMMs over raw f32 device pointers, row-major:
// for i in [0, batch): C_i = alpha * op(A_i) op(B_i) + beta * C_i, with
// op(A_i) [m, k], op(B_i) [k, n], C_i [m, n], X_i = x + i * stride_x.
struct GemmBatch {
  int64_t batch = 1;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  // An operand already in bf16 (its bits; `a` or `b` is then null), such
  // as a parameter's bf16 copy: used as it is instead of rounded.
  const uint16_t* a_bf16 = nullptr;
  const uint16_t* b_bf16 = nullptr;
  float* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
};

// The elements operand A (or B) of `g` spans from its pointer, strides and
// padding included: what a backend that copies or converts the operands
// (bf16 GEMMs) must cover. 0 for an empty batch or matrix.
int64_t GemmExtentA(const GemmBatch& g);
int64_t GemmExtentB(const GemmBatch& g);

// The memory a backend's tensors hold, in bytes: what a step line reports
// as the device's memory (peak allocated and reserved, and the share of the
// device).
struct MemoryStats {
  uint64_t allocated = 0;       // Held by live tensors now.
  uint64_t peak_allocated = 0;  // The most held since ResetPeakMemory.
  // Taken from the system: with a caching allocator, blocks in use and
  // cached; on the CPU, the same as allocated.
  uint64_t reserved = 0;
  uint64_t peak_reserved = 0;
  uint64_t capacity = 0;  // The device's memory (host RAM on the CPU).
};

struct AdamParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // AdamW
  int64_t step = 1;                     // 1-based, for bias correction
};

// What Rope turns pairs by, held on the backend (engine/rope.h computes it
// on the host for each of HF's rope_scaling types).
struct RopeFrequencies {
  // F32 [head_dim / 2]: HF's inv_freq.
  Tensor inv_freq;
  // Scales cos and sin: HF's attention_scaling (1 except for yarn).
  float attention_factor = 1.0f;
};

// One parameter's tensors for Backend::AdamUpdateMany.
struct AdamSlot {
  Tensor param, grad, exp_avg, exp_avg_sq;
};

struct SgdParams {
  float lr = 1e-2f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  bool first_step = true;  // torch: the momentum buffer starts as the grad
};

// The mask fused attention applies, as Softmax and SoftmaxInSpans do.
struct AttentionMask {
  // Query q sees no key after q.
  bool causal = false;
  // I64 [samples, seq, 2] (engine/documents.h): query q of sample b sees only
  // keys in [spans[b, q, 0], spans[b, q, 1]). Undefined: no document mask.
  Tensor spans = {};
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual absl::string_view Name() const = 0;
  // Whether this backend's tensors live in host memory that any thread of
  // the process may read once the backend's calls have returned (the CPU
  // backend): the channels send and receive them in place instead of
  // staging them, and the worker checks their sizes against host memory.
  virtual bool host_resident() const = 0;
  // The device's dense peak FLOP/s for this backend's GEMMs at its
  // precision (engine/device_peak.h), the MFU's denominator; 0 when
  // unknown, as on the CPU, whose sustained rate depends on cores, clocks
  // and BLAS far more than on any table (workers take --peak-tflops).
  virtual double peak_flops() const { return 0; }

  // --- Memory -------------------------------------------------------------
  // The device's tensor memory; zeros where a backend does not count it.
  // Thread-safe, unlike the rest of the interface (a worker's metrics read
  // it while the job thread computes).
  virtual MemoryStats memory_stats() const { return {}; }
  // Starts a new peak at the current figures (a worker does so at each
  // step, so each step reports its own). Thread-safe.
  virtual void ResetPeakMemory() {}
  // Uninitialized memory. ResourceExhausted when the device is out of memory.
  virtual absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype) = 0;
  absl::StatusOr<Tensor> Zeros(const Shape& shape, DType dtype = DType::kF32);
  // Uninitialized host memory to stage this backend's tensors through (the
  // TCP channel's send and receive buffers): a tensor of the CPU backend,
  // page-locked on CUDA so CopyToHost and CopyFromHost run at full DMA
  // speed. Thread-safe, unlike the rest of the interface: the TCP channel's
  // I/O thread allocates with it.
  virtual absl::StatusOr<Tensor> EmptyHostStaging(const Shape& shape,
                                                  DType dtype) = 0;
  // Called by Buffer when the last tensor using it goes.
  virtual void FreeBuffer(void* data, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(const void* src, size_t bytes,
                                    const Tensor& dst) = 0;
  virtual absl::Status CopyToHost(const Tensor& src, void* dst,
                                  size_t bytes) = 0;
  // dst = src (same shape and dtype, this backend).
  void Copy(const Tensor& src, const Tensor& dst);
  virtual absl::Status Synchronize() = 0;

  // --- Ordering against other streams -------------------------------------
  // For channels that move this backend's tensors on streams of their own
  // (NCCL), without naming the backend's type: native handles, as
  // std::thread::native_handle. Host backends have no device, no stream
  // and no events: their work is done when their calls return.
  // The device ordinal; -1 for host memory.
  virtual int device_ordinal() const { return -1; }
  // The compute stream (a cudaStream_t); nullptr on a host backend.
  virtual void* native_stream() const { return nullptr; }
  // Records `event` (a native event of this backend's kind, a cudaEvent_t)
  // on the compute stream after everything enqueued so far, for another
  // stream to wait on. FailedPrecondition on a host backend; kInternal if
  // the event is invalid or the context broken.
  virtual absl::Status RecordEvent(void* event);
  // Makes compute work enqueued after this call wait for `event`, recorded
  // on another stream, without blocking the host. As RecordEvent.
  virtual absl::Status WaitForEvent(void* event);

  // The kernels below are non-virtual fronts: each checks its shapes once
  // for every backend (the checks abort: a mismatch is a bug in a layer),
  // then calls the backend's Do* implementation.

  // --- Linear algebra -----------------------------------------------------
  // c = alpha * op(a) op(b) + beta * c, each viewed as 2-D (Tensor::As2D),
  // through GemmStridedBatched.
  // An operand may be BF16 (a parameter's gemm_value), which its values
  // already are after a bf16 GEMM's rounding; c is F32.
  void Gemm(bool trans_a, bool trans_b, float alpha, const Tensor& a,
            const Tensor& b, float beta, const Tensor& c);
  // Whether GEMMs round their inputs to bf16 (training.precision: bf16):
  // then parameters keep bf16 copies for them (Parameter::value_bf16).
  virtual bool bf16_gemms() const { return false; }
  virtual void GemmStridedBatched(const GemmBatch& batch) = 0;

  // --- Elementwise ----------------------------------------------------------
  virtual void Fill(const Tensor& x, float value) = 0;
  virtual void Scale(const Tensor& x, float alpha) = 0;      // x *= a
  void Axpy(float alpha, const Tensor& x, const Tensor& y);  // y += a x
  void Add(const Tensor& a, const Tensor& b, const Tensor& out);
  // x[r, :] += bias for every row r of x viewed as [rows, bias.numel()].
  void AddRowBias(const Tensor& x, const Tensor& bias);
  // out = beta * out + sum over the rows of x viewed as [rows, out.numel()].
  void SumRows(const Tensor& x, float beta, const Tensor& out);
  void Relu(const Tensor& x, const Tensor& y);
  void ReluBackward(const Tensor& x, const Tensor& dy, const Tensor& dx);
  // GELU, exact (erf) or with the tanh approximation, as torch.nn.GELU.
  void Gelu(const Tensor& x, bool tanh, const Tensor& y);
  void GeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                    const Tensor& dx);

  // --- Layer normalization over the last dimension --------------------------
  // y = (x - mean) * rstd * gamma + beta; mean and rstd have one entry per
  // row and are kept for backward. gamma and beta may be undefined (no
  // affine); LayerNormBackwardWeight then has nothing to compute and must not
  // be called.
  void LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                 float eps, const Tensor& y, const Tensor& mean,
                 const Tensor& rstd);
  void LayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                              const Tensor& mean, const Tensor& rstd,
                              const Tensor& dy, const Tensor& dx);
  // dgamma += sum(dy * xhat), dbeta += sum(dy) over rows.
  void LayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dy,
                               const Tensor& dgamma, const Tensor& dbeta);

  // --- Llama-family pieces (HF's LlamaRMSNorm, LlamaMLP, rotary embedding) ---
  // RMS normalization over the last dimension: y = x * rstd * weight with
  // rstd = 1 / sqrt(mean(x^2) + eps), one entry per row, kept for backward.
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps,
               const Tensor& y, const Tensor& rstd);
  void RmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                            const Tensor& rstd, const Tensor& dy,
                            const Tensor& dx);
  // dweight += sum over rows of dy * x * rstd.
  void RmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                             const Tensor& dy, const Tensor& dweight);
  // The SwiGLU gate, elementwise: y = silu(gate) * up, silu(g) = g *
  // sigmoid(g).
  void SiluMul(const Tensor& gate, const Tensor& up, const Tensor& y);
  // dgate = dy * up * silu'(gate), dup = dy * silu(gate).
  void SiluMulBackward(const Tensor& gate, const Tensor& up, const Tensor& dy,
                       const Tensor& dgate, const Tensor& dup);
  // Rotary position embedding with HF's rotate_half convention on x viewed as
  // [batch, ..., seq, head_dim] (head_dim even; rank 2 is one batch of
  // [seq, head_dim]): for i < head_dim / 2 the pair (x[i], x[i + head_dim/2])
  // at position p turns by the angle p * freqs.inv_freq[i] (float(p) times
  // the float, as HF's float32 matmul), with cos and sin both scaled by
  // freqs.attention_factor. The position of (b, s) is positions[b, s] when
  // `positions` is defined (I64 [batch, seq], shared by the dimensions
  // between, such as heads: positions restart in packed documents), else
  // first_position + s (a decoder's KV cache feeds one new position at a
  // time); first_position must be 0 with positions. `inverse` applies the
  // transpose, the backward (the inverse when attention_factor is 1). y may
  // alias x.
  void Rope(const Tensor& x, const RopeFrequencies& freqs, bool inverse,
            const Tensor& y, const Tensor& positions = Tensor(),
            int64_t first_position = 0);

  // --- Attention pieces ------------------------------------------------------
  // Row softmax of scale * x over the last dimension of x viewed as [batch,
  // rows, cols]; with `causal`, entry (r, c) is masked when c > r.
  void Softmax(const Tensor& x, float scale, bool causal, const Tensor& y);
  // dx = scale * y * (dy - sum(dy * y)) per row.
  void SoftmaxBackward(const Tensor& y, const Tensor& dy, float scale,
                       const Tensor& dx);
  // Softmax within documents: x viewed as [batch, seq, seq] (query, key)
  // with batch = samples * heads, and spans I64 [samples, seq, 2]
  // (engine/documents.h) giving each query's document as a key range
  // [first, end): query q of sample b sees keys in its range only and, with
  // `causal`, none after q. Masked entries are exactly 0, so
  // SoftmaxBackward needs no mask.
  void SoftmaxInSpans(const Tensor& x, float scale, bool causal,
                      const Tensor& spans, const Tensor& y);
  // Fused scaled-dot-product attention, which never holds a [seq, seq]
  // matrix (the materializing GEMM + Softmax + GEMM path stays the tests'
  // reference): out = softmax(scale * q k^T, masked) v per head, with q and
  // out [B, H, S, D] and k, v [B, G, S, D], G dividing H (query head h reads
  // key/value head h / (H / G): grouped-query attention). lse F32 [B, H, S]
  // is each row's log-sum-exp of its scaled, unmasked scores, from which the
  // backward recomputes the probabilities. A row whose mask leaves no key
  // gets zeros and lse -inf. Results per (sample, head) do not depend on B,
  // H or the thread count, so replicas and tensor-parallel ranks stay equal
  // to one whole stage.
  void Attention(const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                 const AttentionMask& mask, const Tensor& out,
                 const Tensor& lse);
  // The gradients of Attention: dq [B, H, S, D], dk and dv [B, G, S, D]
  // (overwritten) from dout, with the forward's inputs, out and lse.
  void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse,
                         const Tensor& dout, float scale,
                         const AttentionMask& mask, const Tensor& dq,
                         const Tensor& dk, const Tensor& dv);
  // qkv [B, S, 3, H, D] -> q, k, v each [B, H, S, D] (torch's in_proj order).
  void SplitHeads(const Tensor& qkv, int64_t heads, const Tensor& q,
                  const Tensor& k, const Tensor& v);
  void SplitHeadsBackward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                          int64_t heads, const Tensor& dqkv);
  // x [B, H, S, D] -> out [B, S, H*D], and back.
  void MergeHeads(const Tensor& x, const Tensor& out);
  void MergeHeadsBackward(const Tensor& dout, const Tensor& dx);

  // --- Embedding ------------------------------------------------------------
  // out[i, :] = table[ids[i], :]; ids is I64. InvalidArgument for an id
  // outside [0, vocab) (it comes from data).
  absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table,
                                const Tensor& out);
  // dtable[ids[i], :] += dy[i, :].
  void EmbeddingBackward(const Tensor& ids, const Tensor& dy,
                         const Tensor& dtable);

  // --- Storage casts ---------------------------------------------------------
  // y (BF16) = x (F32) rounded to the nearest bfloat16, ties to even, bit
  // for bit engine::RoundToBf16 (NaN stays a quiet NaN, past the largest
  // finite value is infinity). y (F32) = x (BF16), exactly. Same element
  // count; the dtypes are checked.
  void CastToBf16(const Tensor& x, const Tensor& y);
  void CastFromBf16(const Tensor& x, const Tensor& y);

  // --- Losses: the mean loss, and its gradient times grad_scale -------------
  // mean((y - t)^2) over all elements; dy = grad_scale * 2 (y - t) / n.
  // InvalidArgument when y and the target differ in size (data).
  absl::StatusOr<float> MseLoss(const Tensor& y, const Tensor& target,
                                float grad_scale, const Tensor& dy);
  // Mean over rows of -log softmax(logits)[target]; logits [n, V], targets
  // I64 [n]. A target of kIgnoredTarget (engine/loss_kind.h) leaves its row
  // out: a zero gradient row, and the mean and grad_scale / count run over
  // the other rows (loss 0 when none is left). InvalidArgument for another
  // target outside [0, V) or a count of targets other than n.
  absl::StatusOr<float> CrossEntropyLoss(const Tensor& logits,
                                         const Tensor& targets,
                                         float grad_scale,
                                         const Tensor& dlogits);

  // --- Optimizers (torch.optim semantics) ------------------------------------
  void SgdUpdate(const SgdParams& p, const Tensor& param, const Tensor& grad,
                 const Tensor& momentum);
  void AdamUpdate(const AdamParams& p, const Tensor& param, const Tensor& grad,
                  const Tensor& exp_avg, const Tensor& exp_avg_sq);
  // AdamUpdate on every slot, each gradient first multiplied by grad_scale
  // (clipping's coefficient; 1: none) and left scaled: bit for bit Scale
  // (when grad_scale != 1) then AdamUpdate per slot, in fewer kernel
  // launches (the CUDA backend: one per group of slots instead of up to two
  // per parameter).
  void AdamUpdateMany(const AdamParams& p, float grad_scale,
                      const std::vector<AdamSlot>& slots);
  // Sum of squares (for global gradient-norm clipping), in double.
  virtual absl::StatusOr<double> SumSquares(const Tensor& x) = 0;

 protected:
  // The implementations behind the fronts above, called with shapes
  // checked.
  virtual void DoCopy(const Tensor& src, const Tensor& dst) = 0;
  virtual void DoAxpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  virtual void DoAdd(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  virtual void DoAddRowBias(const Tensor& x, const Tensor& bias) = 0;
  virtual void DoSumRows(const Tensor& x, float beta, const Tensor& out) = 0;
  virtual void DoRelu(const Tensor& x, const Tensor& y) = 0;
  virtual void DoReluBackward(const Tensor& x, const Tensor& dy,
                              const Tensor& dx) = 0;
  virtual void DoGelu(const Tensor& x, bool tanh, const Tensor& y) = 0;
  virtual void DoGeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                              const Tensor& dx) = 0;
  virtual void DoLayerNorm(const Tensor& x, const Tensor& gamma,
                           const Tensor& beta, float eps, const Tensor& y,
                           const Tensor& mean, const Tensor& rstd) = 0;
  virtual void DoLayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                        const Tensor& mean, const Tensor& rstd,
                                        const Tensor& dy, const Tensor& dx) = 0;
  virtual void DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& dy,
                                         const Tensor& dgamma,
                                         const Tensor& dbeta) = 0;
  virtual void DoRmsNorm(const Tensor& x, const Tensor& weight, float eps,
                         const Tensor& y, const Tensor& rstd) = 0;
  virtual void DoRmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                                      const Tensor& rstd, const Tensor& dy,
                                      const Tensor& dx) = 0;
  virtual void DoRmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                                       const Tensor& dy,
                                       const Tensor& dweight) = 0;
  virtual void DoSiluMul(const Tensor& gate, const Tensor& up,
                         const Tensor& y) = 0;
  virtual void DoSiluMulBackward(const Tensor& gate, const Tensor& up,
                                 const Tensor& dy, const Tensor& dgate,
                                 const Tensor& dup) = 0;
  virtual void DoRope(const Tensor& x, const RopeFrequencies& freqs,
                      bool inverse, const Tensor& y, const Tensor& positions,
                      int64_t first_position) = 0;
  virtual void DoSoftmax(const Tensor& x, float scale, bool causal,
                         const Tensor& y) = 0;
  virtual void DoSoftmaxBackward(const Tensor& y, const Tensor& dy, float scale,
                                 const Tensor& dx) = 0;
  virtual void DoSoftmaxInSpans(const Tensor& x, float scale, bool causal,
                                const Tensor& spans, const Tensor& y) = 0;
  virtual void DoAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                           float scale, const AttentionMask& mask,
                           const Tensor& out, const Tensor& lse) = 0;
  virtual void DoAttentionBackward(const Tensor& q, const Tensor& k,
                                   const Tensor& v, const Tensor& out,
                                   const Tensor& lse, const Tensor& dout,
                                   float scale, const AttentionMask& mask,
                                   const Tensor& dq, const Tensor& dk,
                                   const Tensor& dv) = 0;
  virtual void DoSplitHeads(const Tensor& qkv, int64_t heads, const Tensor& q,
                            const Tensor& k, const Tensor& v) = 0;
  virtual void DoSplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                                    const Tensor& dv, int64_t heads,
                                    const Tensor& dqkv) = 0;
  virtual void DoMergeHeads(const Tensor& x, const Tensor& out) = 0;
  virtual void DoMergeHeadsBackward(const Tensor& dout, const Tensor& dx) = 0;
  virtual absl::Status DoEmbeddingForward(const Tensor& ids,
                                          const Tensor& table,
                                          const Tensor& out) = 0;
  virtual void DoEmbeddingBackward(const Tensor& ids, const Tensor& dy,
                                   const Tensor& dtable) = 0;
  virtual void DoCastToBf16(const Tensor& x, const Tensor& y) = 0;
  virtual void DoCastFromBf16(const Tensor& x, const Tensor& y) = 0;
  virtual absl::StatusOr<float> DoMseLoss(const Tensor& y, const Tensor& target,
                                          float grad_scale,
                                          const Tensor& dy) = 0;
  virtual absl::StatusOr<float> DoCrossEntropyLoss(const Tensor& logits,
                                                   const Tensor& targets,
                                                   float grad_scale,
                                                   const Tensor& dlogits) = 0;
  virtual void DoSgdUpdate(const SgdParams& p, const Tensor& param,
                           const Tensor& grad, const Tensor& momentum) = 0;
  virtual void DoAdamUpdate(const AdamParams& p, const Tensor& param,
                            const Tensor& grad, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq) = 0;
  // By default the per-slot loop the front describes.
  virtual void DoAdamUpdateMany(const AdamParams& p, float grad_scale,
                                const std::vector<AdamSlot>& slots);
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_BACKEND_H_
