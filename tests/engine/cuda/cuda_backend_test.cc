// Cross-backend checks of every Backend method: the same random inputs go
// through CpuBackend (the reference) and CudaBackend, and the outputs must
// agree: exactly for copies, permutations, integer work and single
// roundings; within fp32 tolerance where the two add in a different order.
// Every test but the creation ones skips itself without a CUDA device.
#include "engine/cuda/cuda_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/device_info.h"
#include "engine/device_peak.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/attention_reference.h"
#include "tests/engine/cuda/cuda_test_util.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::AllClose;
using testing_util::Both;
using testing_util::CudaTest;
using testing_util::FromVector;
using testing_util::Ids;
using testing_util::RandomTensor;

// fp32 kernels that add in another order than the CPU (which often
// accumulates in double) agree to a few ulps of the largest partial sum.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

class CudaBackendTest : public CudaTest {
 protected:
  Both Random(const Shape& shape, uint32_t seed, float scale = 1.0f) const {
    Tensor c = RandomTensor(shape, seed, scale);
    return {c, ToCuda(c)};
  }
  // An output, filled with the same garbage on both sides so that a kernel
  // that accumulates where it should overwrite (or the reverse) shows up.
  Both Output(const Shape& shape) const { return Random(shape, 999, 3.0f); }
  Both IdTensor(const Shape& shape, const std::vector<int64_t>& ids) const {
    Tensor c = Ids(shape, ids);
    return {c, ToCuda(c)};
  }

  void ExpectClose(const Both& t, const std::string& what, double rtol = kRtol,
                   double atol = kAtol) const {
    EXPECT_TRUE(AllClose(Values(t.cuda), Values(t.cpu), rtol, atol)) << what;
  }
  void ExpectEqual(const Both& t, const std::string& what) const {
    EXPECT_EQ(Values(t.cuda), Values(t.cpu)) << what;
  }
  static std::vector<int64_t> IdValues(const Tensor& t) {
    std::vector<int64_t> v(t.numel());
    EXPECT_TRUE(t.backend()->CopyToHost(t, v.data(), t.bytes()).ok());
    return v;
  }
};

// --- Creation (runs with or without a GPU) -----------------------------------

TEST(CudaBackendCreateTest, NegativeDeviceIsInvalidArgument) {
  EXPECT_EQ(CudaBackend::Create(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaBackendCreateTest, MissingDeviceFailsWithAClearMessage) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  const int missing = static_cast<int>(devices->size());
  const absl::Status status = CudaBackend::Create(missing).status();
  // No GPU at all: nothing to retry until the machine changes. GPUs present:
  // the ordinal names none of them.
  EXPECT_EQ(status.code(), devices->empty()
                               ? absl::StatusCode::kFailedPrecondition
                               : absl::StatusCode::kNotFound)
      << status;
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("cuda:", missing)));
}

// --- Memory ------------------------------------------------------------------

TEST_F(CudaBackendTest, NameAndDevice) {
  EXPECT_EQ(cuda()->Name(), "cuda:0");
  // Device memory: the channels stage it through host buffers.
  EXPECT_FALSE(cuda()->host_resident());
  EXPECT_EQ(cuda()->device(), 0);
  EXPECT_NE(cuda()->stream(), nullptr);
}

// The MFU's denominator: the device's figure from engine/device_peak.h,
// for the architectures its table knows (every GPU we run on).
TEST_F(CudaBackendTest, KnowsItsDevicePeak) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  const CudaDeviceInfo& d = (*devices)[0];
  const double expected =
      GpuPeakFlops({.compute_major = d.compute_major,
                    .compute_minor = d.compute_minor,
                    .multiprocessors = d.multiprocessors,
                    .clock_khz = static_cast<double>(d.clock_khz)},
                   Precision::kFp32);
  if (FlopsPerSmPerClock(d.compute_major, d.compute_minor, Precision::kFp32) ==
      0) {
    GTEST_SKIP() << "sm_" << d.compute_major << d.compute_minor
                 << " is not in engine/device_peak.h's table";
  }
  EXPECT_GT(d.clock_khz, 0);
  // Every GPU in the table does more than 1 TFLOP/s of fp32.
  EXPECT_GT(cuda()->peak_flops(), 1e12);
  EXPECT_EQ(cuda()->peak_flops(), expected);
}

TEST_F(CudaBackendTest, CopiesRoundTripExactly) {
  const Both f = Random({3, 17}, 1);
  EXPECT_EQ(Values(f.cuda), Values(f.cpu));
  const Both ids = IdTensor({5}, {0, -7, int64_t{1} << 40, 3, 9});
  EXPECT_EQ(IdValues(ids.cuda), IdValues(ids.cpu));

  const Both dst = Output({3, 17});
  cuda()->Copy(f.cuda, dst.cuda);
  EXPECT_EQ(Values(dst.cuda), Values(f.cpu));

  std::vector<float> wrong(10);
  EXPECT_EQ(cuda()->CopyToHost(f.cuda, wrong.data(), 40).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()->CopyFromHost(wrong.data(), 40, f.cuda).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cuda()->Synchronize().ok());
}

TEST_F(CudaBackendTest, CopyFromPageLockedHostMemoryIsCompleteOnReturn) {
  void* raw = nullptr;
  ASSERT_EQ(cudaMallocHost(&raw, 1024 * sizeof(float)), cudaSuccess);
  auto* pinned = static_cast<float*>(raw);
  for (int i = 0; i < 1024; ++i) pinned[i] = static_cast<float>(i);
  absl::StatusOr<Tensor> t = cuda()->Empty({1024}, DType::kF32);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(cuda()->CopyFromHost(pinned, 1024 * sizeof(float), *t).ok());
  // The contract lets the caller overwrite its buffer right away.
  std::memset(pinned, 0, 1024 * sizeof(float));
  const std::vector<float> v = Values(*t);
  cudaFreeHost(pinned);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(v[i], static_cast<float>(i)) << i;
}

