// Pipelined step time against the schedule simulator's prediction: the
// executor, the TCP data plane and the threads together should add almost
// nothing to what the schedule itself costs. Target: the median measured step
// within 5% of the simulated makespan (|ratio - 1| <= 0.05), for P = 2 and 4
// ranks and M = 4, 8, 16 microbatches, under 1f1b, gpipe and zb-h1.
//
// Stage s is one `delay` layer (engine/layers/delay.h) that waits F = 4 ms in
// each forward and B = 8 ms in each backward (zb-h1: BI = 4 ms, BW = 4 ms), so
// compute costs exactly what the simulator is told, whatever the machine's
// speed, and the ranks sleep rather than spin (the 2-core CI machine runs four
// ranks at once). At these costs the fixed cost of the transfers on the
// critical path (a chain of thread wake-ups each, below) is 1-3% of the step
// at latency 0; at F = 2 ms it was 2-6%, too close to the target to tell a
// regression from a busy machine. The model has no parameters, so the
// optimizer step runs over none, and a microbatch is one sample of one float,
// so a tensor crossing ranks is a 4-byte payload.
//
// The P ranks are threads of this process, each with its own Stage,
// optimizer, data source, StageExecutor and TcpChannel on loopback (Create,
// then Connect with every rank's port), as separate worker processes would
// have. Each step starts all ranks together; its time is the wall time from
// the first rank's start to the last rank's end, the span the simulator's
// makespan measures. After kWarmupSteps, kTimedSteps steps are timed and the
// median is reported (the whole run takes about 45 s).
//
// Two predictions come from Simulate() with those costs:
//   predicted_ms, which the target applies to: with the latency of one
//     transfer measured on these channels first, the median over
//     kLatencySamples of a 4-byte tensor sent from rank 0 to rank 1 after
//     kLatencyIdle of idling. The idling matters: threads that have slept for
//     milliseconds, as the ranks and the channels' I/O threads do between
//     actions, wake slowly (on the 2-core development VM a transfer takes
//     about 25 us back to back but 140-160 us after 4 ms idle), and a
//     pipeline's critical path pays one such wake-up chain per transfer. The
//     simulator charges the latency to every transfer between ranks, so the
//     ratio measures what the executor adds beyond moving tensors.
//   predicted_l0_ms: latency 0, the schedule's own makespan, which counts the
//     transfers as overhead too (ratio_l0, for information).
//
//   cmake --build build --target pipeline_benchmark
//   build/bench/pipeline_benchmark
#include <algorithm>
#include <barrier>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"        // defines: BENCHMARK_CAPTURE, State
#include "common/status_macros.h"       // defines: ASSIGN_OR_RETURN
#include "engine/cpu/cpu_backend.h"     // defines: CpuBackend
#include "engine/job_spec.h"            // defines: ModelSampleShapes
#include "engine/model_spec.h"          // defines: ParseModelSpecYaml
#include "scheduler/generators.h"       // defines: GenerateSchedule
#include "scheduler/simulator.h"        // defines: Simulate, SimulationCosts
#include "transport/tcp/tcp_channel.h"  // defines: TcpChannel
#include "worker/stage_executor.h"      // defines: StageExecutor
#include "worker/step_report.h"         // defines: FillStepReport
#include "worker/worker_metrics.h"      // defines: WorkerMetrics

