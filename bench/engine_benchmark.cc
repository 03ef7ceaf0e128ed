// Engine benchmarks on the CPU backend:
//  - gemm/*: Backend::Gemm against a direct cblas_sgemm call on the same
//    shapes (the dense layer's forward, x W^T), timed alternately in one
//    loop, as GFLOP/s. Target: the backend reaches >= 85% of OpenBLAS.
//  - gemm_gpt/*: each distinct GEMM shape of step/gpt, the same comparison,
//    plus the backend's milliseconds per training step at that shape.
//  - step/*: one training step (M microbatches forward and backward, one
//    AdamW step) of the examples' models and of a Llama decoder block on
//    fixed data, so only compute is timed. bench/torch_reference.py times the
//    identical models in PyTorch; scripts/bench puts the two side by side.
#include <cblas.h>

#include <chrono>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"    // defines: StrCat
#include "benchmark/benchmark.h"     // defines: BENCHMARK, benchmark::State
#include "engine/cpu/cpu_backend.h"  // defines: CpuBackend
#include "engine/init.h"             // defines: InitializeParameter
#include "engine/loss.h"             // defines: ComputeLoss
#include "engine/model_spec.h"       // defines: ParseModelSpecYaml
#include "engine/optimizer.h"        // defines: Optimizer
#include "engine/stage.h"            // defines: Stage

namespace conveyor::engine {
namespace {

Tensor Random(const Shape& shape, uint64_t seed) {
  Tensor t = *CpuBackend::Get()->Empty(shape, DType::kF32);
  (void)InitializeParameter(CpuBackend::Get(), seed, "bench",
                            {InitRule::Kind::kNormal, 1.0}, t);
  return t;
}

// C [m, n] = A [m, k] B^T, B [n, k]: Dense::Forward's GEMM, through the
// backend and as a direct cblas_sgemm call, alternating within each
// iteration. Timing the two side by side keeps the ratio honest on a shared
// machine, where two separately run benchmarks see different load.
void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Tensor a = Random({m, k}, 1), b = Random({n, k}, 2), c = Random({m, n}, 3);
  using Clock = std::chrono::steady_clock;
  Clock::duration backend{}, direct{};
  for (auto _ : state) {
    auto t0 = Clock::now();
    CpuBackend::Get()->Gemm(false, true, 1.0f, a, b, 0.0f, c);
    auto t1 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f,
                a.data<float>(), k, b.data<float>(), k, 0.0f, c.data<float>(),
                n);
    auto t2 = Clock::now();
    benchmark::DoNotOptimize(c.raw());
    backend += t1 - t0;
    direct += t2 - t1;
  }
  const double flops = 2.0 * m * n * k * state.iterations();
  state.counters["backend_GFLOPs"] =
      flops / std::chrono::duration<double>(backend).count() / 1e9;
  state.counters["openblas_GFLOPs"] =
      flops / std::chrono::duration<double>(direct).count() / 1e9;
}

// The dense shapes of examples/mlp.yaml (microbatch 32) and of the
// transformer block (64 tokens x d 64, MLP 256), plus a large square GEMM.
BENCHMARK(BM_Gemm)
    ->Name("gemm")
    ->Args({32, 512, 128})
    ->Args({32, 512, 512})
    ->Args({64, 192, 64})
    ->Args({64, 256, 64})
    ->Args({512, 512, 512})
    ->ArgNames({"m", "n", "k"});