TEST_F(CudaBackendTest, ZerosOfEveryDtypeAndEmptyShapes) {
  absl::StatusOr<Tensor> f = cuda()->Zeros({4, 5});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(Values(*f), std::vector<float>(20, 0.0f));
  absl::StatusOr<Tensor> ids = cuda()->Zeros({6}, DType::kI64);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(IdValues(*ids), std::vector<int64_t>(6, 0));
  absl::StatusOr<Tensor> empty = cuda()->Empty({0, 3}, DType::kF32);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(Values(*empty).empty());
  EXPECT_EQ(cuda()->Empty({2, -1}, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda()
                ->Empty({int64_t{1} << 40, int64_t{1} << 40}, DType::kF32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, FreedMemoryIsReusedWithoutCudaMalloc) {
  { ASSERT_TRUE(cuda()->Empty({1000}, DType::kF32).ok()); }
  const CachingAllocator::Stats before = cuda()->allocator_stats();
  EXPECT_EQ(before.blocks_in_use, 0);
  EXPECT_GE(before.blocks_cached, 1);
  { ASSERT_TRUE(cuda()->Empty({999}, DType::kF32).ok()); }
  const CachingAllocator::Stats after = cuda()->allocator_stats();
  EXPECT_EQ(after.raw_allocations, before.raw_allocations);
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  EXPECT_TRUE(cuda()->EmptyCache().ok());
  EXPECT_EQ(cuda()->allocator_stats().bytes_cached, 0u);
}

TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhaustedAndNotSticky) {
  // 1 TiB: more than any GPU has.
  const absl::Status status =
      cuda()->Empty({int64_t{1} << 38}, DType::kF32).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("cuda:0"));
  // Later kernels neither fail nor report the old error as theirs.
  Both x = Random({100}, 1);
  cpu()->Scale(x.cpu, 3.0f);
  cuda()->Scale(x.cuda, 3.0f);
  EXPECT_TRUE(cuda()->Synchronize().ok());
  ExpectEqual(x, "scale after out of memory");
}

TEST_F(CudaBackendTest, EventsOrderOtherStreamsWithoutHostSyncs) {
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
            cudaSuccess);
  const Both x = Random({1 << 16}, 2);
  cuda()->Scale(x.cuda, 2.0f);
  EXPECT_TRUE(cuda()->RecordEvent(event).ok());
  EXPECT_TRUE(cuda()->WaitForEvent(event).ok());
  EXPECT_EQ(cudaEventSynchronize(event), cudaSuccess);
  cpu()->Scale(x.cpu, 2.0f);
  ExpectEqual(x, "scale before the event");
  cudaEventDestroy(event);
}

// --- Linear algebra ----------------------------------------------------------

TEST_F(CudaBackendTest, GemmMatchesCpuForEveryTransposeAndBeta) {
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 0.5f}) {
        // A as [.., m or k] 3-D: Gemm views operands as 2-D.
        const Both a = Random(ta ? Shape{k, m} : Shape{1, m, k}, 1);
        const Both b = Random(tb ? Shape{n, k} : Shape{k, n}, 2);
        // beta == 0 must ignore C entirely, even NaN.
        Both c = Output({m, n});
        if (beta == 0.0f) {
          cpu()->Fill(c.cpu, std::numeric_limits<float>::quiet_NaN());
          cuda()->Fill(c.cuda, std::numeric_limits<float>::quiet_NaN());
        }
        cpu()->Gemm(ta, tb, 0.75f, a.cpu, b.cpu, beta, c.cpu);
        cuda()->Gemm(ta, tb, 0.75f, a.cuda, b.cuda, beta, c.cuda);
        ExpectClose(c, absl::StrCat("ta=", ta, " tb=", tb, " beta=", beta),
                    1e-4, 1e-4);
      }
    }
  }
}

TEST_F(CudaBackendTest, GemmWithEmptyInnerDimensionFollowsBlas) {
  // op(A) [4, 0] and B [0, 3]: A is stored as [0, 4] and transposed, since a
  // [4, 0] tensor has no rows to speak of once viewed as 2-D.
  const Both a = Random({0, 4}, 1), b = Random({0, 3}, 2);
  Both c = Output({4, 3});
  cpu()->Gemm(true, false, 1.0f, a.cpu, b.cpu, 2.0f, c.cpu);
  cuda()->Gemm(true, false, 1.0f, a.cuda, b.cuda, 2.0f, c.cuda);
  ExpectEqual(c, "beta 2");
  cpu()->Fill(c.cpu, std::numeric_limits<float>::quiet_NaN());
  cuda()->Fill(c.cuda, std::numeric_limits<float>::quiet_NaN());
  cpu()->Gemm(true, false, 1.0f, a.cpu, b.cpu, 0.0f, c.cpu);
  cuda()->Gemm(true, false, 1.0f, a.cuda, b.cuda, 0.0f, c.cuda);
  ExpectEqual(c, "beta 0 ignores NaN");
  EXPECT_EQ(Values(c.cuda), std::vector<float>(12, 0.0f));
}

TEST_F(CudaBackendTest, StridedBatchedGemmMatchesCpuWithPaddedLayouts) {
  const int64_t batch = 3, m = 6, n = 5, k = 7;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      GemmBatch g;
      g.batch = batch;
      g.trans_a = ta;
      g.trans_b = tb;
      g.m = m;
      g.n = n;
      g.k = k;
      g.alpha = 1.5f;
      g.beta = 0.25f;
      // Leading dimensions and strides larger than needed: the untouched
      // padding must come out unchanged on both backends.
      g.lda = (ta ? m : k) + 2;
      g.stride_a = (ta ? k : m) * g.lda + 3;
      g.ldb = (tb ? k : n) + 1;
      g.stride_b = (tb ? n : k) * g.ldb + 5;
      g.ldc = n + 3;
      g.stride_c = m * g.ldc + 1;
      const Both a = Random({batch * g.stride_a}, 3);
      const Both b = Random({batch * g.stride_b}, 4);
      Both c = Output({batch * g.stride_c});
      GemmBatch on_cpu = g, on_cuda = g;
      on_cpu.a = a.cpu.data<float>();
      on_cpu.b = b.cpu.data<float>();
      on_cpu.c = c.cpu.data<float>();
      on_cuda.a = a.cuda.data<float>();
      on_cuda.b = b.cuda.data<float>();
      on_cuda.c = c.cuda.data<float>();
      cpu()->GemmStridedBatched(on_cpu);
      cuda()->GemmStridedBatched(on_cuda);
      ExpectClose(c, absl::StrCat("ta=", ta, " tb=", tb), 1e-4, 1e-4);
    }
  }
}

