// GPU benchmarks of the CUDA backend, for the GPU-backend issue's targets.
// Every figure comes from device 0 (after CUDA_VISIBLE_DEVICES); the JSON
// context names it ("gpu"). Without a visible GPU every benchmark reports the
// error "no GPU" and the binary still exits 0.
//
//  - gemm/backend/<shape> and gemm/cublas/<shape>: the GEMMs of one
//    microbatch of the JaxPP transformer (2 sequences x 2048 tokens, d_model
//    1024, 8 heads, MLP 4096), forward and backward, through
//    Backend::Gemm / GemmStridedBatched on a CudaBackend, and as the direct
//    cuBLAS call the backend makes (same operands, compute type, math mode,
//    workspace size and stream). CUDA events around kCallsPerIteration calls;
//    the manual time is one GEMM; counter TFLOPs. Target: backend >= 95% of
//    cuBLAS.
//  - step/conveyor_transformer: one training step of the whole transformer
//    (8 post-norm blocks, sequence 2048, batch 8 in 4 microbatches, MSE,
//    AdamW) as ONE stage trained by job::InProcessTrainer, data read from
//    a tensors file and uploaded each microbatch, as a job runs.
//  - step/conveyor_transformer_resident: the same step with the data already
//    on the GPU (Stage + Optimizer driven directly), the counterpart of a
//    PyTorch loop over device tensors.
//    bench/torch_gpu_reference.py times the same model in PyTorch;
//    scripts/bench prints the ratio (target <= 1.2 first, <= 1.0 in the end).
//
// Environment:
//   CONVEYOR_GPU_PRECISION=fp32|tf32|bf16  (fp32: the backend's default, full
//     fp32 GEMMs; tf32: allow_tf32; bf16: Precision::kBf16)
//   CONVEYOR_PROFILE_STEPS=N  after the warm-up of a step benchmark, runs N
//     more steps between cudaProfilerStart/Stop, each in an NVTX range
//     "conveyor_step" (bench/gpu_idle_gaps.sh reads them under nsys).
#include <cublas_v2.h>
#include <cuda_profiler_api.h>  // defines: cudaProfilerStart, cudaProfilerStop
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>  // defines: nvtxRangePushA, nvtxRangePop
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"  // defines: RegisterBenchmark, benchmark::State
#include "common/status_macros.h"  // defines: RETURN_IF_ERROR, ASSIGN_OR_RETURN
#include "engine/cuda/cublas_util.h"  // defines: CONVEYOR_CUBLAS_CHECK, CublasHandlePtr
#include "engine/cuda/cuda_backend.h"  // defines: CudaBackend
#include "engine/cuda/cuda_status.h"   // defines: CONVEYOR_CUDA_CHECK
#include "engine/cuda/device_info.h"   // defines: ListCudaDevices
#include "engine/device_peak.h"        // defines: GpuPeakFlops
#include "engine/loss.h"               // defines: ComputeLoss
#include "engine/model_spec.h"         // defines: ParseModelSpecYaml
#include "engine/optimizer.h"          // defines: Optimizer
#include "engine/precision.h"          // defines: RoundToBf16
#include "engine/safetensors.h"        // defines: WriteSafetensors
#include "engine/stage.h"              // defines: Stage
#include "job/job_spec.h"              // defines: ParseJobSpec
#include "job/trainer.h"               // defines: InProcessTrainer

