// Tensor parallelism on a CPU mesh (issue 39's scaling row): one training
// step (4 microbatches forward and backward, the gradient gather, AdamW and
// the slices back) of a wide two-block Llama stage, three ways on the same
// cores:
//   tp/T1_all_cores  one Stage, the kernels and OpenBLAS on every core (the
//                    baseline: what a user runs without tensor parallelism)
//   tp/T1_one_core   one Stage on one core (what one rank of T = 2 gets)
//   tp/T2            TensorParallelStage, 2 ranks of one core each
// scripts/bench prints T1_all_cores / T2 against the target (>= 1.6 on two
// cores) and T1_one_core / T2 beside it.
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"  // defines: BENCHMARK, benchmark::State
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/parallel.h"
#include "engine/init.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "engine/stage.h"
#include "engine/tensor_parallel_stage.h"

namespace conveyor::engine {
namespace {

// d 512, 8 heads of 64, hidden 1536, sequence 128: wide enough that each
// rank's GEMMs are hundreds of MFLOP, as a real stage's are.
constexpr char kWideLlama[] =
    "model:\n  input_shape: [128, 512]\n  init: {seed: 1}\n  loss: mse\n"
    "  layers:\n"
    "    - llama_block: {heads: 8, kv_heads: 8, mlp_features: 1536}\n"
    "    - llama_block: {heads: 8, kv_heads: 8, mlp_features: 1536}\n";
constexpr int kMicrobatches = 4;
constexpr int64_t kRows = 2;

Tensor Random(const Shape& shape, uint64_t seed, double scale) {
  Tensor t = *CpuBackend::Get()->Empty(shape, DType::kF32);
  (void)InitializeParameter(CpuBackend::Get(), seed, "bench",
                            {InitRule::Kind::kNormal, scale}, t);
  return t;
}

// tensor_parallel 0: one Stage; otherwise a TensorParallelStage over that
// many CPU devices. `threads`: the CPU kernels' threads (per rank).
void Step(benchmark::State& state, int tensor_parallel, int threads) {
  auto fail = [&](const absl::Status& s) {
    state.SkipWithError(std::string(s.message()).c_str());
  };
  absl::StatusOr<ModelSpec> spec = ParseModelSpecYaml(kWideLlama, "tp.yaml");
  if (!spec.ok()) return fail(spec.status());
  Backend* cpu = CpuBackend::Get();
  const int before = CpuThreads();
  SetCpuThreads(threads);
  std::unique_ptr<MeshCollective> mesh;
  std::unique_ptr<PipelineStage> stage;
  if (tensor_parallel == 0) {
    auto made = Stage::Create(cpu, *spec, 0);
    if (!made.ok()) return fail(made.status());
    stage = *std::move(made);
  } else {
    mesh =
        *CreateHostMeshCollective(std::vector<Backend*>(tensor_parallel, cpu));
    auto made =
        TensorParallelStage::Create(mesh.get(), *spec, 0, tensor_parallel);
    if (!made.ok()) return fail(made.status());
    stage = *std::move(made);
  }
  if (absl::Status s = stage->InitializeFromSeed(1); !s.ok()) return fail(s);
  auto optimizer = Optimizer::Create(
      cpu, {.kind = OptimizerConfig::Kind::kAdamW, .lr = 1e-4},
      stage->parameters());
  if (!optimizer.ok()) return fail(optimizer.status());
  std::vector<Tensor> x, dy;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    x.push_back(Random({kRows, 128, 512}, 10 + mb, 1.0));
    dy.push_back(Random({kRows, 128, 512}, 20 + mb, 1e-3));
  }
  for (auto _ : state) {
    (*optimizer)->ZeroGrad();
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      if (auto y = stage->Forward(mb, x[mb]); !y.ok()) return fail(y.status());
    }
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      if (auto dx = stage->BackwardInput(mb, dy[mb]); !dx.ok()) {
        return fail(dx.status());
      }
      if (absl::Status s = stage->BackwardWeight(mb); !s.ok()) return fail(s);
    }
    if (absl::Status s = stage->BeforeOptimizerStep(); !s.ok()) return fail(s);
    if (auto norm = (*optimizer)->Step(); !norm.ok()) {
      return fail(norm.status());
    }
    if (absl::Status s = stage->AfterOptimizerStep(); !s.ok()) return fail(s);
  }
  SetCpuThreads(before);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kMicrobatches * kRows * 128),
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AllCores(benchmark::State& state) { Step(state, 0, CpuThreads()); }
void BM_OneCore(benchmark::State& state) { Step(state, 0, 1); }
void BM_T2(benchmark::State& state) { Step(state, 2, 1); }
BENCHMARK(BM_AllCores)
    ->Name("tp/T1_all_cores")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OneCore)
    ->Name("tp/T1_one_core")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_T2)->Name("tp/T2")->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::engine

BENCHMARK_MAIN();