// bf16 mixed precision: both backends round the inputs to bf16 (the same
// rounding, bit for bit) and multiply exactly in fp32, so they differ only
// in the order of accumulation.
TEST_F(CudaBackendTest, Bf16GemmsMatchTheCpuBf16Reference) {
  CudaBackendOptions options;
  options.precision = Precision::kBf16;
  absl::StatusOr<std::unique_ptr<CudaBackend>> created =
      CudaBackend::Create(0, options);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaBackend* bf16 = created->get();
  CpuBackend* cpu16 = CpuBackend::Get(Precision::kBf16);
  auto upload = [&](const Tensor& t) {
    absl::StatusOr<Tensor> out = bf16->Empty(t.shape(), t.dtype());
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(bf16->CopyFromHost(t.raw(), t.bytes(), *out).ok());
    return *out;
  };
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, 1);
      const Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, 2);
      const Tensor c = RandomTensor({m, n}, 3);
      const Tensor ga = upload(a), gb = upload(b), gc = upload(c);
      cpu16->Gemm(ta, tb, 0.75f, a, b, 0.5f, c);
      bf16->Gemm(ta, tb, 0.75f, ga, gb, 0.5f, gc);
      EXPECT_TRUE(AllClose(Values(gc), Values(c), 1e-4, 1e-4))
          << "ta=" << ta << " tb=" << tb;
    }
  }
  // Strided batches (attention's GEMMs) round every batch; at an offset of
  // one float the operands are not 16-byte aligned, which the rounding
  // kernel's vectorized path must notice (4-byte loads instead).
  for (const int64_t offset : {0, 1}) {
    GemmBatch g;
    g.batch = 3;
    g.m = 6;
    g.n = 5;
    g.k = 7;
    g.lda = 7;
    g.stride_a = 6 * 7;
    g.ldb = 5;
    g.stride_b = 7 * 5;
    g.ldc = 5;
    g.stride_c = 6 * 5;
    const Tensor a = RandomTensor({3 * 6 * 7 + offset}, 4),
                 b = RandomTensor({3 * 7 * 5 + offset}, 5);
    const Tensor c = RandomTensor({3 * 6 * 5}, 6);
    const Tensor ga = upload(a), gb = upload(b), gc = upload(c);
    GemmBatch on_cpu = g, on_gpu = g;
    on_cpu.a = a.data<float>() + offset;
    on_cpu.b = b.data<float>() + offset;
    on_cpu.c = c.data<float>();
    on_gpu.a = ga.data<float>() + offset;
    on_gpu.b = gb.data<float>() + offset;
    on_gpu.c = gc.data<float>();
    cpu16->GemmStridedBatched(on_cpu);
    bf16->GemmStridedBatched(on_gpu);
    EXPECT_TRUE(AllClose(Values(gc), Values(c), 1e-4, 1e-4))
        << "operands at an offset of " << offset << " floats";
  }
  EXPECT_TRUE(bf16->Synchronize().ok());
}

// --- Elementwise -------------------------------------------------------------

// The storage casts a bf16 pipeline boundary uses: to bf16 bit for bit the
// CPU's (odd sizes and an offset view take the unaligned path), and back.
TEST_F(CudaBackendTest, Bf16CastsMatchTheCpuBitForBit) {
  for (int64_t n : {1, 7, 4096 + 3}) {
    const Both x = Random({n + 1}, 21, 100.0f);
    const Tensor cpu_x = x.cpu.Rows(1, n + 1), cuda_x = x.cuda.Rows(1, n + 1);
    Tensor cpu_h = *CpuBackend::Get()->Empty({n}, DType::kBF16);
    Tensor cuda_h = *cuda()->Empty({n}, DType::kBF16);
    CpuBackend::Get()->CastToBf16(cpu_x, cpu_h);
    cuda()->CastToBf16(cuda_x, cuda_h);
    std::vector<uint16_t> want(n), got(n);
    std::memcpy(want.data(), cpu_h.raw(), n * 2);
    ASSERT_TRUE(cuda()->CopyToHost(cuda_h, got.data(), n * 2).ok());
    EXPECT_EQ(got, want) << n;
    Tensor cuda_back = *cuda()->Empty({n}, DType::kF32);
    cuda()->CastFromBf16(cuda_h, cuda_back);
    const std::vector<float> back = Values(cuda_back);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &back[i], sizeof(bits));
      EXPECT_EQ(bits, static_cast<uint32_t>(want[i]) << 16) << i;
    }
  }
}

// A parameter's bf16 copy as a GEMM operand (Parameter::gemm_value): bit
// for bit the GEMM that rounds the f32 operand on the call, in every
// transpose, on a bf16 backend.
TEST_F(CudaBackendTest, Bf16OperandsGiveWhatRoundingOnTheCallGives) {
  CudaBackendOptions options;
  options.precision = Precision::kBf16;
  absl::StatusOr<std::unique_ptr<CudaBackend>> be =
      CudaBackend::Create(0, options);
  ASSERT_TRUE(be.ok()) << be.status();
  CudaBackend* b16 = be->get();
  auto upload = [&](const Tensor& host) {
    Tensor t = *b16->Empty(host.shape(), DType::kF32);
    const std::vector<float> v = Values(host);
    EXPECT_TRUE(b16->CopyFromHost(v.data(), v.size() * 4, t).ok());
    return t;
  };
  for (bool tb : {false, true}) {
    const Tensor x = upload(RandomTensor({9, 24}, 1));
    const Tensor w =
        upload(RandomTensor(tb ? Shape{17, 24} : Shape{24, 17}, 2));
    Tensor w16 = *b16->Empty(w.shape(), DType::kBF16);
    b16->CastToBf16(w, w16);
    Tensor rounded = *b16->Empty({9, 17}, DType::kF32);
    Tensor copied = *b16->Empty({9, 17}, DType::kF32);
    b16->Gemm(false, tb, 1.0f, x, w, 0.0f, rounded);
    b16->Gemm(false, tb, 1.0f, x, w16, 0.0f, copied);
    EXPECT_EQ(Values(copied), Values(rounded)) << "trans_b " << tb;
  }
  EXPECT_TRUE(b16->Synchronize().ok());
}