namespace conveyor::engine {
namespace {

using job::InProcessTrainer;
using job::JobSpec;
using job::ParseJobSpec;
using job::StepReport;

// --- The model ---------------------------------------------------------------

// The JaxPP notebook's transformer, as one stage.
constexpr int64_t kSeq = 2048, kModel = 1024, kHeads = 8, kMlp = 4096,
                  kBlocks = 8, kBatch = 8, kMicrobatches = 4;
constexpr int64_t kTokensPerMicrobatch = kBatch / kMicrobatches * kSeq;
constexpr int64_t kHeadDim = kModel / kHeads;
constexpr int64_t kSequencesTimesHeads = kBatch / kMicrobatches * kHeads;
// Timed steps per run of a step benchmark, after 2 warm-up steps.
constexpr int kTimedSteps = 20;

// --- Configuration -----------------------------------------------------------

struct Mode {
  std::string name = "fp32";
  CudaBackendOptions options;
  bool bf16() const { return options.precision == Precision::kBf16; }
  cublasComputeType_t compute() const {
    return options.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                              : CUBLAS_COMPUTE_32F;
  }
};

// From CONVEYOR_GPU_PRECISION; aborts on an unknown value, since every
// figure would otherwise be labeled wrong.
const Mode& GetMode() {
  static const Mode* mode = [] {
    auto* m = new Mode;
    const char* env = getenv("CONVEYOR_GPU_PRECISION");
    const std::string value = env == nullptr ? "fp32" : env;
    if (value == "tf32") {
      m->options.allow_tf32 = true;
    } else if (value == "bf16") {
      m->options.precision = Precision::kBf16;
    } else if (value != "fp32" && !value.empty()) {
      fprintf(stderr, "CONVEYOR_GPU_PRECISION must be fp32, tf32 or bf16\n");
      abort();
    }
    m->name = value.empty() ? "fp32" : value;
    return m;
  }();
  return *mode;
}

int ProfileSteps() {
  const char* env = getenv("CONVEYOR_PROFILE_STEPS");
  return env == nullptr ? 0 : std::max(0, atoi(env));
}

bool HaveGpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

// The process's backend on device 0, created on first use and never
// destroyed (benchmarks run to the end of the process). Null, with the error
// reported on `state`, when there is no GPU or creation fails.
CudaBackend* Gpu(benchmark::State& state) {
  if (!HaveGpu()) {
    state.SkipWithError("no GPU");
    return nullptr;
  }
  static auto* created = new absl::StatusOr<std::unique_ptr<CudaBackend>>(
      CudaBackend::Create(0, GetMode().options));
  if (!created->ok()) {
    state.SkipWithError(std::string(created->status().message()).c_str());
    return nullptr;
  }
  return created->value().get();
}

void Fail(benchmark::State& state, const absl::Status& status) {
  state.SkipWithError(std::string(status.ToString()).c_str());
}

// Uniform values in [-1, 1) from a fixed xorshift stream: GEMM speed must
// not depend on the data, but all-zero inputs would draw less power than
// real ones and flatter the clocks.
std::vector<float> RandomHost(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(s >> 40) / static_cast<float>(1 << 23) - 1.0f;
  }
  return v;
}

absl::StatusOr<Tensor> RandomTensor(Backend* be, const Shape& shape,
                                    uint64_t seed) {
  absl::StatusOr<Tensor> t = be->Empty(shape, DType::kF32);
  if (!t.ok()) return t.status();
  const std::vector<float> host = RandomHost(t->numel(), seed);
  absl::Status copied = be->CopyFromHost(host.data(), t->bytes(), *t);
  if (!copied.ok()) return copied;
  return t;
}

// --- GEMMs -------------------------------------------------------------------

// Row-major C [m, n] (+)= op(A) [m, k] op(B) [k, n], `batch` times.
struct GemmShape {
  const char* role;
  bool trans_a, trans_b;
  int64_t batch, m, n, k;
  float beta;  // 1 for the weight gradients, which accumulate.
};

// Every distinct GEMM of one microbatch (T = 4096 tokens): the dense layers'
// forward x W^T (NT), input gradient dy W (NN) and weight gradient dy^T x
// (TN, accumulated) for the QKV projection (fused, [3d, d]), the output
// projection and the two MLP layers; and attention's per-head GEMMs
// (engine/layers/attention.cc), whose backward repeats the forward's
// NT and NN shapes and adds one TN shape (dV and dK).
constexpr GemmShape kShapes[] = {
    {"qkv_fwd", false, true, 1, kTokensPerMicrobatch, 3 * kModel, kModel, 0},
    {"out_fwd", false, true, 1, kTokensPerMicrobatch, kModel, kModel, 0},
    {"mlp_up_fwd", false, true, 1, kTokensPerMicrobatch, kMlp, kModel, 0},
    {"mlp_down_fwd", false, true, 1, kTokensPerMicrobatch, kModel, kMlp, 0},
    {"qkv_dx", false, false, 1, kTokensPerMicrobatch, kModel, 3 * kModel, 0},
    {"out_dx", false, false, 1, kTokensPerMicrobatch, kModel, kModel, 0},
    {"mlp_up_dx", false, false, 1, kTokensPerMicrobatch, kModel, kMlp, 0},
    {"mlp_down_dx", false, false, 1, kTokensPerMicrobatch, kMlp, kModel, 0},
    {"qkv_dw", true, false, 1, 3 * kModel, kModel, kTokensPerMicrobatch, 1},
    {"out_dw", true, false, 1, kModel, kModel, kTokensPerMicrobatch, 1},
    {"mlp_up_dw", true, false, 1, kMlp, kModel, kTokensPerMicrobatch, 1},
    {"mlp_down_dw", true, false, 1, kModel, kMlp, kTokensPerMicrobatch, 1},
    {"scores", false, true, kSequencesTimesHeads, kSeq, kSeq, kHeadDim, 0},
    {"context", false, false, kSequencesTimesHeads, kSeq, kHeadDim, kSeq, 0},
    {"attn_dvdk", true, false, kSequencesTimesHeads, kSeq, kHeadDim, kSeq, 0},
};

// "mlp_up_fwd_NT_4096x4096x1024"; batched: "scores_NT_16x2048x2048x128".
std::string ShapeName(const GemmShape& s) {
  std::string name = absl::StrCat(s.role, "_", s.trans_a ? "T" : "N",
                                  s.trans_b ? "T" : "N", "_");
  if (s.batch > 1) absl::StrAppend(&name, s.batch, "x");
  absl::StrAppend(&name, s.m, "x", s.n, "x", s.k);
  return name;
}

// Device operands of one shape and the GemmBatch over them. With bf16, the
// cuBLAS side multiplies copies of A and B already rounded to bf16 (made
// once, on the host), while the backend rounds its inputs on every call:
// that rounding is part of the backend's cost.
struct GemmOperands {
  Tensor a, b, c;
  GemmBatch g;
  CudaDevicePtr<void> a16, b16;
};

absl::Status UploadBf16(const Tensor& t, CudaDevicePtr<void>& out) {
  std::vector<float> host(t.numel());
  RETURN_IF_ERROR(t.backend()->CopyToHost(t, host.data(), t.bytes()));
  std::vector<uint16_t> bits(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const float r = RoundToBf16(host[i]);
    uint32_t u;
    memcpy(&u, &r, sizeof(u));
    bits[i] = static_cast<uint16_t>(u >> 16);
  }
  void* raw = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&raw, bits.size() * 2), "cudaMalloc"));
  out.reset(raw);
  return CudaStatus(
      cudaMemcpy(raw, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice),
      "upload bf16 operand");
}

