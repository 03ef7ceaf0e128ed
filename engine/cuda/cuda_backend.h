// CudaBackend: the Backend on one CUDA device. GEMMs go to cuBLAS (fp32
// compute, row-major operands mapped onto column-major cuBLAS by swapping
// them); every other kernel is our own (engine/cuda/*.cu), each matching the
// CPU backend's semantics (engine/cpu/), which is its reference.
//
// Execution: one compute stream per backend. Every method enqueues its work
// on that stream and returns without waiting, except where the Backend
// contract hands a value to the host: CopyToHost, MseLoss,
// CrossEntropyLoss, SumSquares and EmbeddingForward (whose status depends on
// the ids) wait for the stream through an event; CopyFromHost waits only
// when the source is page-locked memory that the copy may still be reading.
// Synchronize() waits for everything. Other streams (communication) order
// themselves against compute with RecordEvent / WaitForEvent, never a host
// sync.
//
// Memory comes from a CachingAllocator: after the first step, Empty() and
// the scratch of reductions never call cudaMalloc. Blocks are reused in
// compute-stream order, so memory handed to another stream must be kept
// alive (a Tensor handle held) until that stream is done with it.
//
// Errors: shape mismatches abort (CONVEYOR_CHECK), as in every backend, and
// so does a failed kernel launch (a bug). Out of memory returns
// ResourceExhausted from the methods that return a status; a method that
// returns void and needs scratch memory it cannot get skips its work and
// records the error, which the next Synchronize() or host-value call
// returns. Asynchronous faults in kernels surface as kInternal from the next
// call that waits.
//
// Every tensor passed in must belong to this backend; all tensors must be
// released before the backend is destroyed. Each method makes the backend's
// device current on the calling thread. Thread-compatible, like every
// Backend; blocks may be freed (tensors dropped) from any thread.
#ifndef CONVEYOR_ENGINE_CUDA_CUDA_BACKEND_H_
#define CONVEYOR_ENGINE_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cuda/caching_allocator.h"
#include "engine/cuda/cublas_util.h"
#include "engine/cuda/cuda_handles.h"
#include "engine/host_staging_pool.h"
#include "engine/precision.h"

namespace conveyor::engine {

namespace cuda_internal {
struct DeviceScalars;
}  // namespace cuda_internal

struct CudaBackendOptions {
  // Lets cuBLAS round GEMM inputs to TF32 (10-bit mantissa) on tensor cores:
  // several times faster on Ampere and later, but results then differ from
  // the CPU backend by about 1e-3 relative. Off: full fp32 GEMMs.
  bool allow_tf32 = false;
  // bf16: GEMM inputs are rounded to bfloat16 and multiplied on bf16 tensor
  // cores with fp32 accumulation into fp32 outputs (engine/precision.h);
  // allow_tf32 then does not matter.
  Precision precision = Precision::kFp32;
  // cuBLAS workspace, allocated once at creation so cuBLAS never allocates
  // on the step path. 32 MiB is what cuBLAS recommends for Hopper.
  size_t cublas_workspace_bytes = size_t{32} << 20;
  // Page-locked host memory kept for reuse by EmptyHostStaging (the TCP
  // channel's staging of this device's tensors): a pipeline's activations
  // and gradients, a few microbatches of them in flight per peer.
  size_t host_staging_bytes = size_t{1} << 30;
  // How Backend::Attention runs. kAuto: through cuBLAS GEMMs and the softmax
  // kernel into scratch score matrices (freed at once; the stash keeps
  // none, the backward computes them again) while the two [B, H, S, S]
  // buffers fit in attention_materialize_bytes, else the fused kernels,
  // which hold no score matrix but use no tensor cores (yet: cuDNN's fused
  // SDPA is to replace both). Tests force one or the other.
  enum class AttentionKernel : uint8_t { kAuto, kFused, kMaterialize };
  AttentionKernel attention = AttentionKernel::kAuto;
  size_t attention_materialize_bytes = size_t{2} << 30;
};

class CudaBackend final : public Backend {
 public:
  // A backend on device ordinal `device` (after CUDA_VISIBLE_DEVICES).
  // Returns:
  //   kInvalidArgument for a negative ordinal;
  //   kFailedPrecondition when no CUDA device or driver is usable;
  //   kNotFound when `device` is not a visible ordinal;
  //   kFailedPrecondition also when this binary has no kernels for the
  //     device's architecture (a smoke-test kernel runs first);
  //   kUnavailable when the device is held by another process;
  //   kResourceExhausted when the device cannot hold the stream, cuBLAS
  //     workspace or result buffers;
  //   other CUDA/cuBLAS failures as CudaStatus / CublasStatus map them.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device, const CudaBackendOptions& options = {});

