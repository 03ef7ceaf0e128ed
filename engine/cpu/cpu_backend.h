// CpuBackend: the Backend on host memory. GEMMs go to OpenBLAS SGEMM; the
// other kernels are plain loops the compiler can vectorise, split across cores
// with OpenMP where a tensor is big enough for that to pay. Work runs
// synchronously, so Synchronize() has nothing to wait for. A bf16 instance
// (engine/precision.h) rounds copies of every GEMM's inputs to bfloat16 first.
// Thread-compatible, like every Backend.
#ifndef CONVEYOR_ENGINE_CPU_CPU_BACKEND_H_
#define CONVEYOR_ENGINE_CPU_CPU_BACKEND_H_

#include "engine/backend.h"
#include "engine/precision.h"

namespace conveyor::engine {

class CpuBackend final : public Backend {
 public:
  // The process-wide CPU backend for `precision`. CPU memory needs no
  // per-device state, so the instances share every tensor: only how their
  // GEMMs round differs.
  static CpuBackend* Get(Precision precision = Precision::kFp32);

  Precision precision() const { return precision_; }
  bool bf16_gemms() const override { return precision_ == Precision::kBf16; }

  absl::string_view Name() const override { return "cpu"; }
  bool host_resident() const override { return true; }

  absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype) override;
  // Host memory already: plain tensors of the fp32 instance (staging only
  // copies bytes, whatever this instance's precision).
  absl::StatusOr<Tensor> EmptyHostStaging(const Shape& shape,
                                          DType dtype) override {
    return Get()->Empty(shape, dtype);
  }
  void FreeBuffer(void* data, size_t bytes) override;
  // Every CPU backend instance's tensors together: the process's (they
  // share host memory), capacity the machine's physical memory.
  MemoryStats memory_stats() const override;
  void ResetPeakMemory() override;
  absl::Status CopyFromHost(const void* src, size_t bytes,
                            const Tensor& dst) override;
  absl::Status CopyToHost(const Tensor& src, void* dst, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

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

  void DoSoftmax(const Tensor& x, float scale, bool causal,
                 const Tensor& y) override;
  void DoSoftmaxInSpans(const Tensor& x, float scale, bool causal,
                        const Tensor& spans, const Tensor& y) override;
  void DoSoftmaxBackward(const Tensor& y, const Tensor& dy, float scale,
                         const Tensor& dx) override;
  // engine/cpu/cpu_attention.cc.
  void DoAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                   float scale, const AttentionMask& mask, const Tensor& out,
                   const Tensor& lse) override;
  void DoAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& lse,
                           const Tensor& dout, float scale,
                           const AttentionMask& mask, const Tensor& dq,
                           const Tensor& dk, const Tensor& dv) override;
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

  explicit CpuBackend(Precision precision) : precision_(precision) {}
  const Precision precision_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CPU_CPU_BACKEND_H_