absl::StatusOr<std::unique_ptr<GemmOperands>> MakeOperands(CudaBackend* be,
                                                           const GemmShape& s) {
  auto o = std::make_unique<GemmOperands>();
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  auto shape = [&](int64_t rows, int64_t cols) -> Shape {
    return s.batch > 1 ? Shape{s.batch, rows, cols} : Shape{rows, cols};
  };
  ASSIGN_OR_RETURN(o->a, RandomTensor(be, shape(a_rows, a_cols), 1));
  ASSIGN_OR_RETURN(o->b, RandomTensor(be, shape(b_rows, b_cols), 2));
  ASSIGN_OR_RETURN(o->c, RandomTensor(be, shape(s.m, s.n), 3));
  GemmBatch& g = o->g;
  g.batch = s.batch;
  g.trans_a = s.trans_a;
  g.trans_b = s.trans_b;
  g.m = s.m;
  g.n = s.n;
  g.k = s.k;
  g.alpha = 1.0f;
  g.beta = s.beta;
  g.a = o->a.data<float>();
  g.lda = a_cols;
  g.stride_a = a_rows * a_cols;
  g.b = o->b.data<float>();
  g.ldb = b_cols;
  g.stride_b = b_rows * b_cols;
  g.c = o->c.data<float>();
  g.ldc = s.n;
  g.stride_c = s.m * s.n;
  if (GetMode().bf16()) {
    RETURN_IF_ERROR(UploadBf16(o->a, o->a16));
    RETURN_IF_ERROR(UploadBf16(o->b, o->b16));
  }
  return o;
}

// A cuBLAS handle set up as CudaBackend::Create sets up its own: on the
// backend's stream, with a workspace of the same size, default math mode.
absl::StatusOr<cublasHandle_t> DirectCublas(CudaBackend* be) {
  static absl::StatusOr<cublasHandle_t>* handle = [be] {
    auto make = [be]() -> absl::StatusOr<cublasHandle_t> {
      cublasHandle_t raw = nullptr;
      RETURN_IF_ERROR(CublasStatus(cublasCreate(&raw), "cublasCreate"));
      CublasHandlePtr owned(raw);
      RETURN_IF_ERROR(
          CublasStatus(cublasSetStream(raw, be->stream()), "cublasSetStream"));
      const size_t bytes = GetMode().options.cublas_workspace_bytes;
      if (bytes > 0) {
        void* workspace = nullptr;
        RETURN_IF_ERROR(CudaStatus(cudaMalloc(&workspace, bytes),
                                   "cudaMalloc for the cuBLAS workspace"));
        RETURN_IF_ERROR(CublasStatus(cublasSetWorkspace(raw, workspace, bytes),
                                     "cublasSetWorkspace"));
      }
      RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(raw, CUBLAS_DEFAULT_MATH),
                                   "cublasSetMathMode"));
      return owned.release();  // Kept, with its workspace, for the process.
    };
    return new absl::StatusOr<cublasHandle_t>(make());
  }();
  return *handle;
}

