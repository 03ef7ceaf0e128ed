// Memory, GEMM and elementwise kernels of the CPU backend. The
// normalization, attention, embedding, loss and optimizer kernels are in
// cpu_nn_kernels.cc.
#include "engine/cpu/cpu_backend.h"

#include <cblas.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/internal/vector_math.h"
#include "engine/cpu/parallel.h"
#include "engine/cpu/wide_kernels.h"

namespace conveyor::engine {
namespace {

constexpr size_t kAlignment = 64;  // A cache line; enough for AVX-512 loads.

float* F(const Tensor& t) { return t.data<float>(); }

}  // namespace

CpuBackend* CpuBackend::Get(Precision precision) {
  static CpuBackend* fp32 = new CpuBackend(Precision::kFp32);
  static CpuBackend* bf16 = new CpuBackend(Precision::kBf16);
  return precision == Precision::kBf16 ? bf16 : fp32;
}

namespace {

// The bytes of every CPU tensor alive, and the most since the last reset:
// process-wide, as the instances share host memory.
std::atomic<uint64_t> allocated_bytes{0};
std::atomic<uint64_t> peak_allocated_bytes{0};

void CountAllocation(uint64_t bytes) {
  const uint64_t now =
      allocated_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  uint64_t peak = peak_allocated_bytes.load(std::memory_order_relaxed);
  while (now > peak && !peak_allocated_bytes.compare_exchange_weak(
                           peak, now, std::memory_order_relaxed)) {
  }
}

// A copy of `n` floats from `x`, each rounded to bfloat16.
std::vector<float> RoundedCopy(const float* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  float* o = out.data();
  ParallelFor(n, [=](int64_t i) { o[i] = RoundToBf16(x[i]); });
  return out;
}

// A copy of `n` bf16 values as floats (exact).
std::vector<float> WidenedCopy(const uint16_t* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  float* o = out.data();
  ParallelFor(n, [=](int64_t i) {
    const uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
    std::memcpy(&o[i], &bits, sizeof(bits));
  });
  return out;
}

// A GEMM operand as the fp32 GEMM reads it: widened from its bf16 bits
// (`x16`), rounded to bf16 (`round`), or `x` itself. Copies go to `storage`.
const float* OperandAsFloats(const float* x, const uint16_t* x16, int64_t n,
                             bool round, std::vector<float>& storage) {
  if (x16 != nullptr) {
    storage = WidenedCopy(x16, n);
  } else if (round) {
    storage = RoundedCopy(x, n);
  } else {
    return x;
  }
  return storage.data();
}

}  // namespace

absl::StatusOr<Tensor> CpuBackend::Empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    }
  }
  // Sizes come from model specs and data files: overflow is an input error,
  // never a wrapped size that a later write would overrun.
  uint64_t elements = 1, bytes = 0, padded = 0;
  bool overflow = false;
  for (int64_t d : shape) {
    overflow |=
        __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements);
  }
  overflow |= __builtin_mul_overflow(elements, DTypeSize(dtype), &bytes);
  overflow |= __builtin_add_overflow(bytes, kAlignment - 1, &padded);
  if (overflow || elements > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu: tensor ", DTypeName(dtype), ShapeString(shape),
                     " is too large to address"));
  }
  // aligned_alloc needs a size that is a multiple of the alignment, and a
  // zero-size tensor still gets a real (tiny) buffer so data() is valid.
  padded = padded / kAlignment * kAlignment;
  void* data =
      std::aligned_alloc(kAlignment, padded == 0 ? kAlignment : padded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu: cannot allocate ", bytes, " bytes for ",
                     DTypeName(dtype), ShapeString(shape)));
  }
  CountAllocation(padded);
  return Tensor(std::make_shared<Buffer>(this, data, padded), shape, dtype);
}