// Every distinct GEMM of one step/gpt step (4 microbatches of 4 x 64
// tokens, d = 128, 4 heads of 32, MLP 512, vocabulary 256), with how often a
// step runs it: 2 blocks x 4 microbatches for a block's GEMMs, 4 for the
// head's. FW is the forward, BI the input gradient, BW the weight gradient
// (accumulated: beta = 1); the attention rows are strided batches over the
// 4 x 4 (sample, head) pairs. docs/performance.md has the table.
struct GptGemm {
  const char* name;
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  float beta;
  int per_step;
};
constexpr GptGemm kGptGemms[] = {
    {"qkv.FW", 1, 256, 384, 128, false, true, 0, 8},
    {"qkv.BI", 1, 256, 128, 384, false, false, 0, 8},
    {"qkv.BW", 1, 384, 128, 256, true, false, 1, 8},
    {"attn_out.FW", 1, 256, 128, 128, false, true, 0, 8},
    {"attn_out.BI", 1, 256, 128, 128, false, false, 0, 8},
    {"attn_out.BW", 1, 128, 128, 256, true, false, 1, 8},
    {"mlp_up.FW", 1, 256, 512, 128, false, true, 0, 8},
    {"mlp_up.BI", 1, 256, 128, 512, false, false, 0, 8},
    {"mlp_up.BW", 1, 512, 128, 256, true, false, 1, 8},
    {"mlp_down.FW", 1, 256, 128, 512, false, true, 0, 8},
    {"mlp_down.BI", 1, 256, 512, 128, false, false, 0, 8},
    {"mlp_down.BW", 1, 128, 512, 256, true, false, 1, 8},
    {"head.FW", 1, 256, 256, 128, false, true, 0, 4},
    {"head.BI", 1, 256, 128, 256, false, false, 0, 4},
    {"head.BW", 1, 256, 128, 256, true, false, 1, 4},
    {"scores.FW", 16, 64, 64, 32, false, true, 0, 8},
    {"context.FW", 16, 64, 32, 64, false, false, 0, 8},
    {"d_probs.BI", 16, 64, 64, 32, false, true, 0, 8},
    {"dv.BI", 16, 64, 32, 64, true, false, 0, 8},
    {"dq.BI", 16, 64, 32, 64, false, false, 0, 8},
    {"dk.BI", 16, 64, 32, 64, true, false, 0, 8},
};

// One GEMM of kGptGemms through Backend::GemmStridedBatched and as the
// same cblas_sgemm calls, alternating as in BM_Gemm. Counters: GFLOP/s of
// each, and the backend's ms per step (time per call x calls per step).
void BM_GptGemm(benchmark::State& state) {
  const GptGemm& g = kGptGemms[state.range(0)];
  state.SetLabel(g.name);
  // Stored shapes: A is [m, k] or, transposed, [k, m]; likewise B.
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  Tensor a = Random({g.batch, a_rows, a_cols}, 1);
  Tensor b = Random({g.batch, b_rows, b_cols}, 2);
  Tensor c = Random({g.batch, g.m, g.n}, 3);
  GemmBatch batch;
  batch.batch = g.batch;
  batch.trans_a = g.trans_a;
  batch.trans_b = g.trans_b;
  batch.m = g.m;
  batch.n = g.n;
  batch.k = g.k;
  batch.beta = g.beta;
  batch.a = a.data<float>();
  batch.lda = a_cols;
  batch.stride_a = a_rows * a_cols;
  batch.b = b.data<float>();
  batch.ldb = b_cols;
  batch.stride_b = b_rows * b_cols;
  batch.c = c.data<float>();
  batch.ldc = g.n;
  batch.stride_c = g.m * g.n;
  using Clock = std::chrono::steady_clock;
  Clock::duration backend{}, direct{};
  for (auto _ : state) {
    auto t0 = Clock::now();
    CpuBackend::Get()->GemmStridedBatched(batch);
    auto t1 = Clock::now();
    for (int64_t i = 0; i < g.batch; ++i) {
      cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                  g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f,
                  batch.a + i * batch.stride_a, a_cols,
                  batch.b + i * batch.stride_b, b_cols, g.beta,
                  batch.c + i * batch.stride_c, g.n);
    }
    auto t2 = Clock::now();
    benchmark::DoNotOptimize(c.raw());
    backend += t1 - t0;
    direct += t2 - t1;
  }
  const double iters = static_cast<double>(state.iterations());
  const double flops = 2.0 * g.batch * g.m * g.n * g.k * iters;
  const double backend_s = std::chrono::duration<double>(backend).count();
  const double direct_s = std::chrono::duration<double>(direct).count();
  state.counters["backend_GFLOPs"] = flops / backend_s / 1e9;
  state.counters["openblas_GFLOPs"] = flops / direct_s / 1e9;
  state.counters["backend_ms_per_step"] = backend_s / iters * 1e3 * g.per_step;
}
BENCHMARK(BM_GptGemm)
    ->Name("gemm_gpt")
    ->DenseRange(0, std::size(kGptGemms) - 1)
    ->ArgName("shape");