// The call CudaBackend::GemmStridedBatched makes (row-major C = op(A) op(B)
// as column-major C^T = op(B)^T op(A)^T), minus its argument checks. With
// bf16, a16 and b16 are A and B rounded to bf16.
void DirectGemm(cublasHandle_t handle, const GemmBatch& g, const void* a16,
                const void* b16) {
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const bool bf16 = GetMode().bf16();
  const void* a = bf16 ? a16 : static_cast<const void*>(g.a);
  const void* b = bf16 ? b16 : static_cast<const void*>(g.b);
  const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t compute =
      bf16 ? CUBLAS_COMPUTE_32F : GetMode().compute();
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n),
            k = static_cast<int>(g.k);
  if (g.batch == 1) {
    CONVEYOR_CUBLAS_CHECK(cublasGemmEx(
        handle, op_b, op_a, n, m, k, &g.alpha, b, in, static_cast<int>(g.ldb),
        a, in, static_cast<int>(g.lda), &g.beta, g.c, CUDA_R_32F,
        static_cast<int>(g.ldc), compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  CONVEYOR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, op_b, op_a, n, m, k, &g.alpha, b, in, static_cast<int>(g.ldb),
      g.stride_b, a, in, static_cast<int>(g.lda), g.stride_a, &g.beta, g.c,
      CUDA_R_32F, static_cast<int>(g.ldc), g.stride_c,
      static_cast<int>(g.batch), compute, CUBLAS_GEMM_DEFAULT));
}

// Guards the comparison itself: the direct call must compute what the
// backend computes (same operation, transposes and leading dimensions), or
// the two sides would time different GEMMs. Both write a fresh C with
// beta = 0; InternalError when they differ by more than 1e-3 of the largest
// entry (they run the same cuBLAS kernel, so they normally agree exactly).
absl::Status CheckSameResult(CudaBackend* be, cublasHandle_t handle,
                             const GemmOperands& o) {
  ASSIGN_OR_RETURN(Tensor via_backend, be->Empty(o.c.shape(), DType::kF32));
  ASSIGN_OR_RETURN(Tensor direct, be->Empty(o.c.shape(), DType::kF32));
  GemmBatch g = o.g;
  g.beta = 0.0f;
  g.c = via_backend.data<float>();
  be->GemmStridedBatched(g);
  g.c = direct.data<float>();
  DirectGemm(handle, g, o.a16.get(), o.b16.get());
  std::vector<float> want(via_backend.numel()), got(direct.numel());
  RETURN_IF_ERROR(
      be->CopyToHost(via_backend, want.data(), via_backend.bytes()));
  RETURN_IF_ERROR(be->CopyToHost(direct, got.data(), direct.bytes()));
  double scale = 0, diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    diff = std::max(diff, std::abs(static_cast<double>(want[i]) - got[i]));
  }
  if (!(diff <= 1e-3 * scale)) {
    return absl::InternalError(absl::StrCat(
        "the direct cuBLAS call disagrees with the backend: max |diff| ", diff,
        ", max |C| ", scale));
  }
  return absl::OkStatus();
}

// Enough calls per timed interval that event resolution (about 0.5 us) and
// the launch of the first call do not matter, few enough that the benchmark
// library can still pick the iteration count.
constexpr int kCallsPerIteration = 10;
constexpr int kWarmupCalls = 5;

// Times `call` on `stream` with CUDA events: the manual time of an iteration
// is the time of one call; counter TFLOPs over all iterations.
void TimeOnStream(benchmark::State& state, cudaStream_t stream, double flops,
                  const std::function<void()>& call) {
  cudaEvent_t start_raw = nullptr, stop_raw = nullptr;
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&start_raw));
  CudaEventPtr start(start_raw);
  CONVEYOR_CUDA_CHECK(cudaEventCreate(&stop_raw));
  CudaEventPtr stop(stop_raw);
  for (int i = 0; i < kWarmupCalls; ++i) call();
  CONVEYOR_CUDA_CHECK(cudaStreamSynchronize(stream));
  double seconds = 0;
  for (auto _ : state) {
    CONVEYOR_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    for (int i = 0; i < kCallsPerIteration; ++i) call();
    CONVEYOR_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    CONVEYOR_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0;
    CONVEYOR_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    const double per_call = ms / 1e3 / kCallsPerIteration;
    state.SetIterationTime(per_call);
    seconds += per_call;
  }
  if (seconds > 0) {
    state.counters["TFLOPs"] =
        flops * static_cast<double>(state.iterations()) / seconds / 1e12;
  }
}

void SetShapeCounters(benchmark::State& state, const GemmShape& s) {
  state.counters["batch"] = static_cast<double>(s.batch);
  state.counters["m"] = static_cast<double>(s.m);
  state.counters["n"] = static_cast<double>(s.n);
  state.counters["k"] = static_cast<double>(s.k);
}

double Flops(const GemmShape& s) { return 2.0 * s.batch * s.m * s.n * s.k; }