void CpuBackend::FreeBuffer(void* data, size_t bytes) {
  std::free(data);
  allocated_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

MemoryStats CpuBackend::memory_stats() const {
  static const uint64_t capacity = [] {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0
               ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
               : uint64_t{0};
  }();
  const uint64_t now = allocated_bytes.load(std::memory_order_relaxed);
  const uint64_t peak = peak_allocated_bytes.load(std::memory_order_relaxed);
  return {.allocated = now,
          .peak_allocated = peak,
          .reserved = now,
          .peak_reserved = peak,
          .capacity = capacity};
}

void CpuBackend::ResetPeakMemory() {
  peak_allocated_bytes.store(allocated_bytes.load(std::memory_order_relaxed),
                             std::memory_order_relaxed);
}

absl::Status CpuBackend::CopyFromHost(const void* src, size_t bytes,
                                      const Tensor& dst) {
  if (bytes != dst.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of ", bytes, " bytes into a tensor of ", dst.bytes()));
  }
  if (bytes > 0) std::memcpy(dst.raw(), src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(const Tensor& src, void* dst,
                                    size_t bytes) {
  if (bytes != src.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy of a tensor of ", src.bytes(), " bytes into ", bytes));
  }
  if (bytes > 0) std::memcpy(dst, src.raw(), bytes);
  return absl::OkStatus();
}

void CpuBackend::DoCopy(const Tensor& src, const Tensor& dst) {
  if (src.bytes() > 0 && src.raw() != dst.raw()) {
    std::memcpy(dst.raw(), src.raw(), src.bytes());
  }
}

void CpuBackend::GemmStridedBatched(const GemmBatch& g) {
  if (g.m == 0 || g.n == 0) return;
  const bool round = precision_ == Precision::kBf16 && g.k > 0;
  if (round || g.a_bf16 != nullptr || g.b_bf16 != nullptr) {
    // The products of bf16 values are exact in fp32, so rounding the inputs
    // and multiplying in fp32 is what bf16 tensor cores compute, up to the
    // order of accumulation. An operand already in bf16 is widened, which
    // is exact; rounding it again would change nothing.
    std::vector<float> a, b;
    GemmBatch f = g;
    f.a = OperandAsFloats(g.a, g.a_bf16, GemmExtentA(g), round, a);
    f.b = OperandAsFloats(g.b, g.b_bf16, GemmExtentB(g), round, b);
    f.a_bf16 = f.b_bf16 = nullptr;
    Get(Precision::kFp32)->GemmStridedBatched(f);
    return;
  }
  for (int64_t i = 0; i < g.batch; ++i) {
    float* c = g.c + i * g.stride_c;
    if (g.k == 0) {
      // BLAS leaves C untouched when k == 0 only if beta == 1; do it by hand.
      // beta == 0 means "ignore C", as in BLAS: uninitialized C may hold NaN.
      for (int64_t r = 0; r < g.m; ++r) {
        for (int64_t col = 0; col < g.n; ++col) {
          float& x = c[r * g.ldc + col];
          x = g.beta == 0.0f ? 0.0f : x * g.beta;
        }
      }
      continue;
    }
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha,
                g.a + i * g.stride_a, g.lda, g.b + i * g.stride_b, g.ldb,
                g.beta, c, g.ldc);
  }
}

void CpuBackend::Fill(const Tensor& x, float value) {
  float* p = F(x);
  ParallelFor(x.numel(), [=](int64_t i) { p[i] = value; });
}

void CpuBackend::Scale(const Tensor& x, float alpha) {
  float* p = F(x);
  ParallelFor(x.numel(), [=](int64_t i) { p[i] *= alpha; });
}

void CpuBackend::DoAxpy(float alpha, const Tensor& x, const Tensor& y) {
  const float* px = F(x);
  float* py = F(y);
  ParallelFor(x.numel(), [=](int64_t i) { py[i] += alpha * px[i]; });
}

void CpuBackend::DoAdd(const Tensor& a, const Tensor& b, const Tensor& out) {
  const float *pa = F(a), *pb = F(b);
  float* po = F(out);
  ParallelFor(a.numel(), [=](int64_t i) { po[i] = pa[i] + pb[i]; });
}

void CpuBackend::DoAddRowBias(const Tensor& x, const Tensor& bias) {
  const int64_t cols = bias.numel();
  const int64_t rows = x.numel() / cols;
  float* px = F(x);
  const float* pb = F(bias);
  ParallelForRows(rows, cols, [=](int64_t r) {
    float* row = px + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += pb[c];
  });
}

void CpuBackend::DoSumRows(const Tensor& x, float beta, const Tensor& out) {
  const int64_t cols = out.numel();
  const int64_t rows = x.numel() / cols;
  const float* px = F(x);
  float* po = F(out);
  // Row by row into double accumulators: contiguous, vectorisable reads
  // (a column at a time strides by a whole row), and each column still sums
  // its rows in order, so the result does not depend on the thread count.
  cpu_internal::ForColumnBands(rows, cols, [=](int64_t begin, int64_t end) {
    const int64_t width = end - begin;
    double* sum = cpu_internal::Scratch(width);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = px + r * cols + begin;
      for (int64_t c = 0; c < width; ++c) sum[c] += row[c];
    }
    for (int64_t c = 0; c < width; ++c) {
      po[begin + c] = beta * po[begin + c] + static_cast<float>(sum[c]);
    }
  });
}

void CpuBackend::DoRelu(const Tensor& x, const Tensor& y) {
  const float* px = F(x);
  float* py = F(y);
  ParallelFor(x.numel(), [=](int64_t i) { py[i] = px[i] > 0 ? px[i] : 0.0f; });
}

void CpuBackend::DoReluBackward(const Tensor& x, const Tensor& dy,
                                const Tensor& dx) {
  const float *px = F(x), *pdy = F(dy);
  float* pdx = F(dx);
  ParallelFor(x.numel(),
              [=](int64_t i) { pdx[i] = px[i] > 0 ? pdy[i] : 0.0f; });
}

void CpuBackend::DoGelu(const Tensor& x, bool tanh, const Tensor& y) {
  const float* px = F(x);
  float* py = F(y);
  cpu_internal::ForChunks(x.numel(), [=](int64_t begin, int64_t end) {
    cpu_internal::GeluForward(px + begin, py + begin, end - begin, tanh);
  });
}

void CpuBackend::DoGeluBackward(const Tensor& x, bool tanh, const Tensor& dy,
                                const Tensor& dx) {
  const float *px = F(x), *pdy = F(dy);
  float* pdx = F(dx);
  cpu_internal::ForChunks(x.numel(), [=](int64_t begin, int64_t end) {
    cpu_internal::GeluBackward(px + begin, pdy + begin, pdx + begin,
                               end - begin, tanh);
  });
}

}  // namespace conveyor::engine