TEST_F(CudaBackendTest, ElementwiseKernelsMatchCpu) {
  const Shape shape = {7, 300};
  Both x = Random(shape, 1);
  cpu()->Fill(x.cpu, 2.5f);
  cuda()->Fill(x.cuda, 2.5f);
  ExpectEqual(x, "fill");

  x = Random(shape, 2);
  cpu()->Scale(x.cpu, -0.3f);
  cuda()->Scale(x.cuda, -0.3f);
  ExpectEqual(x, "scale");

  const Both a = Random(shape, 3);
  Both y = Random(shape, 4);
  cpu()->Axpy(0.7f, a.cpu, y.cpu);
  cuda()->Axpy(0.7f, a.cuda, y.cuda);
  ExpectClose(y, "axpy", 1e-6, 1e-6);  // Only an FMA may differ.

  Both out = Output(shape);
  cpu()->Add(a.cpu, x.cpu, out.cpu);
  cuda()->Add(a.cuda, x.cuda, out.cuda);
  ExpectEqual(out, "add");

  // Bias over the rows of a 3-D tensor.
  const Both bias = Random({300}, 5);
  Both z = Random({2, 7, 300}, 6);
  cpu()->AddRowBias(z.cpu, bias.cpu);
  cuda()->AddRowBias(z.cuda, bias.cuda);
  ExpectEqual(z, "add row bias");
}

TEST_F(CudaBackendTest, SumRowsMatchesCpuForSmallAndTallInputs) {
  // Tall inputs take the two-pass path with several row chunks.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {3, 7}, {1000, 33}, {5000, 1}, {257, 1100}};
  for (const auto& [rows, cols] : shapes) {
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      const Both x = Random({rows, cols}, 7);
      Both out = Random({cols}, 8);
      cpu()->SumRows(x.cpu, beta, out.cpu);
      cuda()->SumRows(x.cuda, beta, out.cuda);
      // Sums of `rows` unit normals: error grows like sqrt(rows).
      ExpectClose(out, absl::StrCat(rows, "x", cols, " beta=", beta), 1e-4,
                  1e-5 * std::sqrt(static_cast<double>(rows)));
    }
  }
  EXPECT_TRUE(cuda()->Synchronize().ok());
}

TEST_F(CudaBackendTest, ReluAndItsGradientMatchCpuExactly) {
  const Both x = Random({1001}, 1), dy = Random({1001}, 2);
  Both y = Output({1001}), dx = Output({1001});
  cpu()->Relu(x.cpu, y.cpu);
  cuda()->Relu(x.cuda, y.cuda);
  ExpectEqual(y, "relu");
  cpu()->ReluBackward(x.cpu, dy.cpu, dx.cpu);
  cuda()->ReluBackward(x.cuda, dy.cuda, dx.cuda);
  ExpectEqual(dx, "relu backward");
}

TEST_F(CudaBackendTest, GeluBothFormsAndGradientsMatchCpu) {
  const Both x = Random({2001}, 3, 3.0f), dy = Random({2001}, 4);
  for (bool tanh : {false, true}) {
    Both y = Output({2001}), dx = Output({2001});
    cpu()->Gelu(x.cpu, tanh, y.cpu);
    cuda()->Gelu(x.cuda, tanh, y.cuda);
    ExpectClose(y, absl::StrCat("gelu tanh=", tanh), 1e-5, 1e-6);
    cpu()->GeluBackward(x.cpu, tanh, dy.cpu, dx.cpu);
    cuda()->GeluBackward(x.cuda, tanh, dy.cuda, dx.cuda);
    ExpectClose(dx, absl::StrCat("gelu backward tanh=", tanh), 1e-4, 1e-5);
  }
}

// --- Layer normalization -----------------------------------------------------

TEST_F(CudaBackendTest, LayerNormAndBothBackwardsMatchCpu) {
  // Narrow rows (one warp), wide rows (many threads per row), and enough
  // rows for the weight gradient's two-pass column sum.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {13, 50}, {5, 1000}, {700, 64}};
  for (const auto& [rows, cols] : shapes) {
    for (bool affine : {true, false}) {
      const std::string what =
          absl::StrCat(rows, "x", cols, " affine=", affine);
      // A large mean: the two-pass variance must not lose it.
      const Both x = Random({rows, cols}, 1, 2.0f);
      cpu()->AddRowBias(x.cpu, FromVector({1}, {10.0f}));
      cuda()->AddRowBias(x.cuda, ToCuda(FromVector({1}, {10.0f})));
      const Both gamma = Random({cols}, 2), beta = Random({cols}, 3);
      Both y = Output({rows, cols}), mean = Output({rows}),
           rstd = Output({rows});
      const Tensor no_tensor;
      cpu()->LayerNorm(x.cpu, affine ? gamma.cpu : no_tensor,
                       affine ? beta.cpu : no_tensor, 1e-5f, y.cpu, mean.cpu,
                       rstd.cpu);
      cuda()->LayerNorm(x.cuda, affine ? gamma.cuda : no_tensor,
                        affine ? beta.cuda : no_tensor, 1e-5f, y.cuda,
                        mean.cuda, rstd.cuda);
      ExpectClose(y, "layernorm y " + what, 1e-4, 1e-4);
      ExpectClose(mean, "layernorm mean " + what);
      ExpectClose(rstd, "layernorm rstd " + what);

      // Backward from the CPU's statistics on both sides, so each kernel is
      // checked on its own.
      const Tensor mean_cuda = ToCuda(mean.cpu), rstd_cuda = ToCuda(rstd.cpu);
      const Both dy = Random({rows, cols}, 4);
      Both dx = Output({rows, cols});
      cpu()->LayerNormBackwardInput(x.cpu, affine ? gamma.cpu : no_tensor,
                                    mean.cpu, rstd.cpu, dy.cpu, dx.cpu);
      cuda()->LayerNormBackwardInput(x.cuda, affine ? gamma.cuda : no_tensor,
                                     mean_cuda, rstd_cuda, dy.cuda, dx.cuda);
      ExpectClose(dx, "layernorm dx " + what, 1e-4, 1e-4);

      if (affine) {
        // Accumulates into gradients that already hold values.
        Both dgamma = Random({cols}, 5), dbeta = Random({cols}, 6);
        cpu()->LayerNormBackwardWeight(x.cpu, mean.cpu, rstd.cpu, dy.cpu,
                                       dgamma.cpu, dbeta.cpu);
        cuda()->LayerNormBackwardWeight(x.cuda, mean_cuda, rstd_cuda, dy.cuda,
                                        dgamma.cuda, dbeta.cuda);
        const double atol = 1e-5 * std::sqrt(static_cast<double>(rows));
        ExpectClose(dgamma, "layernorm dgamma " + what, 1e-4, atol);
        ExpectClose(dbeta, "layernorm dbeta " + what, 1e-4, atol);
      }
    }
  }
}