namespace conveyor::worker {
namespace {

using Clock = std::chrono::steady_clock;
using scheduler::ScheduleKind;

constexpr uint64_t kJob = 1;
constexpr int kWarmupSteps = 2;
constexpr int kTimedSteps = 15;
constexpr int kLatencySamples = 40;
constexpr std::chrono::milliseconds kLatencyIdle{4};  // = F
// Latency probes use steps far past the timed ones, so that a probe can never
// match a tensor of a real step.
constexpr int64_t kProbeStep = int64_t{1} << 40;

// Per-stage costs in milliseconds. B = BI + BW for every schedule; only zb-h1
// runs BI and BW apart, so only it splits the backward.
struct StageCosts {
  double forward_ms;
  double backward_input_ms;
  double backward_weight_ms;
};

StageCosts CostsFor(ScheduleKind kind) {
  if (kind == ScheduleKind::kZeroBubbleH1) return {4.0, 4.0, 4.0};
  return {4.0, 8.0, 0.0};
}

std::string ModelYaml(int stages, const StageCosts& c) {
  const std::string delay =
      c.backward_weight_ms > 0
          ? absl::StrCat("    - delay: {forward_ms: ", c.forward_ms,
                         ", backward_input_ms: ", c.backward_input_ms,
                         ", backward_weight_ms: ", c.backward_weight_ms, "}\n")
          : absl::StrCat("    - delay: {forward_ms: ", c.forward_ms,
                         ", backward_ms: ", c.backward_input_ms, "}\n");
  std::string layers;
  for (int s = 0; s < stages; ++s) {
    if (s > 0) layers += "    - boundary\n";
    layers += delay;
  }
  return absl::StrCat("model:\n  input_shape: [1]\n  init: {seed: 0}\n",
                      "  loss: mse\n  layers:\n", layers);
}

// The simulator's makespan in milliseconds for the same schedule and costs,
// with `latency_ms` per transfer between ranks and no bandwidth limit (the
// tensors are 4 bytes).
absl::StatusOr<double> PredictedMs(const scheduler::Schedule& schedule,
                                   const StageCosts& c, double latency_ms) {
  auto costs =
      c.backward_weight_ms > 0
          ? scheduler::SimulationCosts<double>::UniformSplit(
                c.forward_ms, c.backward_input_ms, c.backward_weight_ms)
          : scheduler::SimulationCosts<double>::Uniform(c.forward_ms,
                                                        c.backward_input_ms);
  costs.latency = latency_ms;
  ASSIGN_OR_RETURN(auto result, scheduler::Simulate(schedule, costs));
  return result.makespan;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One step as the ranks saw it, in seconds.
struct StepTiming {
  double wall = 0;              // First rank's start to last rank's end.
  double longest_run_step = 0;  // The largest RankStepResult::seconds.
};

// P ranks, each a thread that owns what a worker process would: its stage,
// data source, optimizer, TCP channel and executor. RunStep() releases every
// rank into the same step and waits for all of them. Not thread-safe: one
// thread drives it.
class Pipeline {
 public:
  // With `telemetry`, every rank does what a worker daemon does for metrics
  // and tracing: records the step's spans, updates its Prometheus series
  // (the channel's traffic included) and builds the StepReport that carries
  // the timeline to the coordinator. Without, none of that.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(
      const scheduler::Schedule& schedule, const engine::ModelSpec& spec,
      bool telemetry = true) {
    std::unique_ptr<Pipeline> p(new Pipeline(schedule, telemetry));
    RETURN_IF_ERROR(p->Build(spec));
    p->Start();
    return p;
  }

  // The median time, in seconds, of `samples` 4-byte tensors sent from rank 0
  // to rank 1, each after `idle` without traffic. Call before the first
  // RunStep: the executors must not be running.
  absl::StatusOr<double> MeasureLatency(int samples,
                                        std::chrono::milliseconds idle) {
    ASSIGN_OR_RETURN(engine::Tensor probe, engine::CpuBackend::Get()->Zeros(
                                               {1}, engine::DType::kF32));
    std::vector<double> seconds;
    for (int i = 0; i < samples; ++i) {
      std::this_thread::sleep_for(idle);
      const transport::Tag tag{.job = kJob, .step = kProbeStep + i};
      const Clock::time_point start = Clock::now();
      RETURN_IF_ERROR(ranks_[0].channel->Send(1, tag, probe));
      RETURN_IF_ERROR(
          ranks_[1].channel->Recv(tag, std::chrono::seconds(10)).status());
      seconds.push_back(
          std::chrono::duration<double>(Clock::now() - start).count());
    }
    return Median(std::move(seconds));
  }

  ~Pipeline() {
    stop_ = true;
    if (!threads_.empty()) start_.arrive_and_wait();
    for (std::thread& t : threads_) t.join();
  }

  // Runs step `step` on every rank; the first rank's error if any failed.
  absl::StatusOr<StepTiming> RunStep(int64_t step) {
    step_ = step;
    start_.arrive_and_wait();
    end_.arrive_and_wait();
    Clock::time_point first = Clock::time_point::max();
    Clock::time_point last = Clock::time_point::min();
    StepTiming timing;
    for (const RankStep& r : results_) {
      RETURN_IF_ERROR(r.status);
      first = std::min(first, r.start);
      last = std::max(last, r.end);
      timing.longest_run_step =
          std::max(timing.longest_run_step, r.run_step_seconds);
    }
    timing.wall = std::chrono::duration<double>(last - first).count();
    return timing;
  }

 private:
  struct Rank {
    std::unique_ptr<engine::Stage> stage;
    std::unique_ptr<engine::DataSource> data;
    std::unique_ptr<engine::Optimizer> optimizer;
    std::unique_ptr<WorkerMetrics> metrics;
    std::unique_ptr<JobMetrics> job_metrics;  // Observes the channel.
    std::unique_ptr<transport::TcpChannel> channel;
    std::unique_ptr<StageExecutor> executor;
    size_t report_bytes = 0;  // Keeps the StepReport from being elided.
  };

  // What one rank did in the current step.
  struct RankStep {
    absl::Status status;
    Clock::time_point start, end;
    double run_step_seconds = 0;
  };

  Pipeline(const scheduler::Schedule& schedule, bool telemetry)
      : schedule_(schedule),
        telemetry_(telemetry),
        ranks_(schedule.ranks),
        results_(schedule.ranks),
        start_(schedule.ranks + 1),
        end_(schedule.ranks + 1) {}

  absl::Status Build(const engine::ModelSpec& spec) {
    engine::Backend* be = engine::CpuBackend::Get();
    const int p = schedule_.ranks;
    const int m = schedule_.microbatches;
    std::vector<std::string> peers;
    for (int r = 0; r < p; ++r) {
      Rank& rank = ranks_[r];
      ASSIGN_OR_RETURN(rank.stage, engine::Stage::Create(be, spec, r));
      RETURN_IF_ERROR(rank.stage->InitializeFromSeed(0));
      ASSIGN_OR_RETURN(rank.data, engine::DataSource::Create(
                                      engine::DataConfig{},
                                      engine::ModelSampleShapes(spec)));
      ASSIGN_OR_RETURN(
          rank.optimizer,
          engine::Optimizer::Create(
              be, {.kind = engine::OptimizerConfig::Kind::kSgd, .lr = 1e-3},
              rank.stage->parameters()));
      transport::TcpChannelConfig config;
      config.rank = r;
      config.world_size = p;
      config.job = kJob;
      config.secret = "pipeline-benchmark";
      if (telemetry_) {
        rank.metrics = std::make_unique<WorkerMetrics>(absl::StrCat("r", r));
        rank.job_metrics = rank.metrics->StartJob("job-1", {r});
        config.observer = rank.job_metrics.get();
      }
      ASSIGN_OR_RETURN(rank.channel, transport::TcpChannel::Create(config, be));
      peers.push_back(absl::StrCat("127.0.0.1:", rank.channel->port()));
    }
    // Connect returns once every peer's I/O thread has accepted, which needs
    // no call on the peer's side, so one thread can connect them in turn.
    for (Rank& rank : ranks_) RETURN_IF_ERROR(rank.channel->Connect(peers));
    for (int r = 0; r < p; ++r) {
      Rank& rank = ranks_[r];
      ASSIGN_OR_RETURN(
          rank.executor,
          StageExecutor::Create({.job = kJob,
                                 .rank = r,
                                 .num_ranks = p,
                                 .num_stages = p,
                                 .batch_size = m,  // One sample a microbatch.
                                 .microbatches = m,
                                 .loss = spec.loss,
                                 .record_spans = telemetry_},
                                {{r, rank.stage.get()}}, rank.data.get(),
                                rank.optimizer.get(), rank.channel.get(), be));
    }
    return absl::OkStatus();
  }

  void Start() {
    for (int r = 0; r < schedule_.ranks; ++r) {
      threads_.emplace_back([this, r] { RankLoop(r); });
    }
  }

  void RankLoop(int r) {
    Rank& rank = ranks_[r];
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) return;
      RankStep& out = results_[r];
      out.start = Clock::now();
      absl::StatusOr<RankStepResult> result =
          rank.executor->RunStep(step_, schedule_.actions[r]);
      out.end = Clock::now();
      out.status = result.status();
      if (result.ok() && telemetry_) {
        rank.job_metrics->RecordStep(*result);
        v1::WorkerMessage message;
        FillStepReport(*result, message.mutable_step());
        rank.report_bytes += message.SerializeAsString().size();
      }
      if (result.ok()) {
        out.end = Clock::now();
        out.run_step_seconds = result->seconds;
      } else {
        // Tells the peers, so that ranks waiting on this one fail now rather
        // than at their receive timeout.
        rank.channel->Abort(result.status());
      }
      end_.arrive_and_wait();
    }
  }

