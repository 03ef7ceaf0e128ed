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
// median is reported (these pipeline/ cases take about 45 s, the whole run
// with the groups below about 95 s on the 2-core development VM).
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
// Three more groups use the same harness (see docs/bubble.md):
//   bubble/<schedule>/P:4/M:{8,16}: the measured bubble, 1 - (the ranks'
//     forward + backward time) / (P x step wall time), against the
//     simulator's bubble_fraction() for every schedule (interleaved-1f1b,
//     interleaved-zb, zb-v and dualpipev with V = 2).
//   zb_gain/P:4/M:{8,16}: how much of the step time zb-h1 is predicted to
//     save over 1f1b it actually saves (1f1b and zb-h1 in alternating
//     blocks).
//   auto_split/P:4/M:8: an uneven model of 16 delay layers split by
//     scheduler::SearchStages against the even split (alternating blocks).
//
//   cmake --build build --target pipeline_benchmark
//   build/bench/pipeline_benchmark [--benchmark_filter=bubble|zb_gain|...]
#include <algorithm>
#include <barrier>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"     // defines: BENCHMARK_CAPTURE, State
#include "common/status_macros.h"    // defines: ASSIGN_OR_RETURN
#include "engine/cpu/cpu_backend.h"  // defines: CpuBackend
#include "engine/model_spec.h"       // defines: ParseModelSpecYaml
#include "engine/profiler.h"         // defines: ProfileLayers
#include "engine/stage.h"            // defines: Stage
#include "job/job_spec.h"            // defines: ModelSampleShapes
#include "job/planner.h"             // defines: PlanJob, ChooseStages
#include "scheduler/generators.h"    // defines: GenerateSchedule
#include "scheduler/simulator.h"     // defines: Simulate, SimulationCosts
#include "scheduler/stage_search.h"  // defines: SearchStages
#include "transport/tcp/loopback_latency.h"  // defines: MeasureLoopbackLatency
#include "transport/tcp/tcp_channel.h"       // defines: TcpChannel
#include "worker/stage_executor.h"           // defines: StageExecutor
#include "worker/step_report.h"              // defines: FillStepReport
#include "worker/worker_metrics.h"           // defines: WorkerMetrics