// --- Attention pieces --------------------------------------------------------

TEST_F(CudaBackendTest, SoftmaxWithAndWithoutCausalMaskMatchesCpu) {
  // Square score matrices as attention makes them, a non-square one (more
  // keys than queries), and rows wide enough for many threads per row.
  const std::vector<Shape> shapes = {{2, 3, 5, 5}, {4, 6, 9}, {2, 40, 2000}};
  for (const Shape& shape : shapes) {
    for (bool causal : {false, true}) {
      const std::string what =
          absl::StrCat(ShapeString(shape), " causal=", causal);
      const Both x = Random(shape, 1, 4.0f);
      Both y = Output(shape);
      cpu()->Softmax(x.cpu, 0.3f, causal, y.cpu);
      cuda()->Softmax(x.cuda, 0.3f, causal, y.cuda);
      ExpectClose(y, "softmax " + what, 1e-5, 1e-7);

      const Both dy = Random(shape, 2);
      Both dx = Output(shape);
      cpu()->SoftmaxBackward(y.cpu, dy.cpu, 0.3f, dx.cpu);
      cuda()->SoftmaxBackward(ToCuda(y.cpu), dy.cuda, 0.3f, dx.cuda);
      ExpectClose(dx, "softmax backward " + what, 1e-4, 1e-6);
    }
  }
}

// Document masks: two samples of 3 heads over 7 tokens, the first packing
// documents [0, 3), [3, 4), [4, 7), the second one document.
TEST_F(CudaBackendTest, SoftmaxInSpansMatchesCpu) {
  const std::vector<int64_t> spans = {0, 3, 0, 3, 0, 3, 3, 4, 4, 7, 4, 7, 4, 7,
                                      0, 7, 0, 7, 0, 7, 0, 7, 0, 7, 0, 7, 0, 7};
  const Both s = IdTensor({2, 7, 2}, spans);
  const Shape shape = {2, 3, 7, 7};
  for (bool causal : {false, true}) {
    const Both x = Random(shape, 3, 4.0f);
    Both y = Output(shape);
    cpu()->SoftmaxInSpans(x.cpu, 0.3f, causal, s.cpu, y.cpu);
    cuda()->SoftmaxInSpans(x.cuda, 0.3f, causal, s.cuda, y.cuda);
    ExpectClose(y, absl::StrCat("softmax in spans, causal=", causal), 1e-5,
                1e-7);
  }
}

// Fused attention's own kernels against the float64 reference, within the
// rounding bound derived for them (tests/engine/attention_reference.h), in
// fp32 and bf16: causal and full, grouped-query, documents, head_dim 64 and
// 128 (Llama's), a sequence with a partial block of rows.
TEST_F(CudaBackendTest, FusedAttentionMatchesTheExactResultWithinItsBound) {
  struct Shape5 {
    int64_t b, h, g, s, d;
    bool causal;
    bool documents;
  };
  const Shape5 cases[] = {{2, 4, 2, 67, 64, true, false},
                          {1, 8, 2, 130, 128, true, false},
                          {2, 4, 4, 50, 32, false, false},
                          {2, 4, 1, 90, 64, true, true}};
  using Kind = CudaBackendOptions::AttentionKernel;
  for (const auto& [precision, kind] :
       {std::pair{Precision::kFp32, Kind::kFused},
        std::pair{Precision::kBf16, Kind::kFused},
        std::pair{Precision::kFp32, Kind::kMaterialize},
        std::pair{Precision::kBf16, Kind::kMaterialize}}) {
    CudaBackendOptions options;
    options.precision = precision;
    options.attention = kind;
    absl::StatusOr<std::unique_ptr<CudaBackend>> created =
        CudaBackend::Create(0, options);
    ASSERT_TRUE(created.ok()) << created.status();
    CudaBackend* be = created->get();
    auto upload = [&](const Shape& shape, const auto& values) {
      using T = typename std::decay_t<decltype(values)>::value_type;
      absl::StatusOr<Tensor> out = be->Empty(
          shape, std::is_same_v<T, float> ? DType::kF32 : DType::kI64);
      EXPECT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE(
          be->CopyFromHost(values.data(), values.size() * sizeof(T), *out)
              .ok());
      return *out;
    };
    for (const Shape5& c : cases) {
      const std::string what = absl::StrCat(
          PrecisionName(precision), " b", c.b, " h", c.h, " g", c.g, " s", c.s,
          " d", c.d, " causal ", c.causal, " documents ", c.documents);
      testing_util::Problem p(c.b, c.h, c.g, c.s, c.d, c.causal, 21);
      if (c.documents) p.Documents({40, 1, 25});
      const testing_util::Reference ref = testing_util::Compute(
          p, precision == Precision::kBf16 ? std::ldexp(1.0, -8) : 0.0);
      const Tensor q = upload({c.b, c.h, c.s, c.d}, p.q);
      const Tensor k = upload({c.b, c.g, c.s, c.d}, p.k);
      const Tensor v = upload({c.b, c.g, c.s, c.d}, p.v);
      const Tensor dout = upload({c.b, c.h, c.s, c.d}, p.dout);
      AttentionMask mask{.causal = c.causal};
      if (c.documents) mask.spans = upload({c.b, c.s, 2}, p.spans);
      const Tensor out = *be->Empty(q.shape(), DType::kF32);
      const Tensor lse = *be->Empty({c.b, c.h, c.s}, DType::kF32);
      const Tensor dq = *be->Empty(q.shape(), DType::kF32);
      const Tensor dk = *be->Empty(k.shape(), DType::kF32);
      const Tensor dv = *be->Empty(k.shape(), DType::kF32);
      be->Attention(q, k, v, p.scale, mask, out, lse);
      be->AttentionBackward(q, k, v, out, lse, dout, p.scale, mask, dq, dk, dv);
      ASSERT_TRUE(be->Synchronize().ok()) << what;
      EXPECT_TRUE(
          testing_util::WithinBound("out", Values(out), ref.out, ref.out_bound))
          << what;
      EXPECT_TRUE(
          testing_util::WithinBound("dq", Values(dq), ref.dq, ref.dq_bound))
          << what;
      EXPECT_TRUE(
          testing_util::WithinBound("dk", Values(dk), ref.dk, ref.dk_bound))
          << what;
      EXPECT_TRUE(
          testing_util::WithinBound("dv", Values(dv), ref.dv, ref.dv_bound))
          << what;
    }
  }
}