void BM_GemmBackend(benchmark::State& state, const GemmShape& s) {
  CudaBackend* be = Gpu(state);
  if (be == nullptr) return;
  absl::StatusOr<std::unique_ptr<GemmOperands>> o = MakeOperands(be, s);
  if (!o.ok()) return Fail(state, o.status());
  const GemmOperands& ops = **o;
  TimeOnStream(state, be->stream(), Flops(s), [&] {
    if (s.batch == 1) {
      be->Gemm(s.trans_a, s.trans_b, 1.0f, ops.a, ops.b, s.beta, ops.c);
    } else {
      be->GemmStridedBatched(ops.g);
    }
  });
  if (absl::Status synced = be->Synchronize(); !synced.ok()) {
    return Fail(state, synced);
  }
  SetShapeCounters(state, s);
}

void BM_GemmCublas(benchmark::State& state, const GemmShape& s) {
  CudaBackend* be = Gpu(state);
  if (be == nullptr) return;
  absl::StatusOr<cublasHandle_t> handle = DirectCublas(be);
  if (!handle.ok()) return Fail(state, handle.status());
  absl::StatusOr<std::unique_ptr<GemmOperands>> o = MakeOperands(be, s);
  if (!o.ok()) return Fail(state, o.status());
  const GemmOperands& ops = **o;
  if (absl::Status same = CheckSameResult(be, *handle, ops); !same.ok()) {
    return Fail(state, same);
  }
  TimeOnStream(state, be->stream(), Flops(s), [&] {
    DirectGemm(*handle, ops.g, ops.a16.get(), ops.b16.get());
  });
  if (absl::Status synced = be->Synchronize(); !synced.ok()) {
    return Fail(state, synced);
  }
  SetShapeCounters(state, s);
}

// --- Training steps ----------------------------------------------------------

// A tensors file with x and y [kBatch, kSeq, kModel] (one step's samples), in
// a fresh temporary directory that main() removes; written once per process.
std::filesystem::path& DataDir() {
  static std::filesystem::path dir;
  return dir;
}

absl::StatusOr<std::string> DataFile() {
  static absl::StatusOr<std::string>* path = [] {
    auto make = []() -> absl::StatusOr<std::string> {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / "conveyor_gpu_bench_XXXXXX")
              .string();
      if (mkdtemp(tmpl.data()) == nullptr) {
        return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, " failed"));
      }
      DataDir() = tmpl;
      const std::string file = tmpl + "/data.safetensors";
      const size_t n = static_cast<size_t>(kBatch * kSeq * kModel);
      const std::vector<float> x = RandomHost(n, 10), y = RandomHost(n, 20);
      RETURN_IF_ERROR(WriteSafetensors(file, {{.name = "x",
                                               .dtype = DType::kF32,
                                               .shape = {kBatch, kSeq, kModel},
                                               .data = x.data(),
                                               .bytes = n * sizeof(float)},
                                              {.name = "y",
                                               .dtype = DType::kF32,
                                               .shape = {kBatch, kSeq, kModel},
                                               .data = y.data(),
                                               .bytes = n * sizeof(float)}}));
      return file;
    };
    return new absl::StatusOr<std::string>(make());
  }();
  return *path;
}

// The job: what a user would submit for this model on one GPU.
std::string JobYaml(const std::string& data_path) {
  const absl::string_view precision = GetMode().bf16() ? "bf16" : "fp32";
  return absl::StrCat(
      "name: gpu_benchmark_transformer\n"
      "model:\n"
      "  input_shape: [",
      kSeq, ", ", kModel,
      "]\n"
      "  init: {seed: 0}\n"
      "  layers:\n"
      "    - repeat: ",
      kBlocks,
      "\n"
      "      layers:\n"
      "        - transformer_block: {heads: ",
      kHeads, ", mlp_features: ", kMlp,
      ", norm: post}\n"
      "  loss: mse\n"
      "data:\n"
      "  source: tensors\n"
      "  path: \"",
      data_path,
      "\"\n"
      "training: {steps: 1000000, batch_size: ",
      kBatch, ", microbatches: ", kMicrobatches, ", precision: ", precision,
      "}\n"
      "optimizer: {kind: adamw, lr: 0.001, betas: [0.9, 0.999], eps: 1.0e-8, "
      "weight_decay: 0.01}\n");
}

absl::StatusOr<JobSpec> Job() {
  ASSIGN_OR_RETURN(std::string data, DataFile());
  return ParseJobSpec(JobYaml(data), "gpu_benchmark.yaml");
}