  const scheduler::Schedule schedule_;
  const bool telemetry_;
  std::vector<Rank> ranks_;
  // results_[r] is written by rank r between the barriers and read by the
  // driver after end_.
  std::vector<RankStep> results_;
  // The driver and the P ranks: start_ releases a step (or the stop), end_
  // waits for every rank to finish it. The barriers order every access to
  // step_, stop_ and results_.
  std::barrier<> start_;
  std::barrier<> end_;
  int64_t step_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

void BM_Pipeline(benchmark::State& state, ScheduleKind kind) {
  const int p = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  const StageCosts costs = CostsFor(kind);
  auto spec = engine::ParseModelSpecYaml(ModelYaml(p, costs), "bench.yaml");
  if (!spec.ok()) return state.SkipWithError(spec.status().ToString().c_str());
  auto schedule = scheduler::GenerateSchedule(
      kind, {.ranks = p, .microbatches = m, .virtual_stages = 1});
  if (!schedule.ok()) {
    return state.SkipWithError(schedule.status().ToString().c_str());
  }
  auto pipeline = Pipeline::Create(*schedule, *spec);
  if (!pipeline.ok()) {
    return state.SkipWithError(pipeline.status().ToString().c_str());
  }
  absl::StatusOr<double> latency =
      (*pipeline)->MeasureLatency(kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  absl::StatusOr<double> predicted_ms =
      PredictedMs(*schedule, costs, *latency * 1e3);
  absl::StatusOr<double> predicted_l0_ms = PredictedMs(*schedule, costs, 0);
  if (!predicted_ms.ok() || !predicted_l0_ms.ok()) {
    return state.SkipWithError("the simulator failed");
  }

  int64_t step = 0;
  for (; step < kWarmupSteps; ++step) {
    auto timing = (*pipeline)->RunStep(step);
    if (!timing.ok()) {
      return state.SkipWithError(timing.status().ToString().c_str());
    }
  }
  std::vector<double> wall_ms, run_step_ms;
  for (auto _ : state) {
    auto timing = (*pipeline)->RunStep(step++);
    if (!timing.ok()) {
      return state.SkipWithError(timing.status().ToString().c_str());
    }
    state.SetIterationTime(timing->wall);
    wall_ms.push_back(timing->wall * 1e3);
    run_step_ms.push_back(timing->longest_run_step * 1e3);
  }
  const double measured_ms = Median(wall_ms);
  state.counters["P"] = p;
  state.counters["M"] = m;
  state.counters["measured_ms"] = measured_ms;
  state.counters["min_ms"] = *std::min_element(wall_ms.begin(), wall_ms.end());
  state.counters["max_ms"] = *std::max_element(wall_ms.begin(), wall_ms.end());
  // The slowest rank's own RunStep time: the wall time less the ranks'
  // staggered starts.
  state.counters["rank_max_ms"] = Median(run_step_ms);
  state.counters["latency_us"] = *latency * 1e6;
  state.counters["predicted_ms"] = *predicted_ms;
  state.counters["ratio"] = measured_ms / *predicted_ms;
  state.counters["predicted_l0_ms"] = *predicted_l0_ms;
  state.counters["ratio_l0"] = measured_ms / *predicted_l0_ms;
}

// What metrics and tracing cost a step: the same 1f1b pipeline (P = 4,
// M = 8, F = 4 ms, B = 8 ms) built twice, with and without telemetry, run
// in alternating blocks so both see the same machine, and compared by their
// median step times. Target: under 1% slower with telemetry.
void BM_Telemetry(benchmark::State& state) {
  constexpr int kP = 4, kM = 8, kRounds = 8, kStepsPerBlock = 4;
  const StageCosts costs = CostsFor(ScheduleKind::k1F1B);
  auto spec = engine::ParseModelSpecYaml(ModelYaml(kP, costs), "bench.yaml");
  auto schedule = scheduler::GenerateSchedule(
      ScheduleKind::k1F1B, {.ranks = kP, .microbatches = kM});
  if (!spec.ok() || !schedule.ok()) return state.SkipWithError("setup");
  auto on = Pipeline::Create(*schedule, *spec, /*telemetry=*/true);
  auto off = Pipeline::Create(*schedule, *spec, /*telemetry=*/false);
  if (!on.ok() || !off.ok()) return state.SkipWithError("pipelines");
  std::vector<double> on_ms, off_ms;
  int64_t step = 0;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      // Alternate which goes first, so neither always follows the other.
      for (int half = 0; half < 2; ++half) {
        const bool with = (round + half) % 2 == 0;
        Pipeline& p = with ? **on : **off;
        for (int i = 0; i < kStepsPerBlock + 1; ++i) {
          auto timing = p.RunStep(step++);
          if (!timing.ok()) {
            return state.SkipWithError(timing.status().ToString().c_str());
          }
          // The first step of a block wakes a pipeline that sat idle.
          if (i > 0) (with ? on_ms : off_ms).push_back(timing->wall * 1e3);
        }
      }
    }
  }
  const double with = Median(on_ms), without = Median(off_ms);
  state.counters["with_ms"] = with;
  state.counters["without_ms"] = without;
  state.counters["ratio"] = with / without;
  state.counters["steps"] = static_cast<double>(on_ms.size());
}
BENCHMARK(BM_Telemetry)
    ->Name("telemetry/1f1b/P:4/M:8")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

void Cases(benchmark::internal::Benchmark* b) {
  b->ArgsProduct({{2, 4}, {4, 8, 16}})
      ->ArgNames({"P", "M"})
      ->Iterations(kTimedSteps)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_Pipeline, 1f1b, ScheduleKind::k1F1B)
    ->Name("pipeline/1f1b")
    ->Apply(Cases);
BENCHMARK_CAPTURE(BM_Pipeline, gpipe, ScheduleKind::kGPipe)
    ->Name("pipeline/gpipe")
    ->Apply(Cases);
BENCHMARK_CAPTURE(BM_Pipeline, zb_h1, ScheduleKind::kZeroBubbleH1)
    ->Name("pipeline/zb-h1")
    ->Apply(Cases);

}  // namespace
}  // namespace conveyor::worker

BENCHMARK_MAIN();
