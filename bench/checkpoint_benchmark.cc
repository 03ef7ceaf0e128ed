// What checkpoints cost the step loop, now that their files are written in
// the background (worker/job_runner.h). A one-rank job trains through a real
// JobRunner: a dense layer of 2048 x 2048 (a 48 MiB stage file with Adam's
// two state tensors) and a `delay` layer that fixes the step's time, so the
// step is a known multiple of the time the file takes to write on this
// machine's disk. The figure is the median interval between the ends of
// consecutive steps with `checkpoint.every: E` over the same without
// checkpoints (alternating runs, so both see the same disk and load).
//
// Rows checkpoint/write_over_step:R/every:E, R = the write time over the
// step time:
//   R = 0.5, E = 1: a write fits in a step, so the loop only pays the
//     snapshot (copying the stage to host memory); target <= 1.05. Written
//     synchronously, as before, the step would take 1 + R = 1.5 times as
//     long.
//   R = 2, E = 1: a checkpoint every step that takes two steps to write.
//     At most one write is in flight, so the loop waits for each: the ratio
//     is about R, and conveyor_checkpoint_wait_seconds_total shows it.
//   R = 2, E = 3: the same write fits in three steps; target <= 1.05.
//
//   cmake --build build-bench --target checkpoint_benchmark
//   build-bench/bench/checkpoint_benchmark
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"  // defines: State, RegisterBenchmark
#include "job/job_spec.h"
#include "job/planner.h"
#include "job/rank_program.h"
#include "worker/job_runner.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSteps = 16;  // Per run; the first two are left out.
constexpr int kRounds = 3;  // Alternating runs with and without checkpoints.

std::string JobYaml(double delay_ms, int every, const std::string& dir) {
  return absl::StrCat(
      "name: checkpoint-bench\nmodel:\n  input_shape: [2048]\n"
      "  init: {seed: 0}\n  layers:\n"
      "    - dense: {features: 2048}\n"
      "    - delay: {forward_ms: ",
      delay_ms / 2, ", backward_ms: ", delay_ms / 2,
      "}\n  loss: mse\n"
      "data: {source: synthetic-regression, seed: 0}\n"
      "training: {steps: ",
      kSteps,
      ", batch_size: 1, microbatches: 1}\n"
      "optimizer: {kind: adam, lr: 0.001}\n"
      "pipeline: {schedule: 1f1b}\n",
      every > 0 ? absl::StrCat("checkpoint: {dir: ", dir, ", every: ", every,
                               ", keep_latest: 2}\n")
                : "");
}

struct RunResult {
  std::vector<double> intervals;  // Seconds between consecutive step ends.
  std::vector<double> write_seconds, wait_seconds, snapshot_seconds;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

absl::StatusOr<RunResult> RunJob(double delay_ms, int every,
                                 const std::string& dir) {
  std::filesystem::remove_all(dir);
  const std::string yaml = JobYaml(delay_ms, every, dir);
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpec(yaml, "job.yaml");
  if (!spec.ok()) return spec.status();
  absl::StatusOr<job::JobPlan> plan = job::PlanJob(*std::move(spec));
  if (!plan.ok()) return plan.status();
  const v1::JobProgram program =
      job::CompileRankProgram(*plan, 0,
                              {.job_id = "bench",
                               .job_number = 1,
                               .secret = "bench-secret",
                               .yaml = yaml,
                               .file_name = "job.yaml"});
  RunResult result;
  std::mutex mu;  // on_checkpoint runs on the writer's thread.
  worker::JobRunnerOptions options;
  options.on_checkpoint = [&](const worker::CheckpointWrite& w) {
    std::lock_guard<std::mutex> lock(mu);
    result.write_seconds.push_back(w.seconds);
    result.wait_seconds.push_back(w.wait_seconds);
    result.snapshot_seconds.push_back(w.snapshot_seconds);
  };
  absl::StatusOr<std::unique_ptr<worker::JobRunner>> runner =
      worker::JobRunner::Create(program, options);
  if (!runner.ok()) return runner.status();
  if (absl::Status s = (*runner)->Start({(*runner)->data_endpoint()});
      !s.ok()) {
    return s;
  }
  std::vector<Clock::time_point> ends;
  absl::Status run = (*runner)->Run(
      [&](const worker::StepProgress&) { ends.push_back(Clock::now()); });
  if (!run.ok()) return run;
  // From the third step's end: the first steps warm the allocator and the
  // page cache.
  for (size_t k = 3; k < ends.size(); ++k) {
    result.intervals.push_back(
        std::chrono::duration<double>(ends[k] - ends[k - 1]).count());
  }
  return result;
}

// The median time to write the stage file (no contention: the step is a
// sleep), from a short calibration run.
absl::StatusOr<double> WriteSeconds(const std::string& dir) {
  absl::StatusOr<RunResult> r = RunJob(/*delay_ms=*/400, /*every=*/1, dir);
  if (!r.ok()) return r.status();
  return Median(r->write_seconds);
}

void BM_Checkpoint(benchmark::State& state, double write_over_step, int every) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "conveyor_checkpoint_benchmark")
          .string();
  absl::StatusOr<double> write = WriteSeconds(dir);
  if (!write.ok())
    return state.SkipWithError(write.status().ToString().c_str());
  const double delay_ms = *write / write_over_step * 1e3;
  std::vector<double> with, without, waits, snapshots, writes;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      absl::StatusOr<RunResult> a = RunJob(delay_ms, every, dir);
      absl::StatusOr<RunResult> b = RunJob(delay_ms, 0, dir);
      if (!a.ok() || !b.ok()) {
        return state.SkipWithError(
            (a.ok() ? b.status() : a.status()).ToString().c_str());
      }
      with.insert(with.end(), a->intervals.begin(), a->intervals.end());
      without.insert(without.end(), b->intervals.begin(), b->intervals.end());
      waits.insert(waits.end(), a->wait_seconds.begin(), a->wait_seconds.end());
      snapshots.insert(snapshots.end(), a->snapshot_seconds.begin(),
                       a->snapshot_seconds.end());
      writes.insert(writes.end(), a->write_seconds.begin(),
                    a->write_seconds.end());
    }
  }
  std::filesystem::remove_all(dir);
  const double step_with = Median(with), step_without = Median(without);
  state.counters["write_ms"] = Median(writes) * 1e3;
  state.counters["step_ms"] = step_without * 1e3;
  state.counters["step_checkpointed_ms"] = step_with * 1e3;
  state.counters["wait_ms"] = Median(waits) * 1e3;
  state.counters["snapshot_ms"] = Median(snapshots) * 1e3;
  state.counters["ratio"] = step_with / step_without;
  // What the same checkpoints cost written on the step loop, as before:
  // (E steps + one write) per E steps.
  state.counters["synchronous_ratio"] =
      (every * step_without + Median(writes)) / (every * step_without);
  state.counters["target"] = write_over_step * 1.0 <= every ? 1.05 : 0;
}

void Register() {
  struct Case {
    double write_over_step;
    int every;
  };
  for (Case c : {Case{0.5, 1}, Case{2, 1}, Case{2, 3}}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("checkpoint/write_over_step:", c.write_over_step,
                     "/every:", c.every)
            .c_str(),
        [c](benchmark::State& s) {
          BM_Checkpoint(s, c.write_over_step, c.every);
        })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) {
  conveyor::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