// Runs 2 warm-up steps, then (once per benchmark, with
// CONVEYOR_PROFILE_STEPS) the profiled steps, then the timed ones. `step`
// must return with the step's work finished on the GPU (both callers end in
// a Synchronize), so wall time between calls is the step time. A step
// trains `tokens` tokens (tokens_per_s).
void RunSteps(benchmark::State& state, CudaBackend* be, bool& profiled,
              int64_t tokens,
              const std::function<absl::StatusOr<double>()>& step) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 2; ++i) {
    if (absl::StatusOr<double> loss = step(); !loss.ok()) {
      return Fail(state, loss.status());
    }
  }
  if (const int n = ProfileSteps(); n > 0 && !profiled) {
    profiled = true;
    CONVEYOR_CUDA_CHECK(cudaProfilerStart());
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      nvtxRangePushA("conveyor_step");
      absl::StatusOr<double> loss = step();
      nvtxRangePop();
      if (!loss.ok()) return Fail(state, loss.status());
      fprintf(
          stderr, "profiled step %d: %.3f ms\n", i + 1,
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    CONVEYOR_CUDA_CHECK(cudaProfilerStop());
  }
  const CachingAllocator::Stats before = be->allocator_stats();
  double seconds = 0, last_loss = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    nvtxRangePushA("conveyor_step");
    absl::StatusOr<double> loss = step();
    nvtxRangePop();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!loss.ok()) return Fail(state, loss.status());
    state.SetIterationTime(s);
    seconds += s;
    last_loss = *loss;
  }
  const CachingAllocator::Stats after = be->allocator_stats();
  const double steps = static_cast<double>(state.iterations());
  if (seconds <= 0) return;
  state.counters["ms_per_step"] = seconds / steps * 1e3;
  state.counters["tokens_per_s"] = tokens * steps / seconds;
  state.counters["loss"] = last_loss;
  // The caching allocator's promise: no cudaMalloc on the step path.
  state.counters["raw_allocs_timed"] =
      static_cast<double>(after.raw_allocations - before.raw_allocations);
  state.counters["peak_GiB"] =
      static_cast<double>(after.peak_bytes_in_use) / (1 << 30);
}

void BM_StepTrainer(benchmark::State& state) {
  static bool profiled = false;
  CudaBackend* be = Gpu(state);
  if (be == nullptr) return;
  absl::StatusOr<JobSpec> job = Job();
  if (!job.ok()) return Fail(state, job.status());
  // Blocks cached by the GEMM benchmarks go back to the driver first.
  if (absl::Status s = be->EmptyCache(); !s.ok()) return Fail(state, s);
  absl::StatusOr<std::unique_ptr<InProcessTrainer>> trainer =
      InProcessTrainer::Create(be, *job);
  if (!trainer.ok()) return Fail(state, trainer.status());
  // InProcessTrainer::Step ends with Backend::Synchronize.
  RunSteps(state, be, profiled, kBatch * kSeq, [&]() -> absl::StatusOr<double> {
    ASSIGN_OR_RETURN(StepReport report, (*trainer)->Step());
    return report.loss;
  });
}

void BM_StepResident(benchmark::State& state) {
  static bool profiled = false;
  CudaBackend* be = Gpu(state);
  if (be == nullptr) return;
  absl::StatusOr<JobSpec> job = Job();
  if (!job.ok()) return Fail(state, job.status());
  if (absl::Status s = be->EmptyCache(); !s.ok()) return Fail(state, s);
  absl::StatusOr<std::unique_ptr<Stage>> stage =
      Stage::Create(be, job->model, 0);
  if (!stage.ok()) return Fail(state, stage.status());
  if (absl::Status s = (*stage)->InitializeFromSeed(0); !s.ok()) {
    return Fail(state, s);
  }
  ResolveSchedule(job->optimizer, job->training.steps);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(be, job->optimizer, (*stage)->parameters());
  if (!optimizer.ok()) return Fail(state, optimizer.status());
  std::vector<Tensor> xs, ys;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    const Shape shape = {kBatch / kMicrobatches, kSeq, kModel};
    absl::StatusOr<Tensor> x = RandomTensor(be, shape, 10 + mb);
    absl::StatusOr<Tensor> y = RandomTensor(be, shape, 20 + mb);
    if (!x.ok()) return Fail(state, x.status());
    if (!y.ok()) return Fail(state, y.status());
    xs.push_back(*std::move(x));
    ys.push_back(*std::move(y));
  }
  // The trainer's step without its data source: the same microbatch loop,
  // loss scaling and optimizer step.
  RunSteps(state, be, profiled, kBatch * kSeq, [&]() -> absl::StatusOr<double> {
    (*optimizer)->ZeroGrad();
    double loss_sum = 0;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      ASSIGN_OR_RETURN(Tensor out, (*stage)->Forward(mb, xs[mb]));
      ASSIGN_OR_RETURN(
          LossResult loss,
          ComputeLoss(be, job->model.loss, out, ys[mb], 1.0f / kMicrobatches));
      loss_sum += loss.loss;
      RETURN_IF_ERROR((*stage)->Backward(mb, loss.grad).status());
    }
    RETURN_IF_ERROR((*optimizer)->Step().status());
    RETURN_IF_ERROR(be->Synchronize());
    return loss_sum / kMicrobatches;
  });
}