  // Waits for queued work, then frees the cached memory.
  ~CudaBackend() override;

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // "cuda:<device>".
  absl::string_view Name() const override { return name_; }
  bool host_resident() const override { return false; }
  bool bf16_gemms() const override {
    return options_.precision == Precision::kBf16;
  }
  int device() const { return device_; }
  int device_ordinal() const override { return device_; }
  double peak_flops() const override { return peak_flops_; }
  // The caching allocator's figures; capacity the device's total memory.
  MemoryStats memory_stats() const override;
  void ResetPeakMemory() override;
  // The compute stream: for libraries that must run in order with the
  // backend's kernels (NCCL on the same stream, profilers).
  cudaStream_t stream() const { return stream_.get(); }
  void* native_stream() const override { return stream_.get(); }

  // `event` is a cudaEvent_t (engine/backend.h).
  absl::Status RecordEvent(void* event) override;
  absl::Status WaitForEvent(void* event) override;

  CachingAllocator::Stats allocator_stats() const {
    return allocator_->stats();
  }
  // Waits for the stream, then returns every cached block to the driver
  // (cudaFree). Off the step path only: between jobs, or to hand memory to
  // another process.
  absl::Status EmptyCache();

  // --- Backend ---------------------------------------------------------------
  absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype) override;
  // Page-locked (cudaHostAlloc, portable), pooled: staged copies run at DMA
  // speed and no allocation costs milliseconds on the step path.
  absl::StatusOr<Tensor> EmptyHostStaging(const Shape& shape,
                                          DType dtype) override;
  void FreeBuffer(void* data, size_t bytes) override;
  absl::Status CopyFromHost(const void* src, size_t bytes,
                            const Tensor& dst) override;
  absl::Status CopyToHost(const Tensor& src, void* dst, size_t bytes) override;
  absl::Status Synchronize() override;
  void GemmStridedBatched(const GemmBatch& batch) override;

  void Fill(const Tensor& x, float value) override;
  void Scale(const Tensor& x, float alpha) override;
  absl::StatusOr<double> SumSquares(const Tensor& x) override;

 private:
  // --- Backend kernels behind the checked fronts (engine/backend.h) ---------
  void DoCopy(const Tensor& src, const Tensor& dst) override;
  void DoAxpy(float alpha, const Tensor& x, const Tensor& y) override;
  void DoAdd(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void DoAddRowBias(const Tensor& x, const Tensor& bias) override;
  void DoSumRows(const Tensor& x, float beta, const Tensor& out) override;
  void DoRelu(const Tensor& x, const Tensor& y) override;
  void DoReluBackward(const Tensor& x, const Tensor& dy,
                      const Tensor& dx) override;
  void DoGelu(const Tensor& x, bool tanh, const Tensor& y) override;
  void DoGeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                      const Tensor& dx) override;

