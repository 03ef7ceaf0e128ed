// Generate + validate + simulate, the work the coordinator's planner does for
// every job. Targets (issue 2): P=8 M=64 <= 1 ms; P=32 M=256 V=4 <= 10 ms;
// P=64 M=1024 <= 50 ms. scripts/bench reads the "target_ms" counter.
#include <cstdint>
#include <string>

#include "benchmark/benchmark.h"   // defines: BENCHMARK, benchmark::State
#include "common/heap_tuning.h"    // defines: TuneHeapForPlanning
#include "scheduler/generators.h"  // defines: GenerateSchedule
#include "scheduler/simulator.h"   // defines: Simulate, SimulationCosts
#include "scheduler/validator.h"   // defines: ValidateSchedule

namespace conveyor::scheduler {
namespace {

void BM_PlanSchedule(benchmark::State& state, ScheduleKind kind,
                     double target_ms) {
  const ScheduleOptions options{
      .ranks = static_cast<int>(state.range(0)),
      .microbatches = static_cast<int>(state.range(1)),
      .virtual_stages = static_cast<int>(state.range(2))};
  const auto costs = SplitsBackward(kind)
                         ? SimulationCosts<int64_t>::UniformSplit(1, 1, 1)
                         : SimulationCosts<int64_t>::Uniform(1, 2);
  size_t actions = 0;
  for (auto _ : state) {
    auto schedule = GenerateSchedule(kind, options);
    if (!schedule.ok() || !ValidateSchedule(*schedule).ok()) {
      state.SkipWithError("generation or validation failed");
      return;
    }
    auto result = Simulate(*schedule, costs);
    if (!result.ok()) {
      state.SkipWithError("simulation failed");
      return;
    }
    benchmark::DoNotOptimize(result->makespan);
    actions = schedule->TotalActions();
  }
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["target_ms"] = target_ms;
}

void Register() {
  struct Case {
    int p, m, v;
    double target_ms;
  };
  const Case cases[] = {
      {8, 64, 1, 1.0}, {32, 256, 4, 10.0}, {64, 1024, 1, 50.0}};
  for (ScheduleKind kind : kAllScheduleKinds) {
    for (Case c : cases) {
      // zb-v and dualpipev hold exactly two stages a rank: their V = 2 row
      // stands in for the V = 1 and V = 4 ones, with the same
      // stage-microbatch count (and M >= 2P, which dualpipev needs).
      if (PlacementOf(kind) == Placement::kV) {
        c.m = c.m * c.v / 2;
        c.v = 2;
      }
      if (c.v > 1 && !TakesVirtualStages(kind)) continue;
      benchmark::RegisterBenchmark(
          ("plan/" + std::string(ScheduleKindName(kind))).c_str(),
          [kind, c](benchmark::State& s) {
            BM_PlanSchedule(s, kind, c.target_ms);
          })
          ->Args({c.p, c.m, c.v})
          ->ArgNames({"P", "M", "V"})
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace conveyor::scheduler

int main(int argc, char** argv) {
  // As the coordinator, whose planner this measures, runs.
  conveyor::TuneHeapForPlanning();
  conveyor::scheduler::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
