// Launchers for the CUDA backend's kernels, callable from host code compiled
// by the C++ compiler: raw device pointers, sizes and a stream in, kernels
// enqueued on that stream, nothing waited for. Shapes were checked by the
// caller (CudaBackend); a launch that fails is a bug and aborts
// (CONVEYOR_CUDA_CHECK). Each launcher's semantics are those of the Backend
// method of the same name (engine/backend.h); the CPU backend is the
// reference.
//
// Every reduction has a fixed shape that depends only on the problem size
// (never on timing or the device), and no float atomics, so repeated runs
// give bitwise equal results.
//
// Not API: only engine/cuda/ includes this. Thread-safe (stateless).
#ifndef CONVEYOR_ENGINE_CUDA_INTERNAL_KERNELS_H_
#define CONVEYOR_ENGINE_CUDA_INTERNAL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend.h"

namespace conveyor::engine::cuda_internal {

// Blocks of the first pass of a scalar reduction (MseLoss, SumSquares,
// cross-entropy's row losses): the size of the `partial` buffers below.
inline constexpr int kMaxReduceBlocks = 1024;

// Results that scalar-returning kernels leave on the device for the host.
struct DeviceScalars {
  // Lowest position of an out-of-range id (embedding, cross-entropy);
  // kNoBadPosition when all ids are in range. Reset with ResetScalars.
  unsigned long long first_bad;
  double sum;  // The reduced sum (loss, sum of squares).
  // Cross-entropy: the rows whose target is not kIgnoredTarget.
  unsigned long long counted;
};
inline constexpr unsigned long long kNoBadPosition = ~0ull;

void ResetScalars(DeviceScalars* scalars, cudaStream_t stream);

// --- cuda_attention_kernels.cu: fused attention without cuDNN. ---
// Backend::Attention's sizes and mask on raw pointers.
struct AttentionArgs {
  int64_t batch = 0, heads = 0, groups = 0, seq = 0, dim = 0;
  float scale = 1.0f;
  bool causal = false;
  const int64_t* spans = nullptr;  // [batch, seq, 2] or nullptr.
  // Round every GEMM-like operand to bf16 (q, k, v, dout, p, ds).
  bool bf16 = false;
};
// The largest head_dim the kernels hold in registers.
inline constexpr int64_t kMaxHeadDim = 256;
void AttentionForward(const AttentionArgs& a, const float* q, const float* k,
                      const float* v, float* out, float* lse,
                      cudaStream_t stream);
// delta: scratch of batch * heads * seq floats.
void AttentionBackward(const AttentionArgs& a, const float* q, const float* k,
                       const float* v, const float* out, const float* lse,
                       const float* dout, float* dq, float* dk, float* dv,
                       float* delta, cudaStream_t stream);

// --- cuda_kernels.cu: elementwise, column sums, GEMM edge case, optimizers.
void Fill(float* x, int64_t n, float value, cudaStream_t stream);
// y[i] = x[i] rounded to bfloat16 (nearest even; engine/precision.h's
// RoundToBf16 bit for bit), stored as bf16 bits for cuBLAS's CUDA_R_16BF.
void ToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// y[i] = the float of bf16 bits x[i], exactly.
void FromBf16(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);
void Scale(float* x, int64_t n, float alpha, cudaStream_t stream);
void Axpy(float alpha, const float* x, float* y, int64_t n,
          cudaStream_t stream);
void Add(const float* a, const float* b, float* out, int64_t n,
         cudaStream_t stream);
void AddRowBias(float* x, const float* bias, int64_t rows, int64_t cols,
                cudaStream_t stream);
void Relu(const float* x, float* y, int64_t n, cudaStream_t stream);
void ReluBackward(const float* x, const float* dy, float* dx, int64_t n,
                  cudaStream_t stream);
void Gelu(const float* x, bool tanh, float* y, int64_t n, cudaStream_t stream);
void GeluBackward(const float* x, bool tanh, const float* dy, float* dx,
                  int64_t n, cudaStream_t stream);

// Floats of scratch that a column sum over [rows, cols] with `outputs`
// results per column needs (0 when it runs in one pass).
int64_t ColumnSumScratchFloats(int64_t rows, int64_t cols, int outputs);
// out = beta * out + column sums of x [rows, cols].
void SumRows(const float* x, int64_t rows, int64_t cols, float beta, float* out,
             float* scratch, cudaStream_t stream);

// C_i = beta * C_i (0 when beta is 0, ignoring NaN in C) for the GEMMs with
// an empty inner dimension, which cuBLAS need not handle like BLAS.
void ScaleMatrices(int64_t batch, int64_t m, int64_t n, float beta, float* c,
                   int64_t ldc, int64_t stride_c, cudaStream_t stream);

void SgdUpdate(const SgdParams& p, float* param, const float* grad,
               float* momentum, int64_t n, cudaStream_t stream);
// step_size = lr / (1 - beta1^step), bias2_sqrt = sqrt(1 - beta2^step),
// computed in double on the host as the CPU backend does.
// Up to kAdamTensors parameters for one AdamUpdateMany launch (the kernel's
// arguments: well inside CUDA's 4 KiB).
inline constexpr int kAdamTensors = 24;
struct AdamTensorList {
  int count = 0;
  float* param[kAdamTensors] = {};
  float* grad[kAdamTensors] = {};
  float* exp_avg[kAdamTensors] = {};
  float* exp_avg_sq[kAdamTensors] = {};
  int64_t numel[kAdamTensors] = {};
};
// AdamUpdate of every tensor of `list` in one launch, each gradient first
// multiplied by grad_scale and stored back when grad_scale != 1.
void AdamUpdateMany(const AdamParams& p, float step_size, float bias2_sqrt,
                    float grad_scale, const AdamTensorList& list,
                    cudaStream_t stream);
void AdamUpdate(const AdamParams& p, float step_size, float bias2_sqrt,
                float* param, const float* grad, float* exp_avg,
                float* exp_avg_sq, int64_t n, cudaStream_t stream);

// scalars->sum = sum of x^2 in double. `partial` holds kMaxReduceBlocks.
void SumSquares(const float* x, int64_t n, double* partial,
                DeviceScalars* scalars, cudaStream_t stream);
// dy = grad * (y - t); scalars->sum = sum of (y - t)^2 in double.
void MseLoss(const float* y, const float* target, int64_t n, float grad,
             float* dy, double* partial, DeviceScalars* scalars,
             cudaStream_t stream);

// --- cuda_nn_kernels.cu: normalization, attention, embedding, cross-entropy.
void LayerNorm(const float* x, const float* gamma, const float* beta, float eps,
               int64_t rows, int64_t cols, float* y, float* mean, float* rstd,
               cudaStream_t stream);
void LayerNormBackwardInput(const float* x, const float* gamma,
                            const float* mean, const float* rstd,
                            const float* dy, int64_t rows, int64_t cols,
                            float* dx, cudaStream_t stream);
// `scratch` holds ColumnSumScratchFloats(rows, cols, 2).
void LayerNormBackwardWeight(const float* x, const float* mean,
                             const float* rstd, const float* dy, int64_t rows,
                             int64_t cols, float* dgamma, float* dbeta,
                             float* scratch, cudaStream_t stream);

// --- cuda_llama_kernels.cu: RMS norm, the SwiGLU gate, rotary embedding.
void RmsNorm(const float* x, const float* weight, float eps, int64_t rows,
             int64_t cols, float* y, float* rstd, cudaStream_t stream);
void RmsNormBackwardInput(const float* x, const float* weight,
                          const float* rstd, const float* dy, int64_t rows,
                          int64_t cols, float* dx, cudaStream_t stream);
// `scratch` holds ColumnSumScratchFloats(rows, cols, 1).
void RmsNormBackwardWeight(const float* x, const float* rstd, const float* dy,
                           int64_t rows, int64_t cols, float* dweight,
                           float* scratch, cudaStream_t stream);
void SiluMul(const float* gate, const float* up, float* y, int64_t n,
             cudaStream_t stream);
void SiluMulBackward(const float* gate, const float* up, const float* dy,
                     float* dgate, float* dup, int64_t n, cudaStream_t stream);
// Backend::Rope on x and y viewed as [rows, dim], row r at sequence index
// r % seq of batch r / rows_per_batch; y may alias x.
struct RopeArgs {
  const float* x = nullptr;
  float* y = nullptr;
  int64_t rows = 0, seq = 1, dim = 0, rows_per_batch = 1;
  const float* inv_freq = nullptr;  // [dim / 2]
  float attention_factor = 1.0f;
  // [batch, seq]; nullptr: first_position + the sequence index.
  const int64_t* positions = nullptr;
  int64_t first_position = 0;
  bool inverse = false;
};
void Rope(const RopeArgs& args, cudaStream_t stream);

// rows_per_matrix: the rows of one [rows, cols] matrix (for the causal
// mask); rows: all rows.
// lse: nullptr, or one float per row for its log-sum-exp (SoftmaxKernel).
// y may alias x.
void Softmax(const float* x, float scale, bool causal, int64_t rows,
             int64_t rows_per_matrix, int64_t cols, float* y, float* lse,
             cudaStream_t stream);
// Softmax of [rows / seq, seq, seq] scores within documents: spans I64
// [samples, seq, 2], `heads` score matrices per sample.
void SoftmaxInSpans(const float* x, float scale, bool causal, int64_t rows,
                    int64_t seq, const int64_t* spans, int64_t heads, float* y,
                    float* lse, cudaStream_t stream);
void SoftmaxBackward(const float* y, const float* dy, float scale, int64_t rows,
                     int64_t cols, float* dx, cudaStream_t stream);
// Between qkv [B, S, 3, H, D] and q, k, v [B, H, S, D]; `to_heads` picks the
// direction.
void PermuteQkv(float* qkv, int64_t batch, int64_t seq, int64_t heads,
                int64_t head_dim, float* q, float* k, float* v, bool to_heads,
                cudaStream_t stream);
// Between x [B, H, S, D] and merged [B, S, H * D].
void PermuteMerge(float* x, int64_t batch, int64_t heads, int64_t seq,
                  int64_t head_dim, float* merged, bool to_merged,
                  cudaStream_t stream);

// out[i] = table[ids[i]]; rows of out whose id is outside [0, vocab) are
// zeroed and the lowest such i is left in scalars->first_bad (reset it
// first).
void EmbeddingForward(const int64_t* ids, int64_t n, const float* table,
                      int64_t vocab, int64_t dim, float* out,
                      DeviceScalars* scalars, cudaStream_t stream);
// Bytes of scratch EmbeddingBackward needs.
size_t EmbeddingBackwardScratchBytes(int64_t n, int64_t vocab);
// dtable[ids[i]] += dy[i] over i in ascending order for each row (the CPU
// backend's order, so results match it bitwise); ids outside [0, vocab) are
// skipped.
void EmbeddingBackward(const int64_t* ids, int64_t n, const float* dy,
                       int64_t vocab, int64_t dim, float* dtable, void* scratch,
                       size_t scratch_bytes, cudaStream_t stream);

// dlogits = grad_scale / counted * (softmax(logits) - onehot(target)) with
// `counted` the rows whose target is not kIgnoredTarget (engine/loss_kind.h;
// left in scalars->counted), and 0 on the ignored rows; scalars->sum = sum of
// the row losses in double; a row whose target is outside [0, vocab) adds 0
// and its lowest index goes to scalars->first_bad (reset it first).
// `row_loss` holds n doubles, `partial` kMaxReduceBlocks.
void CrossEntropyLoss(const float* logits, const int64_t* targets, int64_t n,
                      int64_t vocab, float grad_scale, float* dlogits,
                      double* row_loss, double* partial, DeviceScalars* scalars,
                      cudaStream_t stream);

}  // namespace conveyor::engine::cuda_internal

#endif  // CONVEYOR_ENGINE_CUDA_INTERNAL_KERNELS_H_