// A head_dim the kernels cannot hold is a clear error at the next
// synchronization, not a crash or a wrong result.
TEST_F(CudaBackendTest, FusedAttentionRefusesAHeadDimItCannotHold) {
  CudaBackendOptions options;
  options.attention = CudaBackendOptions::AttentionKernel::kFused;
  absl::StatusOr<std::unique_ptr<CudaBackend>> created =
      CudaBackend::Create(0, options);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaBackend* be = created->get();
  const Tensor q = *be->Zeros({1, 1, 4, 512});
  const Tensor out = *be->Empty({1, 1, 4, 512}, DType::kF32);
  const Tensor lse = *be->Empty({1, 1, 4}, DType::kF32);
  be->Attention(q, q, q, 0.1f, {}, out, lse);
  const absl::Status s = be->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("head_dim 512"));
  EXPECT_TRUE(be->Synchronize().ok());  // Reported once.
}

TEST_F(CudaBackendTest, SplitAndMergeHeadsMatchCpuExactly) {
  const int64_t b = 2, s = 5, h = 3, d = 4;
  const Both qkv = Random({b, s, 3 * h * d}, 1);
  Both q = Output({b, h, s, d}), k = Output({b, h, s, d}),
       v = Output({b, h, s, d});
  cpu()->SplitHeads(qkv.cpu, h, q.cpu, k.cpu, v.cpu);
  cuda()->SplitHeads(qkv.cuda, h, q.cuda, k.cuda, v.cuda);
  ExpectEqual(q, "q");
  ExpectEqual(k, "k");
  ExpectEqual(v, "v");

  Both dqkv = Output({b, s, 3 * h * d});
  cpu()->SplitHeadsBackward(q.cpu, k.cpu, v.cpu, h, dqkv.cpu);
  cuda()->SplitHeadsBackward(q.cuda, k.cuda, v.cuda, h, dqkv.cuda);
  ExpectEqual(dqkv, "split-heads backward");
  EXPECT_EQ(Values(dqkv.cuda), Values(qkv.cpu));  // A true inverse.

  Both merged = Output({b, s, h * d});
  cpu()->MergeHeads(q.cpu, merged.cpu);
  cuda()->MergeHeads(q.cuda, merged.cuda);
  ExpectEqual(merged, "merge heads");
  Both back = Output({b, h, s, d});
  cpu()->MergeHeadsBackward(merged.cpu, back.cpu);
  cuda()->MergeHeadsBackward(merged.cuda, back.cuda);
  ExpectEqual(back, "merge-heads backward");
}

TEST_F(CudaBackendTest, RopeMatchesCpuWithAndWithoutPositions) {
  // [batch 3, heads 4, seq 50, head_dim 64] with yarn-like frequencies and
  // an attention factor; positions restart per batch (packed documents)
  // and reach 4000, where the angle of pair 0 is thousands of radians:
  // sincosf must be the accurate one. The angles are the same float
  // products on both sides, so only the sines and cosines may differ.
  const int64_t b = 3, h = 4, s = 50, d = 64;
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / d);
  }
  const Tensor f = FromVector({d / 2}, inv_freq);
  const RopeFrequencies cpu_freqs{.inv_freq = f, .attention_factor = 1.25f};
  const RopeFrequencies cuda_freqs{.inv_freq = ToCuda(f),
                                   .attention_factor = 1.25f};
  std::vector<int64_t> positions;
  for (int64_t batch = 0; batch < b; ++batch) {
    for (int64_t i = 0; i < s; ++i) {
      positions.push_back(batch == 2 ? 3950 + i : i % (17 + batch));
    }
  }
  const Both pos = IdTensor({b, s}, positions);
  const Both x = Random({b, h, s, d}, 1);
  for (const bool transpose : {false, true}) {
    Both y = Output({b, h, s, d});
    cpu()->Rope(x.cpu, cpu_freqs, transpose, y.cpu, pos.cpu);
    cuda()->Rope(x.cuda, cuda_freqs, transpose, y.cuda, pos.cuda);
    ExpectClose(y, absl::StrCat("rope with positions, transpose ", transpose),
                1e-5, 1e-5);
    Both z = Output({b, h, s, d});
    cpu()->Rope(x.cpu, cpu_freqs, transpose, z.cpu, Tensor(), 7);
    cuda()->Rope(x.cuda, cuda_freqs, transpose, z.cuda, Tensor(), 7);
    ExpectClose(z, absl::StrCat("rope from 7, transpose ", transpose), 1e-5,
                1e-5);
  }
  // In place.
  Both inplace{FromVector(x.cpu.shape(), Values(x.cpu)), ToCuda(x.cpu)};
  cpu()->Rope(inplace.cpu, cpu_freqs, false, inplace.cpu, pos.cpu);
  cuda()->Rope(inplace.cuda, cuda_freqs, false, inplace.cuda, pos.cuda);
  ExpectClose(inplace, "rope in place", 1e-5, 1e-5);
}

// --- Embedding ---------------------------------------------------------------

TEST_F(CudaBackendTest, EmbeddingMatchesCpuBitwiseAndRejectsBadIds) {
  const int64_t vocab = 11, d = 300;
  // Repeated ids: the backward must add them in token order, like the CPU.
  const Both ids = IdTensor({2, 6}, {3, 0, 3, 10, 7, 3, 0, 1, 2, 3, 10, 5});
  const Both table = Random({vocab, d}, 1);
  Both out = Output({2, 6, d});
  ASSERT_TRUE(cpu()->EmbeddingForward(ids.cpu, table.cpu, out.cpu).ok());
  ASSERT_TRUE(cuda()->EmbeddingForward(ids.cuda, table.cuda, out.cuda).ok());
  ExpectEqual(out, "embedding forward");

  const Both dy = Random({2, 6, d}, 2);
  Both dtable = Random({vocab, d}, 3);
  cpu()->EmbeddingBackward(ids.cpu, dy.cpu, dtable.cpu);
  cuda()->EmbeddingBackward(ids.cuda, dy.cuda, dtable.cuda);
  ExpectEqual(dtable, "embedding backward");

  // The lowest bad position is reported, with the CPU's message.
  const Both bad = IdTensor({5}, {1, 2, 11, -1, 4});
  Both out5 = Output({5, d});
  const absl::Status cpu_status =
      cpu()->EmbeddingForward(bad.cpu, table.cpu, out5.cpu);
  const absl::Status cuda_status =
      cuda()->EmbeddingForward(bad.cuda, table.cuda, out5.cuda);
  EXPECT_EQ(cuda_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_status.message(), cpu_status.message());
  EXPECT_THAT(cuda_status.message(), HasSubstr("token id 11 at position 2"));
  // The backend stays usable after the error.
  EXPECT_TRUE(cuda()->Synchronize().ok());
}

