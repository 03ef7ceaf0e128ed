// Executor overhead: the time StageExecutor spends per action beyond the
// layers' own compute, which issue 4 targets at <= 10 us (median).
//
// One rank holds four stages of one-feature dense layers (compute of well
// under a microsecond each) on the in-memory hub, so each step's time is
// almost all executor work: tag bookkeeping, channel self-delivery, stash
// handling, the loss, and the optimizer step. Reported per action.
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

}  // namespace
}  // namespace conveyor::worker

BENCHMARK_MAIN();