// --- A Llama-3.2-1B-shaped stage (issue 37 (b)) ------------------------------
//
// d_model 2048, 32 query and 8 key/value heads (head_dim 64), SwiGLU 8192,
// RoPE (theta 500000), RMSNorm, vocabulary 128256 with tied embeddings, as
// HF's Llama-3.2-1B; sequence 2048, 4 sequences a step in 4 microbatches,
// cross-entropy on next tokens, AdamW. Blocks: CONVEYOR_GPU_LLAMA_BLOCKS
// (default 16, the model's), fewer where a GPU cannot hold them with AdamW.
// bench/torch_gpu_reference.py --model llama builds the same model.
constexpr int64_t kLlamaModel = 2048, kLlamaHeads = 32, kLlamaKvHeads = 8,
                  kLlamaMlp = 8192, kLlamaVocab = 128256, kLlamaSeq = 2048,
                  kLlamaBatch = 4, kLlamaMicrobatches = 4;

int LlamaBlocks() {
  const char* env = getenv("CONVEYOR_GPU_LLAMA_BLOCKS");
  return env == nullptr ? 16 : std::max(1, atoi(env));
}

std::string LlamaModelYaml(int blocks) {
  return absl::StrCat("input_shape: [", kLlamaSeq,
                      "]\n"
                      "init: {seed: 0}\n"
                      "layers:\n"
                      "  - embedding: {vocab_size: ",
                      kLlamaVocab, ", features: ", kLlamaModel,
                      "}\n"
                      "  - repeat: ",
                      blocks,
                      "\n"
                      "    layers:\n"
                      "      - llama_block: {heads: ",
                      kLlamaHeads, ", kv_heads: ", kLlamaKvHeads,
                      ", mlp_features: ", kLlamaMlp,
                      ", eps: 1.0e-5, rope_theta: 500000}\n"
                      "  - rmsnorm: {eps: 1.0e-5}\n"
                      "  - lm_head: {vocab_size: ",
                      kLlamaVocab,
                      ", tied: true}\n"
                      "loss: cross_entropy\n");
}

// The model FLOPs of one step, as TorchTitan and Megatron count them: 6 per
// parameter per token (forward and backward) for every parameter but the
// embedding lookup's (the tied head's GEMM counts), plus the attention
// products, 12 * layers * heads * head_dim * sequence per token (causal
// masking not discounted). torch_gpu_reference.py's MFU uses this figure.
double LlamaFlopsPerStep(int blocks) {
  const double d = kLlamaModel, hd = d / kLlamaHeads;
  const double per_block = d * d                           // q
                           + 2 * d * (kLlamaKvHeads * hd)  // k, v
                           + d * d                         // o
                           + 3 * d * kLlamaMlp             // gate, up, down
                           + 2 * d;                        // the two norms
  const double params = blocks * per_block + d + kLlamaVocab * d;
  const double tokens = kLlamaBatch * kLlamaSeq;
  return tokens * (6 * params + 12.0 * blocks * kLlamaHeads * hd * kLlamaSeq);
}