constexpr char kMlp[] = R"(
model:
  input_shape: [128]
  init: {seed: 0}
  layers:
    - dense: {features: 512}
    - relu
    - dense: {features: 512}
    - relu
    - dense: {features: 512}
    - relu
    - dense: {features: 128}
  loss: mse
)";

constexpr char kTransformerBlock[] = R"(
model:
  input_shape: [32, 64]
  init: {seed: 0}
  layers:
    - transformer_block: {heads: 4, mlp_features: 256, norm: post}
  loss: mse
)";

// HF's LlamaDecoderLayer at the transformer block's size: the same [32, 64]
// input, 4 heads (2 key/value heads), and a SwiGLU MLP of 172 features, Llama's
// 8/3 ratio, which also matches the parameter count of the block's 256-wide
// two-matrix MLP. Loss, batch and microbatches as step/transformer_block.
constexpr char kLlamaBlock[] = R"(
model:
  input_shape: [32, 64]
  init: {seed: 0}
  layers:
    - llama_block:
        {heads: 4, kv_heads: 2, mlp_features: 172, rope_theta: 10000,
         eps: 1e-6, attention_bias: false}
  loss: mse
)";

// The byte-level GPT of examples/gpt.yaml, whole: two pre-norm causal
// blocks (d = 128, 4 heads, MLP 512) over 64 tokens, a final layernorm and
// the 256-way head, cross-entropy; batch 16 in 4 microbatches, as the
// example trains it (bench/torch_reference.py has the same model).
constexpr char kGpt[] = R"(
model:
  input_shape: [64]
  init: {seed: 0}
  layers:
    - embedding: {vocab_size: 256, features: 128, max_positions: 64}
    - transformer_block: {heads: 4, mlp_features: 512, causal: true, norm: pre}
    - transformer_block: {heads: 4, mlp_features: 512, causal: true, norm: pre}
    - layernorm
    - lm_head: {vocab_size: 256}
  loss: cross_entropy
)";

// The byte-level GPT at the sequence lengths where attention dominates
// (issue 37): four pre-norm causal blocks (d = 128, 4 heads, MLP 512), a
// final layernorm and the 256-way head; batch 16 in 4 microbatches.
// scripts/bench runs these rows on one pinned core against PyTorch's one
// thread on the same core (bench/torch_reference.py's GptLong).
std::string LongGpt(int64_t seq) {
  std::string block =
      "    - transformer_block: {heads: 4, mlp_features: 512, causal: true, "
      "norm: pre}\n";
  return absl::StrCat("model:\n  input_shape: [", seq,
                      "]\n  init: {seed: 0}\n  layers:\n"
                      "    - embedding: {vocab_size: 256, features: 128, "
                      "max_positions: ",
                      seq, "}\n", block, block, block, block,
                      "    - layernorm\n    - lm_head: {vocab_size: 256}\n"
                      "  loss: cross_entropy\n");
}

// Token ids in [0, vocab) as the tokens data source makes them (I64).
Tensor RandomTokens(const Shape& shape, int64_t vocab, uint64_t seed) {
  Tensor t = *CpuBackend::Get()->Empty(shape, DType::kI64);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  int64_t* ids = t.data<int64_t>();
  for (int64_t i = 0; i < NumElements(shape); ++i) {
    x ^= x << 13;  // xorshift64: any spread of ids will do.
    x ^= x >> 7;
    x ^= x << 17;
    ids[i] = static_cast<int64_t>(x % static_cast<uint64_t>(vocab));
  }
  return t;
}