  void DoLayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                   float eps, const Tensor& y, const Tensor& mean,
                   const Tensor& rstd) override;
  void DoLayerNormBackwardInput(const Tensor& x, const Tensor& gamma,
                                const Tensor& mean, const Tensor& rstd,
                                const Tensor& dy, const Tensor& dx) override;
  void DoLayerNormBackwardWeight(const Tensor& x, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& dy,
                                 const Tensor& dgamma,
                                 const Tensor& dbeta) override;

  void DoRmsNorm(const Tensor& x, const Tensor& weight, float eps,
                 const Tensor& y, const Tensor& rstd) override;
  void DoRmsNormBackwardInput(const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const Tensor& dy,
                              const Tensor& dx) override;
  void DoRmsNormBackwardWeight(const Tensor& x, const Tensor& rstd,
                               const Tensor& dy,
                               const Tensor& dweight) override;
  void DoSiluMul(const Tensor& gate, const Tensor& up,
                 const Tensor& y) override;
  void DoSiluMulBackward(const Tensor& gate, const Tensor& up, const Tensor& dy,
                         const Tensor& dgate, const Tensor& dup) override;
  void DoRope(const Tensor& x, const RopeFrequencies& freqs, bool inverse,
              const Tensor& y, const Tensor& positions,
              int64_t first_position) override;
  void DoAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                   float scale, const AttentionMask& mask, const Tensor& out,
                   const Tensor& lse) override;
  void DoAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& lse,
                           const Tensor& dout, float scale,
                           const AttentionMask& mask, const Tensor& dq,
                           const Tensor& dk, const Tensor& dv) override;
  void DoSoftmax(const Tensor& x, float scale, bool causal,
                 const Tensor& y) override;
  void DoSoftmaxInSpans(const Tensor& x, float scale, bool causal,
                        const Tensor& spans, const Tensor& y) override;
  void DoSoftmaxBackward(const Tensor& y, const Tensor& dy, float scale,
                         const Tensor& dx) override;
  void DoSplitHeads(const Tensor& qkv, int64_t heads, const Tensor& q,
                    const Tensor& k, const Tensor& v) override;
  void DoSplitHeadsBackward(const Tensor& dq, const Tensor& dk,
                            const Tensor& dv, int64_t heads,
                            const Tensor& dqkv) override;
  void DoMergeHeads(const Tensor& x, const Tensor& out) override;
  void DoMergeHeadsBackward(const Tensor& dout, const Tensor& dx) override;

  absl::Status DoEmbeddingForward(const Tensor& ids, const Tensor& table,
                                  const Tensor& out) override;
  void DoEmbeddingBackward(const Tensor& ids, const Tensor& dy,
                           const Tensor& dtable) override;

  void DoCastToBf16(const Tensor& x, const Tensor& y) override;
  void DoCastFromBf16(const Tensor& x, const Tensor& y) override;
  absl::StatusOr<float> DoMseLoss(const Tensor& y, const Tensor& target,
                                  float grad_scale, const Tensor& dy) override;
  absl::StatusOr<float> DoCrossEntropyLoss(const Tensor& logits,
                                           const Tensor& targets,
                                           float grad_scale,
                                           const Tensor& dlogits) override;

  void DoSgdUpdate(const SgdParams& p, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum) override;
  void DoAdamUpdate(const AdamParams& p, const Tensor& param,
                    const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq) override;
  void DoAdamUpdateMany(const AdamParams& p, float grad_scale,
                        const std::vector<AdamSlot>& slots) override;

  // Device memory released when it goes out of scope; the scratch of one
  // call. Freed right after the kernels using it are enqueued: the next user
  // of the block runs later on the same stream.
  class Scratch;

  CudaBackend(int device, const CudaBackendOptions& options);

  // Makes device_ current on the calling thread.
  void Activate() const;
  // Device pointer of a tensor of this backend (aborts for another
  // backend's tensor: a bug in the caller).
  template <typename T>
  T* Ptr(const Tensor& t) const;
  float* F(const Tensor& t) const { return Ptr<float>(t); }
  bool bf16() const { return options_.precision == Precision::kBf16; }
  // Whether the fused attention kernels take q's head_dim; records the
  // error for the next Synchronize() when not.
  bool AttentionFits(const Tensor& q, absl::string_view what);
  // Whether Attention of q [B, H, S, D] materializes its scores (options).
  bool MaterializesAttention(const Tensor& q) const;
  // probs = the masked softmax of scale * q k^T into p ([B, H, S, S]
  // floats), and each row's log-sum-exp into lse unless it is null.
  void AttentionProbabilities(const Tensor& q, const Tensor& k, float scale,
                              const AttentionMask& mask, float* p, float* lse);
  // The materializing forward and backward
  // (engine/cuda/cuda_backend_kernels.cc).
  void MaterializedAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale, const AttentionMask& mask,
                             const Tensor& out, const Tensor& lse);
  void MaterializedAttentionBackward(const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& dout,
                                     float scale, const AttentionMask& mask,
                                     const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv);
  // Scratch of `bytes` bytes; on failure records the error for the next
  // Synchronize() (void methods) and returns a null block.
  Scratch ScratchOrDefer(size_t bytes, absl::string_view what);
  // GemmStridedBatched with bf16-rounded inputs (options_.precision); the
  // int arguments are the checked cuBLAS sizes.
  void GemmBf16(const GemmBatch& g, cublasOperation_t op_a,
                cublasOperation_t op_b, int m, int n, int k, int lda, int ldb,
                int ldc);
  // Waits on the host for the work enqueued so far; then returns the first
  // error a void method deferred, if any.
  absl::Status WaitForHost(absl::string_view what);
  // Copies the device scalars to host_scalars_ and waits for them.
  absl::Status FetchScalars(absl::string_view what);
  // The I64 element at `index` of a device tensor (for error messages).
  absl::StatusOr<int64_t> FetchId(const Tensor& ids, int64_t index);

  const int device_;
  const CudaBackendOptions options_;
  const std::string name_;
  double peak_flops_ = 0;         // Set by Create.
  uint64_t memory_capacity_ = 0;  // Set by Create.
  // Declared first so it is destroyed last: everything below may still have
  // work queued on it.
  CudaStreamPtr stream_;
  CudaEventPtr host_wait_event_;
  CudaDevicePtr<void> cublas_workspace_;
  CublasHandlePtr cublas_;
  // Results of reductions, on the device and page-locked on the host, plus
  // the first-pass partial sums (kMaxReduceBlocks doubles).
  CudaDevicePtr<cuda_internal::DeviceScalars> scalars_;
  CudaDevicePtr<double> partials_;
  CudaHostPtr<cuda_internal::DeviceScalars> host_scalars_;
  CudaHostPtr<int64_t> host_id_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<HostStagingPool> host_staging_;
  absl::Status deferred_error_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CUDA_CUDA_BACKEND_H_