TEST_F(CudaBackendTest, EmbeddingBackwardHandlesManyTokensAndALargeVocab) {
  const int64_t vocab = 5000, n = 4096, d = 40;
  std::vector<int64_t> id_values(n);
  for (int64_t i = 0; i < n; ++i) id_values[i] = (i * 7919) % 97 * 51 % vocab;
  const Both ids = IdTensor({n}, id_values);
  const Both dy = Random({n, d}, 4);
  Both dtable = Random({vocab, d}, 5);
  cpu()->EmbeddingBackward(ids.cpu, dy.cpu, dtable.cpu);
  cuda()->EmbeddingBackward(ids.cuda, dy.cuda, dtable.cuda);
  ExpectEqual(dtable, "embedding backward, many repeats");
  EXPECT_TRUE(cuda()->Synchronize().ok());
}

// --- Losses ------------------------------------------------------------------

TEST_F(CudaBackendTest, MseLossAndGradientMatchCpu) {
  const Both y = Random({64, 33}, 1), t = Random({64, 33}, 2);
  Both dy = Output({64, 33});
  const absl::StatusOr<float> cpu_loss =
      cpu()->MseLoss(y.cpu, t.cpu, 0.25f, dy.cpu);
  const absl::StatusOr<float> cuda_loss =
      cuda()->MseLoss(y.cuda, t.cuda, 0.25f, dy.cuda);
  ASSERT_TRUE(cuda_loss.ok()) << cuda_loss.status();
  EXPECT_NEAR(*cuda_loss, *cpu_loss, 1e-6 * std::abs(*cpu_loss));
  ExpectClose(dy, "mse gradient", 1e-6, 1e-9);

  const Both wrong = Random({5}, 3);
  EXPECT_EQ(cuda()->MseLoss(y.cuda, wrong.cuda, 1.0f, dy.cuda).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, CrossEntropyLossAndGradientMatchCpu) {
  for (int64_t vocab : {10, 3000}) {
    const int64_t n = 37;
    std::vector<int64_t> targets(n);
    for (int64_t i = 0; i < n; ++i) targets[i] = (i * 31 + 5) % vocab;
    const Both t = IdTensor({n}, targets);
    const Both logits = Random({n, vocab}, 1, 3.0f);
    Both d = Output({n, vocab});
    const absl::StatusOr<float> cpu_loss =
        cpu()->CrossEntropyLoss(logits.cpu, t.cpu, 0.5f, d.cpu);
    const absl::StatusOr<float> cuda_loss =
        cuda()->CrossEntropyLoss(logits.cuda, t.cuda, 0.5f, d.cuda);
    ASSERT_TRUE(cuda_loss.ok()) << cuda_loss.status();
    EXPECT_NEAR(*cuda_loss, *cpu_loss, 1e-5 * std::abs(*cpu_loss))
        << "vocab " << vocab;
    ExpectClose(d, absl::StrCat("cross-entropy gradient, vocab ", vocab), 1e-4,
                1e-7);
  }

  // Ignored targets (kIgnoredTarget) leave their rows out of the mean.
  {
    const Both logits = Random({6, 50}, 4, 3.0f);
    const Both t = IdTensor({6}, {3, -1, 7, -1, -1, 49});
    Both d = Output({6, 50});
    const absl::StatusOr<float> cpu_loss =
        cpu()->CrossEntropyLoss(logits.cpu, t.cpu, 0.5f, d.cpu);
    const absl::StatusOr<float> cuda_loss =
        cuda()->CrossEntropyLoss(logits.cuda, t.cuda, 0.5f, d.cuda);
    ASSERT_TRUE(cuda_loss.ok()) << cuda_loss.status();
    EXPECT_NEAR(*cuda_loss, *cpu_loss, 1e-5 * std::abs(*cpu_loss));
    ExpectClose(d, "cross-entropy gradient with ignored targets", 1e-4, 1e-7);
  }

  // Bad targets: the lowest position, with the CPU's message.
  const Both logits = Random({4, 6}, 2);
  const Both bad = IdTensor({4}, {0, 5, 9, 6});
  Both d = Output({4, 6});
  const absl::StatusOr<float> cpu_loss =
      cpu()->CrossEntropyLoss(logits.cpu, bad.cpu, 1.0f, d.cpu);
  const absl::StatusOr<float> cuda_loss =
      cuda()->CrossEntropyLoss(logits.cuda, bad.cuda, 1.0f, d.cuda);
  EXPECT_EQ(cuda_loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_loss.status().message(), cpu_loss.status().message());
  const Both few = IdTensor({3}, {0, 1, 2});
  EXPECT_EQ(cuda()
                ->CrossEntropyLoss(logits.cuda, few.cuda, 1.0f, d.cuda)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// --- Optimizers --------------------------------------------------------------

TEST_F(CudaBackendTest, SgdUpdatesMatchCpu) {
  struct Case {
    SgdParams p;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{.lr = 0.1f}, "plain"},
      {{.lr = 0.1f, .momentum = 0.9f, .first_step = true}, "momentum first"},
      {{.lr = 0.05f,
        .momentum = 0.9f,
        .dampening = 0.1f,
        .weight_decay = 0.01f,
        .first_step = false},
       "momentum, dampening, decay"},
      {{.lr = 0.05f, .momentum = 0.8f, .nesterov = true, .first_step = false},
       "nesterov"},
  };
  for (const Case& c : cases) {
    Both w = Random({1000}, 1), buf = Random({1000}, 3);
    const Both g = Random({1000}, 2);
    cpu()->SgdUpdate(c.p, w.cpu, g.cpu, buf.cpu);
    cuda()->SgdUpdate(c.p, w.cuda, g.cuda, buf.cuda);
    ExpectClose(w, absl::StrCat("sgd param: ", c.what), 1e-5, 1e-6);
    ExpectClose(buf, absl::StrCat("sgd momentum: ", c.what), 1e-5, 1e-6);
  }
}

TEST_F(CudaBackendTest, AdamAndAdamWUpdatesMatchCpu) {
  for (bool decoupled : {false, true}) {
    const AdamParams p = {.lr = 1e-2f,
                          .weight_decay = 0.1f,
                          .decoupled_weight_decay = decoupled,
                          .step = 3};
    Both w = Random({1000}, 1), m = Random({1000}, 3, 0.1f);
    Both v = Random({1000}, 4, 0.1f);
    // exp_avg_sq is a running mean of squares: never negative.
    cpu()->Relu(v.cpu, v.cpu);
    cuda()->Relu(v.cuda, v.cuda);
    const Both g = Random({1000}, 2);
    cpu()->AdamUpdate(p, w.cpu, g.cpu, m.cpu, v.cpu);
    cuda()->AdamUpdate(p, w.cuda, g.cuda, m.cuda, v.cuda);
    const std::string what = decoupled ? "adamw" : "adam";
    ExpectClose(w, what + " param", 1e-5, 1e-6);
    ExpectClose(m, what + " exp_avg", 1e-5, 1e-7);
    ExpectClose(v, what + " exp_avg_sq", 1e-5, 1e-7);
  }
}

// The multi-tensor update (one launch per 24 parameters, the clipping
// scale folded in) gives the one-launch-per-parameter bits: 30 tensors of
// assorted sizes (two launches), scaled and not.
TEST_F(CudaBackendTest, AdamUpdateManyEqualsScaleThenAdamPerParameter) {
  const AdamParams p = {.lr = 1e-2f,
                        .weight_decay = 0.1f,
                        .decoupled_weight_decay = true,
                        .step = 5};
  for (const float scale : {1.0f, 0.375f}) {
    std::vector<AdamSlot> many, one;
    for (int t = 0; t < 30; ++t) {
      const int64_t n = 1 + 997 * t;
      auto copies = [&](uint32_t seed, float sd) {
        const Tensor c = RandomTensor({n}, seed + 100 * t, sd);
        return std::pair{ToCuda(c), ToCuda(c)};
      };
      auto [w1, w2] = copies(1, 1.0f);
      auto [g1, g2] = copies(2, 1.0f);
      auto [m1, m2] = copies(3, 0.1f);
      auto [v1, v2] = copies(4, 0.1f);
      cuda()->Relu(v1, v1);  // A running mean of squares: never negative.
      cuda()->Relu(v2, v2);
      many.push_back({w1, g1, m1, v1});
      one.push_back({w2, g2, m2, v2});
    }
    cuda()->AdamUpdateMany(p, scale, many);
    for (const AdamSlot& s : one) {
      if (scale != 1.0f) cuda()->Scale(s.grad, scale);
      cuda()->AdamUpdate(p, s.param, s.grad, s.exp_avg, s.exp_avg_sq);
    }
    for (size_t t = 0; t < many.size(); ++t) {
      EXPECT_EQ(Values(many[t].param), Values(one[t].param)) << t;
      EXPECT_EQ(Values(many[t].grad), Values(one[t].grad)) << t;
      EXPECT_EQ(Values(many[t].exp_avg), Values(one[t].exp_avg)) << t;
      EXPECT_EQ(Values(many[t].exp_avg_sq), Values(one[t].exp_avg_sq)) << t;
    }
  }
}

TEST_F(CudaBackendTest, SumSquaresMatchesCpuInDouble) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
    const Both x = Random({n}, 1);
    const absl::StatusOr<double> c = cpu()->SumSquares(x.cpu);
    const absl::StatusOr<double> g = cuda()->SumSquares(x.cuda);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_NEAR(*g, *c, 1e-12 * *c) << n;
  }
}