// One training step of a one-stage model: batch split into `microbatches`.
// Token models (token_input, integer targets) get random ids; the others
// random floats.
void TrainStep(benchmark::State& state, const char* yaml, int64_t batch,
               int microbatches) {
  auto fail = [&](const absl::Status& s) {
    state.SkipWithError(std::string(s.message()).c_str());
  };
  absl::StatusOr<ModelSpec> parsed = ParseModelSpecYaml(yaml, "bench.yaml");
  if (!parsed.ok()) return fail(parsed.status());
  const ModelSpec& spec = *parsed;
  Backend* be = CpuBackend::Get();
  auto created = Stage::Create(be, spec, 0);
  if (!created.ok()) return fail(created.status());
  auto& stage = *created;
  if (absl::Status s = stage->InitializeFromSeed(0); !s.ok()) return fail(s);
  auto made =
      Optimizer::Create(be, {.kind = OptimizerConfig::Kind::kAdamW, .lr = 1e-3},
                        stage->parameters());
  if (!made.ok()) return fail(made.status());
  auto& optimizer = *made;
  std::vector<Tensor> x, y;
  Shape in = {batch / microbatches}, out = {batch / microbatches};
  in.insert(in.end(), spec.input_shape.begin(), spec.input_shape.end());
  out.insert(out.end(), spec.output_shape.begin(), spec.output_shape.end());
  Shape targets = {batch / microbatches};
  targets.insert(targets.end(), spec.target_shape.begin(),
                 spec.target_shape.end());
  const int64_t vocab =
      spec.output_shape.empty() ? 0 : spec.output_shape.back();
  for (int mb = 0; mb < microbatches; ++mb) {
    x.push_back(spec.token_input ? RandomTokens(in, vocab, 10 + mb)
                                 : Random(in, 10 + mb));
    y.push_back(spec.integer_targets ? RandomTokens(targets, vocab, 20 + mb)
                                     : Random(out, 20 + mb));
  }
  for (auto _ : state) {
    optimizer->ZeroGrad();
    for (int mb = 0; mb < microbatches; ++mb) {
      absl::StatusOr<Tensor> out_mb = stage->Forward(mb, x[mb]);
      if (!out_mb.ok()) return fail(out_mb.status());
      absl::StatusOr<LossResult> loss =
          ComputeLoss(be, spec.loss, *out_mb, y[mb], 1.0f / microbatches);
      if (!loss.ok()) return fail(loss.status());
      if (auto dx = stage->Backward(mb, loss->grad); !dx.ok()) {
        return fail(dx.status());
      }
    }
    if (auto norm = optimizer->Step(); !norm.ok()) return fail(norm.status());
  }
  state.counters["samples_per_s"] =
      benchmark::Counter(static_cast<double>(batch),
                         benchmark::Counter::kIsIterationInvariantRate);
  if (spec.token_input) {
    state.counters["tokens_per_s"] = benchmark::Counter(
        static_cast<double>(batch * NumElements(spec.input_shape)),
        benchmark::Counter::kIsIterationInvariantRate);
  }
}

void BM_StepMlp(benchmark::State& state) { TrainStep(state, kMlp, 128, 4); }
void BM_StepTransformerBlock(benchmark::State& state) {
  TrainStep(state, kTransformerBlock, 8, 4);
}
void BM_StepLlamaBlock(benchmark::State& state) {
  TrainStep(state, kLlamaBlock, 8, 4);
}
void BM_StepGpt(benchmark::State& state) { TrainStep(state, kGpt, 16, 4); }
void BM_StepGptLong(benchmark::State& state) {
  TrainStep(state, LongGpt(state.range(0)).c_str(), 16, 4);
}
BENCHMARK(BM_StepMlp)
    ->Name("step/mlp")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepTransformerBlock)
    ->Name("step/transformer_block")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepLlamaBlock)
    ->Name("step/llama_block")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StepGpt)
    ->Name("step/gpt")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_StepGptLong)
    ->Name("onecore/gpt")
    ->Arg(128)
    ->Arg(256)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::engine

BENCHMARK_MAIN();