namespace conveyor::worker {
namespace {

using Clock = std::chrono::steady_clock;
using scheduler::ScheduleKind;

constexpr uint64_t kJob = 1;
constexpr int kWarmupSteps = 2;
constexpr int kTimedSteps = 15;
// The bubble group times fewer steps: its cases repeat pipeline/ ones.
constexpr int kBubbleTimedSteps = 10;
constexpr int kLatencySamples = 40;
constexpr std::chrono::milliseconds kLatencyIdle{4};  // = F
// Latency probes use steps far past the timed ones, so that a probe can never
// match a tensor of a real step.
constexpr int64_t kProbeStep = int64_t{1} << 40;

// Per-stage (or, in auto_split, per-layer) costs in milliseconds. B = BI + BW
// for every schedule; only zb-h1 runs BI and BW apart, so only it splits the
// backward.
struct StageCosts {
  double forward_ms;
  double backward_input_ms;
  double backward_weight_ms;
};

// With V stages a rank, each stage costs 1/V of the V = 1 stage, so that a
// rank's work is the same for every V.
StageCosts CostsFor(ScheduleKind kind, int virtual_stages = 1) {
  if (SplitsBackward(kind)) {
    return {4.0 / virtual_stages, 4.0 / virtual_stages, 4.0 / virtual_stages};
  }
  return {4.0 / virtual_stages, 8.0 / virtual_stages, 0.0};
}

std::string DelayLayer(const StageCosts& c) {
  return c.backward_weight_ms > 0
             ? absl::StrCat("    - delay: {forward_ms: ", c.forward_ms,
                            ", backward_input_ms: ", c.backward_input_ms,
                            ", backward_weight_ms: ", c.backward_weight_ms,
                            "}\n")
             : absl::StrCat("    - delay: {forward_ms: ", c.forward_ms,
                            ", backward_ms: ", c.backward_input_ms, "}\n");
}

// A model of one delay layer per entry of `layers`, with a stage boundary
// before each layer stage_begin[s], s > 0 (stage_begin[0] == 0).
std::string ModelYaml(const std::vector<StageCosts>& layers,
                      const std::vector<int>& stage_begin) {
  std::string text;
  size_t next = 1;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (next < stage_begin.size() &&
        static_cast<size_t>(stage_begin[next]) == i) {
      text += "    - boundary\n";
      ++next;
    }
    text += DelayLayer(layers[i]);
  }
  return absl::StrCat("model:\n  input_shape: [1]\n  init: {seed: 0}\n",
                      "  loss: mse\n  layers:\n", text);
}

// `stages` stages of one delay layer of costs `c` each.
std::string ModelYaml(int stages, const StageCosts& c) {
  std::vector<int> begin(stages);
  std::iota(begin.begin(), begin.end(), 0);
  return ModelYaml(std::vector<StageCosts>(stages, c), begin);
}

// The simulator's run of the same schedule with the same costs on every
// stage, in milliseconds, with `latency_ms` per transfer between ranks and no
// bandwidth limit (the tensors are 4 bytes).
absl::StatusOr<scheduler::SimulationResult<double>> Predict(
    const scheduler::Schedule& schedule, const StageCosts& c,
    double latency_ms) {
  auto costs =
      c.backward_weight_ms > 0
          ? scheduler::SimulationCosts<double>::UniformSplit(
                c.forward_ms, c.backward_input_ms, c.backward_weight_ms)
          : scheduler::SimulationCosts<double>::Uniform(c.forward_ms,
                                                        c.backward_input_ms);
  costs.latency = latency_ms;
  return scheduler::Simulate(schedule, costs);
}

// The simulator's makespan in milliseconds (see Predict).
absl::StatusOr<double> PredictedMs(const scheduler::Schedule& schedule,
                                   const StageCosts& c, double latency_ms) {
  ASSIGN_OR_RETURN(auto result, Predict(schedule, c, latency_ms));
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
  // With telemetry (the executor's spans) only, else 0:
  // the ranks' forward + backward time (StageStepTimes), summed over every
  // stage of every rank, and
  double compute = 0;
  // the mean over ranks of the rank's idle time (its stages' idle_seconds)
  // over its own RankStepResult::seconds: the sum of the rank's stages'
  // conveyor_stage_receive_wait_ratio, as the worker exports it.
  double worker_bubble = 0;
};

// The measured bubble of one step: 1 - compute / (P x wall), the rank-time
// not spent in forward or backward, as SimulationResult::bubble_fraction()
// counts it.
double MeasuredBubble(const StepTiming& t, int ranks) {
  return t.wall > 0 ? 1.0 - t.compute / (ranks * t.wall) : 0.0;
}

// P ranks, each a thread that owns what a worker process would: its stages
// (r, r + P, ... with V > 1), data source, optimizer, TCP channel and
// executor. RunStep() releases every rank into the same step and waits for
// all of them. Not thread-safe: one thread drives it.
class Pipeline {
 public:
  // With `telemetry`, every rank does what a worker daemon does for metrics
  // and tracing: records the step's spans, updates its Prometheus series
  // (the channel's traffic included) and builds the StepReport that carries
  // the timeline to the coordinator. Without, none of that. `spec` has the
  // schedule's P x V stages.
  static absl::StatusOr<std::unique_ptr<Pipeline>> Create(
      const scheduler::Schedule& schedule, const engine::ModelSpec& spec,
      bool telemetry = true) {
    if (spec.num_stages != schedule.num_stages()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has ", spec.num_stages,
                       " stages, the schedule ", schedule.num_stages()));
    }
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
      timing.compute += r.compute_seconds;
      if (r.run_step_seconds > 0) {
        timing.worker_bubble += r.idle_seconds / r.run_step_seconds;
      }
    }
    timing.wall = std::chrono::duration<double>(last - first).count();
    timing.worker_bubble /= static_cast<double>(results_.size());
    return timing;
  }

  int ranks() const { return schedule_.ranks; }

 private:
  struct Rank {
    std::vector<std::unique_ptr<engine::Stage>> stages;
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
    double compute_seconds = 0;  // Forward + backward over its stages.
    double idle_seconds = 0;     // Idle over its stages.
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
    const int num_stages = schedule_.num_stages();
    std::vector<std::string> peers;
    for (int r = 0; r < p; ++r) {
      Rank& rank = ranks_[r];
      std::vector<int> indices;
      std::vector<engine::Parameter*> params;
      for (int s :
           scheduler::StagesOfRank(schedule_.placement, r, p, num_stages)) {
        ASSIGN_OR_RETURN(std::unique_ptr<engine::Stage> stage,
                         engine::Stage::Create(be, spec, s));
        RETURN_IF_ERROR(stage->InitializeFromSeed(0));
        for (engine::Parameter* param : stage->parameters()) {
          params.push_back(param);
        }
        rank.stages.push_back(std::move(stage));
        indices.push_back(s);
      }
      ASSIGN_OR_RETURN(
          rank.data, engine::DataSource::Create(engine::DataConfig{},
                                                job::ModelSampleShapes(spec)));
      ASSIGN_OR_RETURN(
          rank.optimizer,
          engine::Optimizer::Create(
              be, {.kind = engine::OptimizerConfig::Kind::kSgd, .lr = 1e-3},
              params));
      transport::TcpChannelConfig config;
      config.rank = r;
      config.world_size = p;
      config.job = kJob;
      config.secret = "pipeline-benchmark";
      if (telemetry_) {
        rank.metrics = std::make_unique<WorkerMetrics>(absl::StrCat("r", r));
        rank.job_metrics = rank.metrics->StartJob("job-1", indices);
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
      std::map<int, engine::PipelineStage*> stages;
      for (const auto& stage : rank.stages) {
        stages[stage->index()] = stage.get();
      }
      ASSIGN_OR_RETURN(
          rank.executor,
          StageExecutor::Create({.job = kJob,
                                 .rank = r,
                                 .num_ranks = p,
                                 .placement = schedule_.placement,
                                 .num_stages = num_stages,
                                 .batch_size = m,  // One sample a microbatch.
                                 .microbatches = m,
                                 .loss = spec.loss,
                                 .record_spans = telemetry_},
                                std::move(stages), rank.data.get(),
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
        out.compute_seconds = 0;
        out.idle_seconds = 0;
        for (const auto& [index, t] : result->stages) {
          out.compute_seconds += t.forward_seconds + t.backward_seconds;
          out.idle_seconds += t.idle_seconds;
        }
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

// A schedule and the pipeline that runs it, on a model of P x V stages of one
// delay layer of `costs` each.
struct Case {
  scheduler::Schedule schedule;
  std::unique_ptr<Pipeline> pipeline;
};

absl::StatusOr<Case> MakeCase(ScheduleKind kind, int p, int m, int v,
                              const StageCosts& costs, bool telemetry = true) {
  ASSIGN_OR_RETURN(
      engine::ModelSpec spec,
      engine::ParseModelSpecYaml(ModelYaml(p * v, costs), "bench.yaml"));
  ASSIGN_OR_RETURN(
      scheduler::Schedule schedule,
      scheduler::GenerateSchedule(
          kind, {.ranks = p, .microbatches = m, .virtual_stages = v}));
  ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> pipeline,
                   Pipeline::Create(schedule, spec, telemetry));
  return Case{.schedule = std::move(schedule), .pipeline = std::move(pipeline)};
}

// Runs `count` steps from `step` (advanced past them) and appends their
// timings to `out` (when not null).
absl::Status RunSteps(Pipeline& pipeline, int count, int64_t& step,
                      std::vector<StepTiming>* out) {
  for (int i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(StepTiming timing, pipeline.RunStep(step++));
    if (out != nullptr) out->push_back(timing);
  }
  return absl::OkStatus();
}

// Runs pipelines `a` and `b` in `rounds` rounds of one block of
// `steps_per_block` timed steps each, alternating which goes first, so both
// see the same machine load; appends each side's step timings to `a_out` and
// `b_out`. The first step of a block wakes a pipeline that sat idle and is
// not timed.
absl::Status RunAlternating(Pipeline& a, Pipeline& b, int rounds,
                            int steps_per_block, int64_t& step,
                            std::vector<StepTiming>& a_out,
                            std::vector<StepTiming>& b_out) {
  for (int round = 0; round < rounds; ++round) {
    for (int half = 0; half < 2; ++half) {
      const bool first = (round + half) % 2 == 0;
      Pipeline& p = first ? a : b;
      RETURN_IF_ERROR(RunSteps(p, 1, step, nullptr));
      RETURN_IF_ERROR(
          RunSteps(p, steps_per_block, step, first ? &a_out : &b_out));
    }
  }
  return absl::OkStatus();
}

std::vector<double> WallMs(const std::vector<StepTiming>& timings) {
  std::vector<double> ms;
  for (const StepTiming& t : timings) ms.push_back(t.wall * 1e3);
  return ms;
}

void BM_Pipeline(benchmark::State& state, ScheduleKind kind) {
  const int p = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  const StageCosts costs = CostsFor(kind);
  auto c = MakeCase(kind, p, m, /*v=*/1, costs);
  if (!c.ok()) return state.SkipWithError(c.status().ToString().c_str());
  Pipeline& pipeline = *c->pipeline;
  absl::StatusOr<double> latency =
      pipeline.MeasureLatency(kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  absl::StatusOr<double> predicted_ms =
      PredictedMs(c->schedule, costs, *latency * 1e3);
  absl::StatusOr<double> predicted_l0_ms = PredictedMs(c->schedule, costs, 0);
  if (!predicted_ms.ok() || !predicted_l0_ms.ok()) {
    return state.SkipWithError("the simulator failed");
  }

  int64_t step = 0;
  if (absl::Status s = RunSteps(pipeline, kWarmupSteps, step, nullptr);
      !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  std::vector<double> wall_ms, run_step_ms;
  for (auto _ : state) {
    auto timing = pipeline.RunStep(step++);
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

// The measured bubble of every schedule against the simulator's, P = 4,
// M = range(0): gpipe, 1f1b, eager-1f1b, zb-h1 and zb-h2 with V = 1, F =
// 4 ms, B = 8 ms (split: BI = BW = 4 ms); interleaved-1f1b, interleaved-zb,
// zb-v and dualpipev with V = 2 (8 stages on 4 ranks, by the schedule's
// placement) at half those costs a stage, so that every rank has the same
// work in every schedule. The measured bubble of a step is
// 1 - (forward + backward time of all ranks) / (P x step wall time), from
// the executor's per-stage times (StageStepTimes, what the worker exports as
// conveyor_stage_forward/backward_seconds_total); the median over the timed
// steps is reported. The simulator's bubble_fraction() is the same quantity
// at the configured costs. The worker's own gauge,
// conveyor_stage_receive_wait_ratio (receive waits over the rank's RunStep
// time), is reported too, as worker_bubble: it leaves out the ranks' staggered
// starts and early ends, which the pipeline's bubble counts.
void BM_Bubble(benchmark::State& state, ScheduleKind kind) {
  constexpr int kP = 4;
  const int m = static_cast<int>(state.range(0));
  const int v = TakesVirtualStages(kind) && kind != ScheduleKind::kGPipe &&
                        kind != ScheduleKind::kLoopedBFS
                    ? 2
                    : 1;
  const StageCosts costs = CostsFor(kind, v);
  auto c = MakeCase(kind, kP, m, v, costs);
  if (!c.ok()) return state.SkipWithError(c.status().ToString().c_str());
  Pipeline& pipeline = *c->pipeline;
  absl::StatusOr<double> latency =
      pipeline.MeasureLatency(kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  auto predicted = Predict(c->schedule, costs, *latency * 1e3);
  auto predicted_l0 = Predict(c->schedule, costs, 0);
  if (!predicted.ok() || !predicted_l0.ok()) {
    return state.SkipWithError("the simulator failed");
  }
  int64_t step = 0;
  if (absl::Status s = RunSteps(pipeline, kWarmupSteps, step, nullptr);
      !s.ok()) {
    return state.SkipWithError(s.ToString().c_str());
  }
  std::vector<double> wall_ms, bubble, worker_bubble;
  for (auto _ : state) {
    auto timing = pipeline.RunStep(step++);
    if (!timing.ok()) {
      return state.SkipWithError(timing.status().ToString().c_str());
    }
    state.SetIterationTime(timing->wall);
    wall_ms.push_back(timing->wall * 1e3);
    bubble.push_back(MeasuredBubble(*timing, kP));
    worker_bubble.push_back(timing->worker_bubble);
  }
  const double measured_bubble = Median(bubble);
  const double predicted_bubble = predicted->bubble_fraction();
  state.counters["P"] = kP;
  state.counters["M"] = m;
  state.counters["V"] = v;
  state.counters["latency_us"] = *latency * 1e6;
  state.counters["measured_ms"] = Median(wall_ms);
  state.counters["predicted_ms"] = predicted->makespan;
  state.counters["predicted_l0_ms"] = predicted_l0->makespan;
  state.counters["measured_bubble"] = measured_bubble;
  state.counters["predicted_bubble"] = predicted_bubble;
  state.counters["predicted_bubble_l0"] = predicted_l0->bubble_fraction();
  // Percentage points, measured - predicted (with the latency).
  state.counters["difference_pp"] = (measured_bubble - predicted_bubble) * 100;
  state.counters["worker_bubble"] = Median(worker_bubble);
}

// What zb-h1 saves over 1f1b, measured against predicted: both on P = 4
// ranks, M = range(0), F = 4 ms and a backward of 8 ms (zb-h1: BI = BW =
// 4 ms), run in alternating blocks so both see the same machine load.
// gain_fraction = (measured_1f1b - measured_zb) / (predicted_1f1b -
// predicted_zb), with medians of the step wall times and the simulator's
// makespans at the latency measured on the 1f1b pipeline. Target: >= 0.70.
void BM_ZbGain(benchmark::State& state) {
  constexpr int kP = 4, kRounds = 4, kStepsPerBlock = 4;
  const int m = static_cast<int>(state.range(0));
  const StageCosts costs_1f1b = CostsFor(ScheduleKind::k1F1B);
  const StageCosts costs_zb = CostsFor(ScheduleKind::kZeroBubbleH1);
  auto a = MakeCase(ScheduleKind::k1F1B, kP, m, 1, costs_1f1b);
  auto b = MakeCase(ScheduleKind::kZeroBubbleH1, kP, m, 1, costs_zb);
  if (!a.ok()) return state.SkipWithError(a.status().ToString().c_str());
  if (!b.ok()) return state.SkipWithError(b.status().ToString().c_str());
  absl::StatusOr<double> latency =
      a->pipeline->MeasureLatency(kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  auto predicted_1f1b = PredictedMs(a->schedule, costs_1f1b, *latency * 1e3);
  auto predicted_zb = PredictedMs(b->schedule, costs_zb, *latency * 1e3);
  if (!predicted_1f1b.ok() || !predicted_zb.ok()) {
    return state.SkipWithError("the simulator failed");
  }
  std::vector<StepTiming> t_1f1b, t_zb;
  int64_t step = 0;
  for (auto _ : state) {
    if (absl::Status s = RunAlternating(*a->pipeline, *b->pipeline, kRounds,
                                        kStepsPerBlock, step, t_1f1b, t_zb);
        !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
  const double measured_1f1b = Median(WallMs(t_1f1b));
  const double measured_zb = Median(WallMs(t_zb));
  state.counters["P"] = kP;
  state.counters["M"] = m;
  state.counters["latency_us"] = *latency * 1e6;
  state.counters["measured_1f1b_ms"] = measured_1f1b;
  state.counters["measured_zb_ms"] = measured_zb;
  state.counters["predicted_1f1b_ms"] = *predicted_1f1b;
  state.counters["predicted_zb_ms"] = *predicted_zb;
  state.counters["gain_fraction"] =
      (measured_1f1b - measured_zb) / (*predicted_1f1b - *predicted_zb);
  state.counters["steps"] = static_cast<double>(t_zb.size());
}

// Forward milliseconds of the 16 layers of the auto_split model; every
// backward is twice the forward. The heavy layers sit early, so that the even
// split (4 layers a stage) gives the stages 13, 7, 4 and 4 ms of forward
// where 28 / 4 = 7 would balance them; the best split the search finds is
// 8, 6, 7 and 7 ms (layers 0-1, 2-4, 5-8, 9-15), predicted about 0.33 faster.
constexpr double kUnevenForwardMs[] = {4, 4, 1, 4, 1, 4, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1};

// A pipeline on a model of kUnevenForwardMs delay layers, cut before each
// layer of `stage_begin`.
absl::StatusOr<std::unique_ptr<Pipeline>> MakeSplitPipeline(
    const scheduler::Schedule& schedule, const std::vector<int>& stage_begin) {
  std::vector<StageCosts> layers;
  for (double f : kUnevenForwardMs) layers.push_back({f, 2 * f, 0});
  ASSIGN_OR_RETURN(
      engine::ModelSpec spec,
      engine::ParseModelSpecYaml(ModelYaml(layers, stage_begin), "bench.yaml"));
  return Pipeline::Create(schedule, spec);
}

// The stage split that scheduler::SearchStages chooses against the even one:
// 1f1b, P = 4, M = 8, the kUnevenForwardMs model. The search gets the
// configured per-layer costs and the latency measured on the even pipeline;
// then both pipelines run in alternating blocks. Targets: the auto split's
// median step at least 20% faster than the even split's (speedup =
// even_ms / auto_ms - 1 >= 0.20), and within 5% of the search's predicted
// makespan (|auto_vs_prediction - 1| <= 0.05).
void BM_AutoSplit(benchmark::State& state) {
  constexpr int kP = 4, kM = 8, kRounds = 3, kStepsPerBlock = 4;
  constexpr int kLayers = std::size(kUnevenForwardMs);
  auto schedule = scheduler::GenerateSchedule(
      ScheduleKind::k1F1B, {.ranks = kP, .microbatches = kM});
  if (!schedule.ok()) {
    return state.SkipWithError(schedule.status().ToString().c_str());
  }
  // The uniform split of 16 layers into 4 stages.
  std::vector<int> even_begin;
  for (int s = 0; s < kP; ++s) even_begin.push_back(s * kLayers / kP);
  auto even = MakeSplitPipeline(*schedule, even_begin);
  if (!even.ok()) return state.SkipWithError(even.status().ToString().c_str());
  absl::StatusOr<double> latency =
      (*even)->MeasureLatency(kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  std::vector<scheduler::LayerCosts> layer_costs;
  for (double f : kUnevenForwardMs) {
    layer_costs.push_back(
        {.forward = f * 1e-3, .backward_input = 2 * f * 1e-3});
  }
  auto search = scheduler::SearchStages({.layers = std::move(layer_costs),
                                         .kind = ScheduleKind::k1F1B,
                                         .ranks = kP,
                                         .virtual_stages = 1,
                                         .microbatches = kM,
                                         .latency = *latency});
  if (!search.ok()) {
    return state.SkipWithError(search.status().ToString().c_str());
  }
  if (!search->even_makespan.has_value() ||
      search->even_stage_begin != even_begin) {
    return state.SkipWithError("the search's even split is not 4 x 4 layers");
  }
  auto automatic = MakeSplitPipeline(*schedule, search->stage_begin);
  if (!automatic.ok()) {
    return state.SkipWithError(automatic.status().ToString().c_str());
  }
  std::vector<StepTiming> auto_t, even_t;
  int64_t step = 0;
  for (auto _ : state) {
    if (absl::Status s = RunAlternating(**automatic, **even, kRounds,
                                        kStepsPerBlock, step, auto_t, even_t);
        !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
  const double auto_ms = Median(WallMs(auto_t));
  const double even_ms = Median(WallMs(even_t));
  const double predicted_auto_ms = search->makespan * 1e3;
  state.counters["P"] = kP;
  state.counters["M"] = kM;
  state.counters["latency_us"] = *latency * 1e6;
  state.counters["auto_ms"] = auto_ms;
  state.counters["even_ms"] = even_ms;
  state.counters["speedup"] = even_ms / auto_ms - 1;
  state.counters["predicted_auto_ms"] = predicted_auto_ms;
  state.counters["auto_vs_prediction"] = auto_ms / predicted_auto_ms;
  state.counters["predicted_even_ms"] = *search->even_makespan * 1e3;
  state.counters["even_vs_prediction"] =
      even_ms / (*search->even_makespan * 1e3);
  // The split, as the first layer of stages 1..3 (stage 0 begins at 0).
  for (int s = 1; s < kP; ++s) {
    state.counters[absl::StrCat("auto_begin_", s)] = search->stage_begin[s];
  }
  state.counters["steps"] = static_cast<double>(auto_t.size());
}

// The zero-bubble schedules' gains over 1f1b and over zb-h1, measured
// against simulated: P = 4, M = 16, each rank's work F, BI, BW a microbatch
// (costs 4, 4, 4 ms, or the unequal 4, 5, 3 ms), split over V stages a rank
// (V = 2 for interleaved-zb, zb-v and dualpipev: stages of half the cost).
// All run in turn, a block of steps each, for a few rounds; medians. Each
// schedule's peak activations are the simulator's busiest rank's in-flight
// microbatches times its stage size, in units of 1f1b's whole stage: 4 for
// 1f1b (rank 0 holds P); a schedule at or under that runs in 1f1b's memory,
// above it in relaxed memory.
void BM_ZbGains(benchmark::State& state) {
  constexpr int kP = 4, kM = 16, kRounds = 3, kStepsPerBlock = 3;
  const bool unequal = state.range(0) != 0;
  const double f = 4, bi = unequal ? 5 : 4, bw = unequal ? 3 : 4;
  struct Entry {
    std::string name;
    ScheduleKind kind;
    int v;
    double sim_ms = 0, peak = 0;
    std::unique_ptr<Pipeline> pipeline;
    std::vector<StepTiming> timings;
  };
  std::vector<Entry> entries;
  for (auto [name, kind, v] :
       std::vector<std::tuple<std::string, ScheduleKind, int>>{
           {"1f1b", ScheduleKind::k1F1B, 1},
           {"zb-h1", ScheduleKind::kZeroBubbleH1, 1},
           {"zb-h2", ScheduleKind::kZeroBubbleH2, 1},
           {"interleaved-zb/V:2", ScheduleKind::kInterleavedZeroBubble, 2},
           {"zb-v", ScheduleKind::kZeroBubbleV, 2},
           {"dualpipev", ScheduleKind::kDualPipeV, 2}}) {
    const StageCosts costs{f / v, bi / v, bw / v};
    auto c = MakeCase(kind, kP, kM, v, costs, /*telemetry=*/false);
    if (!c.ok()) return state.SkipWithError(c.status().ToString().c_str());
    entries.push_back({.name = name,
                       .kind = kind,
                       .v = v,
                       .pipeline = std::move(c->pipeline),
                       .timings = {}});
    auto sim = Predict(c->schedule, costs, 0);
    if (!sim.ok()) return state.SkipWithError(sim.status().ToString().c_str());
    entries.back().peak =
        static_cast<double>(*std::max_element(sim->peak_inflight.begin(),
                                              sim->peak_inflight.end())) /
        v;
    // Simulated again below, at the measured latency.
    entries.back().sim_ms = sim->makespan;
  }
  absl::StatusOr<double> latency = transport::MeasureLoopbackLatency(
      engine::CpuBackend::Get(), kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  for (Entry& e : entries) {
    auto schedule = scheduler::GenerateSchedule(
        e.kind, {.ranks = kP, .microbatches = kM, .virtual_stages = e.v});
    auto ms = schedule.ok()
                  ? PredictedMs(*schedule, {f / e.v, bi / e.v, bw / e.v},
                                *latency * 1e3)
                  : absl::StatusOr<double>(schedule.status());
    if (!ms.ok()) return state.SkipWithError(ms.status().ToString().c_str());
    e.sim_ms = *ms;
  }
  int64_t step = 0;
  for (auto _ : state) {
    for (int round = 0; round < kRounds; ++round) {
      for (Entry& e : entries) {
        if (absl::Status s = RunSteps(*e.pipeline, 1, step, nullptr); !s.ok()) {
          return state.SkipWithError(s.ToString().c_str());
        }
        if (absl::Status s =
                RunSteps(*e.pipeline, kStepsPerBlock, step, &e.timings);
            !s.ok()) {
          return state.SkipWithError(s.ToString().c_str());
        }
      }
    }
  }
  const double base = Median(WallMs(entries[0].timings));
  const double zb = Median(WallMs(entries[1].timings));
  for (const Entry& e : entries) {
    const double ms = Median(WallMs(e.timings));
    state.counters["ms:" + e.name] = ms;
    state.counters["sim_ms:" + e.name] = e.sim_ms;
    state.counters["peak:" + e.name] = e.peak;
    state.counters["gain_1f1b:" + e.name] = 1 - ms / base;
    state.counters["sim_gain_1f1b:" + e.name] =
        1 - e.sim_ms / entries[0].sim_ms;
    state.counters["gain_zbh1:" + e.name] = 1 - ms / zb;
    state.counters["sim_gain_zbh1:" + e.name] =
        1 - e.sim_ms / entries[1].sim_ms;
  }
  state.counters["latency_us"] = *latency * 1e6;
}
BENCHMARK(BM_ZbGains)
    ->Name("zb_gains/P:4/M:16")
    ->Arg(0)
    ->Arg(1)
    ->ArgName("unequal")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// schedule: auto against every schedule it considered, measured. The
// example's layers are profiled on this CPU (engine::ProfileLayers, as a
// worker profiles them for the coordinator), the planner chooses the
// schedule, V and cut for P = 4 workers within the job's memory budget
// (job::ChooseStages), and then every candidate that fits runs on its own
// best cut, with each layer replayed as a delay layer of its profiled
// forward, input-gradient and weight-gradient times: four ranks of real
// compute on a two-core machine would time the OS's scheduler rather than
// the pipeline. All candidates run in turn, a block of steps each, for a
// few rounds; medians. Target: the chosen one within 3% of the fastest
// measured (chosen_vs_fastest <= 1.03). Run with the transfer latency the
// coordinator uses (latency:1) and without (latency:0, as before workers
// measured it): with layers under a millisecond, schedules differ mostly in
// how many transfers their critical path holds.
void BM_AutoSchedule(benchmark::State& state, const char* example) {
  constexpr int kP = 4, kRounds = 3, kStepsPerBlock = 3;
  absl::StatusOr<job::JobSpec> job = job::LoadJobSpec(
      absl::StrCat(CONVEYOR_SOURCE_DIR, "/examples/", example, ".yaml"));
  if (!job.ok()) return state.SkipWithError(job.status().ToString().c_str());
  job->pipeline.schedule = "auto";
  job->pipeline.auto_schedule = true;
  job->pipeline.auto_stages = true;
  job->pipeline.workers = kP;
  job->pipeline.num_stages = kP;
  job->eval = {};
  auto plan = job::PlanJob(*job);
  if (!plan.ok()) return state.SkipWithError(plan.status().ToString().c_str());
  auto profile = engine::ProfileLayers(
      engine::CpuBackend::Get(), plan->job.model,
      {.microbatch_size = plan->job.training.microbatch_size(),
       .repetitions = 5});
  if (!profile.ok()) {
    return state.SkipWithError(profile.status().ToString().c_str());
  }
  std::vector<StageCosts> layers;
  for (const engine::LayerProfile& l : *profile) {
    layers.push_back({l.forward_seconds * 1e3, l.backward_input_seconds * 1e3,
                      l.backward_weight_seconds * 1e3});
  }
  // The transfer latency a worker measures with its profile (what the
  // coordinator then charges each simulated send), or none: latency:0
  // shows what the choice would be without it.
  absl::StatusOr<double> latency = transport::MeasureLoopbackLatency(
      engine::CpuBackend::Get(), kLatencySamples, kLatencyIdle);
  if (!latency.ok()) {
    return state.SkipWithError(latency.status().ToString().c_str());
  }
  const bool with_latency = state.range(0) != 0;
  auto chosen = job::ChooseStages(*plan, *profile, "this CPU", false,
                                  with_latency ? *latency : 0.0);
  if (!chosen.ok()) {
    return state.SkipWithError(chosen.status().ToString().c_str());
  }
  struct Candidate {
    std::string name;
    bool chosen = false;
    double predicted_ms = 0;
    std::unique_ptr<Pipeline> pipeline;
    std::vector<StepTiming> timings;
  };
  std::vector<Candidate> candidates;
  const int m = static_cast<int>(plan->job.training.microbatches);
  for (const job::ScheduleCandidate& c : chosen->auto_split->candidates) {
    if (!c.search.has_value()) continue;
    auto kind = scheduler::ParseScheduleKind(c.schedule);
    if (!kind.ok())
      return state.SkipWithError(kind.status().ToString().c_str());
    auto schedule = scheduler::GenerateSchedule(
        *kind,
        {.ranks = kP, .microbatches = m, .virtual_stages = c.virtual_stages});
    if (!schedule.ok()) {
      return state.SkipWithError(schedule.status().ToString().c_str());
    }
    auto spec = engine::ParseModelSpecYaml(
        ModelYaml(layers, c.search->stage_begin), "bench.yaml");
    if (!spec.ok())
      return state.SkipWithError(spec.status().ToString().c_str());
    auto pipeline = Pipeline::Create(*schedule, *spec, /*telemetry=*/false);
    if (!pipeline.ok()) {
      return state.SkipWithError(pipeline.status().ToString().c_str());
    }
    candidates.push_back(
        {.name = absl::StrCat(c.schedule, "/V:", c.virtual_stages),
         .chosen = c.schedule == chosen->job.pipeline.schedule &&
                   c.virtual_stages == chosen->virtual_stages,
         .predicted_ms = c.search->makespan * 1e3,
         .pipeline = *std::move(pipeline),
         .timings = {}});
  }
  int64_t step = 0;
  for (auto _ : state) {
    for (Candidate& c : candidates) {
      for (int i = 0; i < kWarmupSteps; ++i) {
        if (auto t = c.pipeline->RunStep(step++); !t.ok()) {
          return state.SkipWithError(t.status().ToString().c_str());
        }
      }
    }
    for (int round = 0; round < kRounds; ++round) {
      for (Candidate& c : candidates) {
        for (int i = 0; i < kStepsPerBlock; ++i) {
          absl::StatusOr<StepTiming> t = c.pipeline->RunStep(step++);
          if (!t.ok())
            return state.SkipWithError(t.status().ToString().c_str());
          c.timings.push_back(*t);
        }
      }
    }
  }
  double fastest = 0, chosen_ms = 0;
  std::string fastest_name;
  for (Candidate& c : candidates) {
    const double ms = Median(WallMs(c.timings));
    if (fastest_name.empty() || ms < fastest) {
      fastest = ms;
      fastest_name = c.name;
    }
    if (c.chosen) chosen_ms = ms;
    state.counters[absl::StrCat("ms:", c.name)] = ms;
    state.counters[absl::StrCat("sim_ms:", c.name)] = c.predicted_ms;
  }
  if (chosen_ms == 0) return state.SkipWithError("the choice did not run");
  state.SetLabel(absl::StrCat("chosen ", chosen->job.pipeline.schedule,
                              "/V:", chosen->virtual_stages, ", fastest ",
                              fastest_name));
  state.counters["candidates"] = static_cast<double>(candidates.size());
  state.counters["latency_us"] = *latency * 1e6;
  state.counters["chosen_ms"] = chosen_ms;
  state.counters["fastest_ms"] = fastest;
  state.counters["chosen_vs_fastest"] = chosen_ms / fastest;
  state.counters["predicted_chosen_ms"] =
      chosen->auto_split->search.makespan * 1e3;
}
BENCHMARK_CAPTURE(BM_AutoSchedule, uneven, "uneven")
    ->Name("auto_schedule/uneven/P:4")
    ->Arg(0)
    ->Arg(1)
    ->ArgName("latency")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_AutoSchedule, transformer, "transformer")
    ->Name("auto_schedule/transformer/P:4")
    ->Arg(0)
    ->Arg(1)
    ->ArgName("latency")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// What metrics and tracing cost a step: the same 1f1b pipeline (P = 4,
// M = 8, F = 4 ms, B = 8 ms) built twice, with and without telemetry, run
// in alternating blocks so both see the same machine, and compared by their
// median step times. Target: under 1% slower with telemetry.
void BM_Telemetry(benchmark::State& state) {
  constexpr int kP = 4, kM = 8, kRounds = 8, kStepsPerBlock = 4;
  const StageCosts costs = CostsFor(ScheduleKind::k1F1B);
  auto on = MakeCase(ScheduleKind::k1F1B, kP, kM, 1, costs,
                     /*telemetry=*/true);
  auto off = MakeCase(ScheduleKind::k1F1B, kP, kM, 1, costs,
                      /*telemetry=*/false);
  if (!on.ok() || !off.ok()) return state.SkipWithError("pipelines");
  std::vector<StepTiming> on_t, off_t;
  int64_t step = 0;
  for (auto _ : state) {
    if (absl::Status s = RunAlternating(*on->pipeline, *off->pipeline, kRounds,
                                        kStepsPerBlock, step, on_t, off_t);
        !s.ok()) {
      return state.SkipWithError(s.ToString().c_str());
    }
  }
  const double with = Median(WallMs(on_t)), without = Median(WallMs(off_t));
  state.counters["with_ms"] = with;
  state.counters["without_ms"] = without;
  state.counters["ratio"] = with / without;
  state.counters["steps"] = static_cast<double>(on_t.size());
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
BENCHMARK_CAPTURE(BM_Pipeline, eager_1f1b, ScheduleKind::kEager1F1B)
    ->Name("pipeline/eager-1f1b")
    ->Apply(Cases);

void BubbleCases(benchmark::internal::Benchmark* b) {
  b->Args({8})
      ->Args({16})
      ->ArgNames({"M"})
      ->Iterations(kBubbleTimedSteps)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_Bubble, gpipe, ScheduleKind::kGPipe)
    ->Name("bubble/gpipe/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, 1f1b, ScheduleKind::k1F1B)
    ->Name("bubble/1f1b/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, interleaved_1f1b, ScheduleKind::kInterleaved1F1B)
    ->Name("bubble/interleaved-1f1b/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, zb_h1, ScheduleKind::kZeroBubbleH1)
    ->Name("bubble/zb-h1/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, eager_1f1b, ScheduleKind::kEager1F1B)
    ->Name("bubble/eager-1f1b/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, interleaved_zb,
                  ScheduleKind::kInterleavedZeroBubble)
    ->Name("bubble/interleaved-zb/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, zb_h2, ScheduleKind::kZeroBubbleH2)
    ->Name("bubble/zb-h2/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, zb_v, ScheduleKind::kZeroBubbleV)
    ->Name("bubble/zb-v/P:4")
    ->Apply(BubbleCases);
BENCHMARK_CAPTURE(BM_Bubble, dualpipev, ScheduleKind::kDualPipeV)
    ->Name("bubble/dualpipev/P:4")
    ->Apply(BubbleCases);

BENCHMARK(BM_ZbGain)
    ->Name("zb_gain/P:4")
    ->Args({8})
    ->Args({16})
    ->ArgNames({"M"})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_AutoSplit)
    ->Name("auto_split/P:4/M:8")
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::worker

BENCHMARK_MAIN();