// --- Determinism -------------------------------------------------------------

TEST_F(CudaBackendTest, ReductionsAreBitwiseRepeatable) {
  const Both x = Random({3000, 70}, 1);
  const Both targets = IdTensor({3000}, std::vector<int64_t>(3000, 4));
  auto run = [&] {
    std::vector<float> bits;
    absl::StatusOr<Tensor> sums = cuda()->Zeros({70});
    cuda()->SumRows(x.cuda, 0.0f, *sums);
    absl::StatusOr<Tensor> y = cuda()->Empty({3000, 70}, DType::kF32);
    absl::StatusOr<Tensor> mean = cuda()->Empty({3000}, DType::kF32);
    absl::StatusOr<Tensor> rstd = cuda()->Empty({3000}, DType::kF32);
    absl::StatusOr<Tensor> dg = cuda()->Zeros({70});
    absl::StatusOr<Tensor> db = cuda()->Zeros({70});
    cuda()->LayerNorm(x.cuda, Tensor(), Tensor(), 1e-5f, *y, *mean, *rstd);
    cuda()->LayerNormBackwardWeight(x.cuda, *mean, *rstd, x.cuda, *dg, *db);
    absl::StatusOr<Tensor> dlogits = cuda()->Empty({3000, 70}, DType::kF32);
    const float loss =
        *cuda()->CrossEntropyLoss(x.cuda, targets.cuda, 1.0f, *dlogits);
    const double squares = *cuda()->SumSquares(x.cuda);
    for (const Tensor* t : {&*sums, &*y, &*dg, &*db, &*dlogits}) {
      const std::vector<float> v = Values(*t);
      bits.insert(bits.end(), v.begin(), v.end());
    }
    bits.push_back(loss);
    bits.push_back(static_cast<float>(squares));
    bits.push_back(static_cast<float>(squares - static_cast<float>(squares)));
    return bits;
  };
  const std::vector<float> first = run();
  for (int i = 0; i < 3; ++i) {
    const std::vector<float> again = run();
    ASSERT_EQ(again.size(), first.size());
    EXPECT_EQ(
        std::memcmp(again.data(), first.data(), first.size() * sizeof(float)),
        0)
        << "run " << i + 1 << " differs";
  }
}

}  // namespace
}  // namespace conveyor::engine
