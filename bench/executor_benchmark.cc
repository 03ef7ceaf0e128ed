// Executor overhead: the time StageExecutor spends per action beyond the
// layers' own compute, which issue 4 targets at <= 10 us (median).
//
// One rank holds four stages of one-feature dense layers (compute of well
// under a microsecond each) on the in-memory hub, so each step's time is
// almost all executor work: tag bookkeeping, channel self-delivery, stash
// handling, the loss, and the optimizer step. Reported per action.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"     // defines: BENCHMARK, benchmark::State
#include "engine/cpu/cpu_backend.h"  // defines: CpuBackend
#include "engine/model_spec.h"       // defines: ParseModelSpecYaml
#include "engine/stage.h"            // defines: Stage
#include "job/job_spec.h"            // defines: ModelSampleShapes
#include "scheduler/generators.h"    // defines: GenerateSchedule
#include "transport/in_memory_channel.h"  // defines: InMemoryHub
#include "worker/stage_executor.h"        // defines: StageExecutor

namespace conveyor::worker {
namespace {

void BM_ExecutorOverhead(benchmark::State& state) {
  const int stages = 4, microbatches = static_cast<int>(state.range(0));
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += "    - dense: {features: 1}\n";
  }
  auto spec = engine::ParseModelSpecYaml(
      absl::StrCat("model:\n  input_shape: [1]\n  init: {seed: 0}\n  layers:\n",
                   layers, "  loss: mse\n"),
      "bench.yaml");
  if (!spec.ok()) return state.SkipWithError("model spec");
  engine::Backend* be = engine::CpuBackend::Get();
  std::vector<std::unique_ptr<engine::Stage>> owned;
  std::map<int, engine::PipelineStage*> by_index;
  std::vector<engine::Parameter*> params;
  for (int s = 0; s < stages; ++s) {
    owned.push_back(*engine::Stage::Create(be, *spec, s));
    (void)owned.back()->InitializeFromSeed(0);
    by_index[s] = owned.back().get();
    for (auto* p : owned.back()->parameters()) params.push_back(p);
  }
  engine::DataConfig data_config;
  auto data =
      engine::DataSource::Create(data_config, job::ModelSampleShapes(*spec));
  auto optimizer = engine::Optimizer::Create(
      be, {.kind = engine::OptimizerConfig::Kind::kSgd, .lr = 1e-3}, params);
  // One rank with four virtual stages: every action runs here, and tensors
  // between stages go through the channel to this same rank.
  auto schedule = scheduler::GenerateSchedule(
      scheduler::ScheduleKind::kInterleaved1F1B,
      {.ranks = 1, .microbatches = microbatches, .virtual_stages = stages});
  transport::InMemoryHub hub(1);
  auto executor = StageExecutor::Create({.num_ranks = 1,
                                         .num_stages = stages,
                                         .batch_size = microbatches,
                                         .microbatches = microbatches},
                                        by_index, data->get(), optimizer->get(),
                                        hub.endpoint(0), be);
  if (!data.ok() || !optimizer.ok() || !schedule.ok() || !executor.ok()) {
    return state.SkipWithError("setup failed");
  }
  const auto& actions = schedule->actions[0];
  int64_t step = 0;
  for (auto _ : state) {
    auto r = (*executor)->RunStep(step++, actions);
    if (!r.ok())
      return state.SkipWithError(std::string(r.status().message()).c_str());
  }
  state.counters["actions"] = static_cast<double>(actions.size());
  // Seconds per action (printed with an SI prefix, e.g. 3.1u = 3.1 us).
  state.counters["time_per_action"] =
      benchmark::Counter(static_cast<double>(actions.size()),
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ExecutorOverhead)
    ->Name("executor/overhead")
    ->Arg(8)
    ->Arg(32)
    ->ArgName("M")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The data loader's share of a step of the GPT example's model
// (examples/gpt.yaml: byte-level, 2 causal pre-norm blocks of 128, sequence
// 64, batch 16 in 4 microbatches) as one stage on one rank, reading a token
// file; with documents (Arg 1), every microbatch's layout is computed too
// (positions reset, attention masked, the EOD loss dropped; a newline ends
// a document). The share is the time in data reads (inputs, targets,
// layouts: RankStepResult's data_seconds, what
// conveyor_dataloader_wait_seconds_total counts) over the step's time.
void BM_DataLoaderShare(benchmark::State& state) {
  const bool documents = state.range(0) != 0;
  auto spec = engine::ParseModelSpecYaml(
      "model:\n  input_shape: [64]\n  init: {seed: 0}\n  layers:\n"
      "    - embedding: {vocab_size: 256, features: 128, max_positions: 64}\n"
      "    - transformer_block: {heads: 4, mlp_features: 512, causal: true, "
      "norm: pre}\n"
      "    - transformer_block: {heads: 4, mlp_features: 512, causal: true, "
      "norm: pre}\n"
      "    - layernorm\n    - lm_head: {vocab_size: 256}\n"
      "  loss: cross_entropy\n",
      "gpt.yaml");
  if (!spec.ok()) return state.SkipWithError("model spec");
  // 1 MiB of text-like bytes: words of letters, a newline every ~40 words.
  const std::string path =
      absl::StrCat("/tmp/conveyor_dataloader_bench_", getpid(), ".txt");
  {
    std::string text;
    uint32_t x = 12345;
    while (text.size() < (1 << 20)) {
      x = x * 1664525u + 1013904223u;
      text += static_cast<char>('a' + (x >> 24) % 26);
      if ((x >> 8) % 6 == 0) text += (x >> 16) % 40 == 0 ? '\n' : ' ';
    }
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return state.SkipWithError("temp file");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  engine::Backend* be = engine::CpuBackend::Get();
  auto stage = engine::Stage::Create(be, *spec, 0);
  if (!stage.ok()) return state.SkipWithError("stage");
  (void)(*stage)->InitializeFromSeed(0);
  engine::DataConfig data_config{.kind = engine::DataConfig::Kind::kTokens,
                                 .path = path,
                                 .shuffle = true,
                                 .seq_len = 64};
  if (documents) {
    data_config.documents = {.eod_token = '\n',
                             .reset_position_ids = true,
                             .document_mask = true,
                             .eod_mask_loss = true};
  }
  auto data =
      engine::DataSource::Create(data_config, job::ModelSampleShapes(*spec));
  auto optimizer = engine::Optimizer::Create(
      be, {.kind = engine::OptimizerConfig::Kind::kAdamW, .lr = 1e-3},
      (*stage)->parameters());
  auto schedule = scheduler::GenerateSchedule(scheduler::ScheduleKind::k1F1B,
                                              {.ranks = 1, .microbatches = 4});
  transport::InMemoryHub hub(1);
  if (!data.ok() || !optimizer.ok() || !schedule.ok()) {
    std::remove(path.c_str());
    return state.SkipWithError("setup failed");
  }
  auto executor = StageExecutor::Create(
      {.num_ranks = 1,
       .num_stages = 1,
       .batch_size = 16,
       .microbatches = 4,
       .loss = engine::LossKind::kCrossEntropy,
       .documents = data_config.documents},
      {{0, stage->get()}}, data->get(), optimizer->get(), hub.endpoint(0), be);
  if (!executor.ok()) {
    std::remove(path.c_str());
    return state.SkipWithError("executor");
  }
  double data_seconds = 0, step_seconds = 0;
  int64_t step = 0;
  for (auto _ : state) {
    auto r = (*executor)->RunStep(step++, schedule->actions[0]);
    if (!r.ok()) {
      std::remove(path.c_str());
      return state.SkipWithError(std::string(r.status().message()).c_str());
    }
    for (const auto& [index, t] : r->stages) data_seconds += t.data_seconds;
    step_seconds += r->seconds;
  }
  std::remove(path.c_str());
  state.counters["data_share_percent"] =
      step_seconds > 0 ? 100 * data_seconds / step_seconds : 0;
}
BENCHMARK(BM_DataLoaderShare)
    ->Name("dataloader/gpt")
    ->Arg(0)
    ->Arg(1)
    ->ArgName("documents")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::worker

BENCHMARK_MAIN();