void BM_StepLlamaResident(benchmark::State& state) {
  static bool profiled = false;
  CudaBackend* be = Gpu(state);
  if (be == nullptr) return;
  const int blocks = LlamaBlocks();
  absl::StatusOr<ModelSpec> model =
      ParseModelSpecYaml(LlamaModelYaml(blocks), "llama_1b.yaml");
  if (!model.ok()) return Fail(state, model.status());
  if (absl::Status s = be->EmptyCache(); !s.ok()) return Fail(state, s);
  absl::StatusOr<std::unique_ptr<Stage>> stage = Stage::Create(be, *model, 0);
  if (!stage.ok()) return Fail(state, stage.status());
  if (absl::Status s = (*stage)->InitializeFromSeed(0); !s.ok()) {
    return Fail(state, s);
  }
  OptimizerConfig adamw{
      .kind = OptimizerConfig::Kind::kAdamW, .lr = 3e-4, .weight_decay = 0.1};
  ResolveSchedule(adamw, 1000000);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(be, adamw, (*stage)->parameters());
  if (!optimizer.ok()) return Fail(state, optimizer.status());
  // Token ids and their next tokens, one sequence per microbatch.
  const int64_t rows = kLlamaBatch / kLlamaMicrobatches;
  std::vector<Tensor> ids, targets;
  for (int mb = 0; mb < kLlamaMicrobatches; ++mb) {
    std::vector<int64_t> host(rows * (kLlamaSeq + 1));
    uint64_t x = 0x9e3779b97f4a7c15ull * (mb + 1);
    for (int64_t& t : host) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      t = static_cast<int64_t>(x % kLlamaVocab);
    }
    std::vector<int64_t> in, next;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t* row = host.data() + r * (kLlamaSeq + 1);
      in.insert(in.end(), row, row + kLlamaSeq);
      next.insert(next.end(), row + 1, row + 1 + kLlamaSeq);
    }
    absl::StatusOr<Tensor> a = be->Empty({rows, kLlamaSeq}, DType::kI64);
    absl::StatusOr<Tensor> b = be->Empty({rows * kLlamaSeq}, DType::kI64);
    if (!a.ok()) return Fail(state, a.status());
    if (!b.ok()) return Fail(state, b.status());
    if (absl::Status s = be->CopyFromHost(in.data(), a->bytes(), *a); !s.ok()) {
      return Fail(state, s);
    }
    if (absl::Status s = be->CopyFromHost(next.data(), b->bytes(), *b);
        !s.ok()) {
      return Fail(state, s);
    }
    ids.push_back(*std::move(a));
    targets.push_back(*std::move(b));
  }
  be->ResetPeakMemory();
  RunSteps(state, be, profiled, kLlamaBatch * kLlamaSeq,
           [&]() -> absl::StatusOr<double> {
             (*optimizer)->ZeroGrad();
             double loss_sum = 0;
             for (int mb = 0; mb < kLlamaMicrobatches; ++mb) {
               ASSIGN_OR_RETURN(Tensor logits, (*stage)->Forward(mb, ids[mb]));
               ASSIGN_OR_RETURN(
                   LossResult loss,
                   ComputeLoss(be, LossKind::kCrossEntropy, logits, targets[mb],
                               1.0f / kLlamaMicrobatches));
               loss_sum += loss.loss;
               RETURN_IF_ERROR((*stage)->Backward(mb, loss.grad).status());
             }
             RETURN_IF_ERROR((*optimizer)->Step().status());
             RETURN_IF_ERROR(be->Synchronize());
             return loss_sum / kLlamaMicrobatches;
           });
  if (state.counters.count("ms_per_step") == 0) return;
  const double seconds = state.counters["ms_per_step"] / 1e3;
  const double flops = LlamaFlopsPerStep(blocks);
  state.counters["blocks"] = blocks;
  state.counters["flops_per_step"] = flops;
  state.counters["tflops"] = flops / seconds / 1e12;
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  if (devices.ok() && !devices->empty()) {
    const CudaDeviceInfo& d = devices->front();
    const double peak =
        GpuPeakFlops({.compute_major = d.compute_major,
                      .compute_minor = d.compute_minor,
                      .multiprocessors = d.multiprocessors,
                      .clock_khz = static_cast<double>(d.clock_khz)},
                     GetMode().bf16() ? Precision::kBf16 : Precision::kFp32);
    if (peak > 0) {
      state.counters["peak_tflops"] = peak / 1e12;
      state.counters["mfu"] = flops / seconds / peak;
    }
  }
}

void RegisterAll() {
  for (const GemmShape& s : kShapes) {
    const std::string name = ShapeName(s);
    benchmark::RegisterBenchmark(
        ("gemm/backend/" + name).c_str(),
        [s](benchmark::State& state) { BM_GemmBackend(state, s); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(
        ("gemm/cublas/" + name).c_str(),
        [s](benchmark::State& state) { BM_GemmCublas(state, s); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  // A fixed step count: with a time budget instead, the library would run
  // the function several times to size it, and each run builds and
  // initializes the 100M-parameter model again.
  benchmark::RegisterBenchmark("step/conveyor_transformer", BM_StepTrainer)
      ->UseManualTime()
      ->Iterations(kTimedSteps)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("step/conveyor_transformer_resident",
                               BM_StepResident)
      ->UseManualTime()
      ->Iterations(kTimedSteps)
      ->Unit(benchmark::kMillisecond);
  // Few steps: a step takes about a second, and gpu-check has minutes.
  benchmark::RegisterBenchmark("llama/conveyor_llama_1b_resident",
                               BM_StepLlamaResident)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
}

void AddContext() {
  benchmark::AddCustomContext("precision", GetMode().name);
  benchmark::AddCustomContext("cuda_runtime", CudaRuntimeVersionString());
  benchmark::AddCustomContext("cuda_driver", CudaDriverVersionString());
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  if (devices.ok() && !devices->empty()) {
    const CudaDeviceInfo& d = devices->front();
    benchmark::AddCustomContext("gpu", d.name);
    benchmark::AddCustomContext(
        "gpu_compute_capability",
        absl::StrCat(d.compute_major, ".", d.compute_minor));
  } else {
    benchmark::AddCustomContext("gpu", "none");
  }
}

}  // namespace
}  // namespace conveyor::engine

int main(int argc, char** argv) {
  conveyor::engine::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  conveyor::engine::AddContext();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (const std::filesystem::path& dir = conveyor::engine::DataDir();
      !dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  return 0;
}
