// Pipelined training with the stage executor, one thread per rank over the
// in-memory data plane, must equal the in-process reference for every
// schedule: the final parameters (allclose), every step's loss and every
// evaluation's loss (bitwise).
#include "worker/stage_executor.h"

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/mesh_collective.h"
#include "engine/mesh_stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/trainer.h"
#include "scheduler/forward_only.h"
#include "scheduler/generators.h"
#include "scheduler/simulator.h"
#include "tests/engine/test_util.h"
#include "transport/in_memory_channel.h"

namespace conveyor::worker {
namespace {

using engine::CpuBackend;
using engine::testing_util::AllClose;
using engine::testing_util::ToVector;
using job::JobSpec;
using scheduler::ScheduleKind;
using ::testing::ElementsAre;

// An MLP or a stack of causal transformer blocks, with `stages` stages.
JobSpec MakeJob(bool transformer, int stages, bool clip) {
  std::string layers;
  if (transformer) {
    layers = absl::StrCat(
        "    - repeat: ", stages, "\n      boundary_every: 1\n      layers:\n",
        "        - transformer_block: {heads: 2, mlp_features: 16, causal: "
        "true}\n");
  } else {
    for (int s = 0; s < stages; ++s) {
      if (s > 0) layers += "    - boundary\n";
      layers += "    - dense: {features: 12}\n    - gelu\n";
    }
    layers += "    - dense: {features: 4}\n";
  }
  const std::string yaml =
      absl::StrCat("model:\n  input_shape: ", transformer ? "[5, 8]" : "[6]",
                   "\n  init: {seed: 4}\n  layers:\n", layers, "  loss: mse\n");
  JobSpec job;
  job.name = "pipeline";
  auto model = engine::ParseModelSpecYaml(yaml, "pipeline.yaml");
  EXPECT_TRUE(model.ok()) << model.status();
  job.model = *model;
  job.data = {.kind = engine::DataConfig::Kind::kSyntheticRegression,
              .seed = 9};
  job.optimizer = {.kind = engine::OptimizerConfig::Kind::kAdamW, .lr = 1e-2};
  if (clip) job.optimizer.clip_grad_norm = 0.05;  // Small: clipping happens.
  job.training = {.steps = 3, .batch_size = 16, .microbatches = 8};
  // Evaluations after steps 2 and 3 (the last), on other data.
  job.eval = {.enabled = true,
              .every = 2,
              .batches = 2,
              .data = {.kind = engine::DataConfig::Kind::kSyntheticRegression,
                       .seed = 11},
              .where = {}};
  return job;
}

struct Params {
  std::map<std::string, std::vector<float>> values;
  // Tied copies (Parameter::tied_copy), by name.
  std::map<std::string, std::vector<float>> copies;
  // The steps that failed: "rank r: status".
  std::vector<std::string> failures;
  std::vector<double> losses;
  std::vector<double> eval_losses;          // In step order.
  std::vector<double> grad_norms;           // Reference only.
  std::map<int, RankStepResult> last_step;  // By rank.
  // Activation bytes held by each rank's stages after the last evaluation.
  std::map<int, size_t> live_after_eval;
  // Mesh stages only: whether every replica ended with replica 0's values.
  bool replicas_identical = true;
};

Params Reference(const JobSpec& job) {
  auto trainer = *job::InProcessTrainer::Create(CpuBackend::Get(), job);
  Params p;
  EXPECT_TRUE(trainer
                  ->Run([&](const job::StepReport& r) {
                    p.losses.push_back(r.loss);
                    p.grad_norms.push_back(r.grad_norm);
                    if (r.eval) p.eval_losses.push_back(r.eval->loss);
                  })
                  .ok());
  for (engine::Parameter* param : trainer->parameters()) {
    (param->tied_copy ? p.copies : p.values)[param->name] =
        ToVector(param->value);
  }
  return p;
}

// Sums one double from each of `n` threads and hands every thread the total.
class SumBarrier {
 public:
  explicit SumBarrier(int n) : n_(n) {}
  double Sum(double x) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t round = round_;
    sum_ += x;
    if (++arrived_ == n_) {
      total_ = sum_;
      sum_ = 0;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != round; });
    }
    return total_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t round_ = 0;
  double sum_ = 0, total_ = 0;
};

// With mesh_devices > 1, rank `mesh_rank`'s stages are MeshStages over that
// many CPU devices.
// `before_step(rank, step, params)`, when given, runs on each rank's thread
// before each step.
using BeforeStep = std::function<void(
    int rank, int64_t step, const std::vector<engine::Parameter*>& params)>;
Params Pipelined(const JobSpec& job, ScheduleKind kind, int ranks,
                 int virtual_stages, int mesh_rank = -1, int mesh_devices = 1,
                 const BeforeStep& before_step = nullptr) {
  auto schedule = *scheduler::GenerateSchedule(
      kind, {.ranks = ranks,
             .microbatches = static_cast<int>(job.training.microbatches),
             .virtual_stages = virtual_stages});
  scheduler::Schedule eval_schedule;
  if (job.eval.enabled) {
    eval_schedule = *scheduler::GenerateForwardOnly(
        kind, {.ranks = ranks,
               .microbatches = static_cast<int>(job.eval.batches *
                                                job.training.microbatches),
               .virtual_stages = virtual_stages});
  }
  transport::InMemoryHub hub(ranks);
  SumBarrier barrier(ranks);
  Params out;
  std::mutex out_mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      engine::Backend* be = CpuBackend::Get();
      std::unique_ptr<engine::MeshCollective> mesh;
      std::vector<engine::MeshStage*> meshed;
      std::vector<std::unique_ptr<engine::PipelineStage>> owned;
      std::map<int, engine::PipelineStage*> stages;
      std::vector<engine::Parameter*> params;
      for (int s : scheduler::StagesOfRank(schedule.placement, r, ranks,
                                           job.model.num_stages)) {
        if (r == mesh_rank) {
          if (mesh == nullptr) {
            mesh = *engine::CreateHostMeshCollective(
                std::vector<engine::Backend*>(mesh_devices, be));
          }
          auto stage = *engine::MeshStage::Create(mesh.get(), job.model, s);
          ASSERT_TRUE(stage->InitializeFromSeed(*job.model.seed).ok());
          meshed.push_back(stage.get());
          owned.push_back(std::move(stage));
        } else {
          auto stage = *engine::Stage::Create(be, job.model, s);
          ASSERT_TRUE(stage->InitializeFromSeed(*job.model.seed).ok());
          owned.push_back(std::move(stage));
        }
        stages[s] = owned.back().get();
        for (auto* p : owned.back()->parameters()) params.push_back(p);
      }
      auto data = *engine::DataSource::Create(
          job.data, job::ModelSampleShapes(job.model));
      std::unique_ptr<engine::DataSource> eval_data;
      if (job.eval.enabled) {
        eval_data = *engine::DataSource::Create(
            job.eval.data, job::ModelSampleShapes(job.model));
      }
      auto optimizer = *engine::Optimizer::Create(be, job.optimizer, params);
      auto executor = StageExecutor::Create(
          {.job = 1,
           .rank = r,
           .num_ranks = ranks,
           .placement = schedule.placement,
           .num_stages = job.model.num_stages,
           .batch_size = job.training.batch_size,
           .microbatches = static_cast<int>(job.training.microbatches),
           .loss = job.model.loss,
           .tied = job.model.TiedParameters(),
           .check_tied = true},
          stages, data.get(), optimizer.get(), hub.endpoint(r), be);
      ASSERT_TRUE(executor.ok()) << executor.status();
      AllReduceSum reduce = nullptr;
      if (job.optimizer.clip_grad_norm) {
        reduce = [&](double x) -> absl::StatusOr<double> {
          return barrier.Sum(x);
        };
      }
      for (int64_t step = 0; step < job.training.steps; ++step) {
        if (before_step) before_step(r, step, params);
        auto result = (*executor)->RunStep(step, schedule.actions[r], reduce);
        if (!result.ok()) {
          hub.AbortAll(result.status());
          std::lock_guard<std::mutex> lock(out_mu);
          out.failures.push_back(
              absl::StrCat("rank ", r, ": ", result.status().ToString()));
          return;
        }
        {
          std::lock_guard<std::mutex> lock(out_mu);
          if (result->has_loss) out.losses.push_back(result->loss);
          out.last_step[r] = *result;
        }
        if (!job.eval.DueAfter(step + 1, job.training.steps)) continue;
        auto eval =
            (*executor)->RunEvaluation(step + 1, eval_schedule.actions[r],
                                       eval_data.get(), job.eval.batches);
        std::lock_guard<std::mutex> lock(out_mu);
        if (!eval.ok()) {
          hub.AbortAll(eval.status());
          out.failures.push_back(
              absl::StrCat("rank ", r, ": ", eval.status().ToString()));
          return;
        }
        if (eval->has_loss) out.eval_losses.push_back(eval->eval.loss);
        size_t live = 0;
        for (const auto& [s, stage] : stages) {
          EXPECT_EQ(stage->in_flight(), 0) << "stage " << s;
          live += stage->live_activation_bytes();
        }
        out.live_after_eval[r] = live;
      }
      std::lock_guard<std::mutex> lock(out_mu);
      for (auto* p : params) {
        (p->tied_copy ? out.copies : out.values)[p->name] = ToVector(p->value);
      }
      for (engine::MeshStage* stage : meshed) {
        const auto first = stage->replica(0)->parameters();
        for (int d = 1; d < stage->size(); ++d) {
          const auto other = stage->replica(d)->parameters();
          for (size_t i = 0; i < first.size(); ++i) {
            if (ToVector(other[i]->value) != ToVector(first[i]->value)) {
              out.replicas_identical = false;
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Every schedule accumulates each stage's gradients over microbatches in
// ascending order, as the reference does, and runs the same kernels, so
// without clipping the results are bitwise equal; with clipping the global
// norm is summed across ranks in another order, so allclose.
void ExpectSame(const Params& pipelined, const Params& reference,
                const std::string& what, bool bitwise = true) {
  EXPECT_THAT(pipelined.failures, ::testing::IsEmpty()) << what;
  ASSERT_EQ(pipelined.values.size(), reference.values.size()) << what;
  for (const auto& [name, values] : reference.values) {
    if (bitwise) {
      EXPECT_EQ(pipelined.values.at(name), values) << what << ": " << name;
    } else {
      EXPECT_TRUE(AllClose(pipelined.values.at(name), values, 1e-5, 1e-6))
          << what << ": " << name;
    }
  }
  // An evaluation's forwards are the training's kernels on the same
  // parameters, and its losses are summed in the same order: bitwise, with
  // or without clipping (when the parameters are, which clipping spoils).
  ASSERT_EQ(pipelined.eval_losses.size(), reference.eval_losses.size()) << what;
  for (size_t i = 0; bitwise && i < reference.eval_losses.size(); ++i) {
    EXPECT_EQ(pipelined.eval_losses[i], reference.eval_losses[i])
        << what << " evaluation " << i;
  }
  for (const auto& [rank, live] : pipelined.live_after_eval) {
    EXPECT_EQ(live, 0u) << what << ": rank " << rank
                        << " holds activations after an evaluation";
  }
  ASSERT_EQ(pipelined.losses.size(), reference.losses.size()) << what;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    EXPECT_NEAR(pipelined.losses[i], reference.losses[i],
                1e-5 * std::abs(reference.losses[i]))
        << what << " step " << i;
  }
  // The gradient norm the coordinator reports: the root of the ranks' sums
  // of squares. Equal gradients (bitwise runs) differ only in the order of
  // a few double sums; a mesh's are allclose, and so is their norm. A rank
  // or stage left out would miss by its whole share.
  if (!pipelined.last_step.empty() && !reference.grad_norms.empty()) {
    double squares = 0;
    for (const auto& [rank, result] : pipelined.last_step) {
      squares += result.grad_squared_sum;
    }
    const double expected = reference.grad_norms.back();
    EXPECT_GT(expected, 0) << what;
    EXPECT_NEAR(std::sqrt(squares), expected,
                (bitwise ? 1e-12 : 1e-4) * expected)
        << what << ": gradient norm of the last step";
  }
}

struct Case {
  ScheduleKind kind;
  int ranks, virtual_stages;
};

class PipelineEqualsReferenceTest
    : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(PipelineEqualsReferenceTest, FinalParametersAndLosses) {
  const auto [c, transformer] = GetParam();
  const JobSpec job = MakeJob(transformer, c.ranks * c.virtual_stages, false);
  const std::string what = absl::StrCat(scheduler::ScheduleKindName(c.kind),
                                        " P=", c.ranks, " V=", c.virtual_stages,
                                        transformer ? " transformer" : " mlp");
  const Params run = Pipelined(job, c.kind, c.ranks, c.virtual_stages);
  ExpectSame(run, Reference(job), what);
  // The stage-microbatches each rank held at its peak, as its stages
  // counted them, are the simulator's for the schedule (split kinds count a
  // microbatch until its BW, as both do).
  auto schedule = *scheduler::GenerateSchedule(
      c.kind, {.ranks = c.ranks,
               .microbatches = static_cast<int>(job.training.microbatches),
               .virtual_stages = c.virtual_stages});
  auto sim = scheduler::Simulate(
      schedule, scheduler::SimulationCosts<int64_t>::UniformSplit(1, 1, 1));
  ASSERT_TRUE(sim.ok()) << sim.status();
  for (int r = 0; r < c.ranks; ++r) {
    EXPECT_EQ(run.last_step.at(r).peak_in_flight, sim->peak_inflight[r])
        << what << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineEqualsReferenceTest,
    ::testing::Combine(
        ::testing::Values(Case{ScheduleKind::kGPipe, 2, 1},
                          Case{ScheduleKind::k1F1B, 2, 1},
                          Case{ScheduleKind::k1F1B, 4, 1},
                          Case{ScheduleKind::kInterleaved1F1B, 2, 2},
                          Case{ScheduleKind::kInterleaved1F1B, 4, 2},
                          Case{ScheduleKind::kZeroBubbleH1, 4, 1},
                          Case{ScheduleKind::kEager1F1B, 2, 1},
                          Case{ScheduleKind::kEager1F1B, 4, 1},
                          Case{ScheduleKind::kInterleavedZeroBubble, 4, 1},
                          Case{ScheduleKind::kInterleavedZeroBubble, 2, 2},
                          Case{ScheduleKind::kInterleavedZeroBubble, 4, 2},
                          Case{ScheduleKind::kGPipe, 4, 2},
                          Case{ScheduleKind::kZeroBubbleH2, 2, 1},
                          Case{ScheduleKind::kZeroBubbleH2, 4, 1},
                          Case{ScheduleKind::kZeroBubbleV, 2, 2},
                          Case{ScheduleKind::kZeroBubbleV, 4, 2},
                          Case{ScheduleKind::kLoopedBFS, 2, 2},
                          Case{ScheduleKind::kDualPipeV, 2, 2},
                          Case{ScheduleKind::kDualPipeV, 4, 2}),
        ::testing::Bool()));

TEST(StageExecutorTest, GlobalNormClippingMatchesTheReference) {
  const JobSpec job = MakeJob(false, 4, /*clip=*/true);
  ExpectSame(Pipelined(job, ScheduleKind::k1F1B, 4, 1), Reference(job),
             "1f1b P=4 with clipping", /*bitwise=*/false);
}

// The step's spans are the trace `conveyorctl trace` shows and the source of
// the per-stage metrics: they must account for the whole step, name every
// action of the schedule, and split the step into the per-stage times.
TEST(StageExecutorTest, SpansAccountForTheStep) {
  using telemetry::SpanKind;
  struct SpanCase {
    ScheduleKind kind;
    int ranks;
    int virtual_stages;
    bool clip;
  };
  for (const SpanCase& c :
       {SpanCase{ScheduleKind::k1F1B, 4, 1, true},
        SpanCase{ScheduleKind::kZeroBubbleH1, 2, 1, false},
        SpanCase{ScheduleKind::kInterleaved1F1B, 2, 2, true}}) {
    const int num_stages = c.ranks * c.virtual_stages;
    const JobSpec job = MakeJob(false, num_stages, c.clip);
    const int m = static_cast<int>(job.training.microbatches);
    const Params run = Pipelined(job, c.kind, c.ranks, c.virtual_stages);
    const std::string what =
        absl::StrCat(scheduler::ScheduleKindName(c.kind), " P=", c.ranks);
    ASSERT_EQ(run.last_step.size(), static_cast<size_t>(c.ranks)) << what;
    for (const auto& [rank, result] : run.last_step) {
      SCOPED_TRACE(absl::StrCat(what, " rank ", rank));
      int64_t covered_us = 0;
      int64_t previous_end = 0;
      std::map<std::pair<SpanKind, int>, int> counts;  // (kind, stage).
      for (const telemetry::Span& span : result.spans) {
        // One thread, and every moment of the step in exactly one span.
        EXPECT_EQ(span.start_us, previous_end);
        EXPECT_GE(span.duration_us, 0);
        previous_end = span.start_us + span.duration_us;
        covered_us += span.duration_us;
        ++counts[{span.kind, span.stage}];
        if (span.kind == SpanKind::kSend || span.kind == SpanKind::kRecvWait) {
          EXPECT_GT(span.bytes, 0u);
          EXPECT_GE(span.peer, 0);
          EXPECT_LT(span.peer, c.ranks);
        }
      }
      // The last span ends when the step does (its end rounded down to a
      // microsecond), so the spans account for the whole step however the
      // thread was scheduled.
      EXPECT_EQ(covered_us, previous_end);
      EXPECT_NEAR(static_cast<double>(covered_us), result.seconds * 1e6, 1.0);
      EXPECT_GT(result.start_unix_us, 0);
      ASSERT_EQ(result.stages.size(), static_cast<size_t>(c.virtual_stages));
      double idle = 0;
      double summed = 0;
      for (const auto& [stage, t] : result.stages) {
        EXPECT_EQ(stage % c.ranks, rank);
        EXPECT_EQ(t.microbatches, m);
        EXPECT_EQ((counts[{SpanKind::kForward, stage}]), m);
        const bool split = c.kind == ScheduleKind::kZeroBubbleH1;
        EXPECT_EQ((counts[{SpanKind::kBackward, stage}]), split ? 0 : m);
        EXPECT_EQ((counts[{SpanKind::kBackwardInput, stage}]), split ? m : 0);
        EXPECT_EQ((counts[{SpanKind::kBackwardWeight, stage}]), split ? m : 0);
        // A receive per forward not on stage 0 and per backward not on the
        // last stage; a send for each of those the other way.
        const int receives =
            (stage > 0 ? m : 0) + (stage + 1 < num_stages ? m : 0);
        EXPECT_EQ((counts[{SpanKind::kRecvWait, stage}]), receives);
        EXPECT_EQ((counts[{SpanKind::kSend, stage}]),
                  (stage + 1 < num_stages ? m : 0) + (stage > 0 ? m : 0));
        EXPECT_EQ((counts[{SpanKind::kLoss, stage}]),
                  stage + 1 == num_stages ? m : 0);
        EXPECT_GT(t.forward_seconds, 0);
        // The data loader's time is exactly the stage's data spans (it once
        // took in the forwards too), and part of its forward time.
        int64_t data_us = 0;
        for (const telemetry::Span& span : result.spans) {
          if (span.kind == SpanKind::kData && span.stage == stage) {
            data_us += span.duration_us;
          }
        }
        EXPECT_NEAR(t.data_seconds, data_us * 1e-6, 1e-9);
        EXPECT_LE(t.data_seconds, t.forward_seconds);
        EXPECT_GT(t.backward_seconds, 0);
        EXPECT_GE(t.optimizer_seconds, 0);
        EXPECT_GT(t.peak_activation_bytes, 0u);
        idle += t.idle_seconds;
        summed += t.forward_seconds + t.backward_seconds + t.optimizer_seconds +
                  t.communication_seconds + t.idle_seconds;
      }
      EXPECT_EQ((counts[{SpanKind::kAllReduce, -1}]), c.clip ? 1 : 0);
      // Zeroing, (the local norm,) and the update.
      EXPECT_EQ((counts[{SpanKind::kOptimizer, -1}]), c.clip ? 3 : 2);
      // The zeroing comes right before the rank's first receive or
      // backward: on the first rank after the forwards the next rank waits
      // for, on the others where they would wait anyway.
      size_t first = 0;
      while (first < result.spans.size() &&
             result.spans[first].kind != SpanKind::kRecvWait &&
             result.spans[first].kind != SpanKind::kBackward &&
             result.spans[first].kind != SpanKind::kBackwardInput &&
             result.spans[first].kind != SpanKind::kBackwardWeight) {
        ++first;
      }
      ASSERT_GT(first, 0u);
      ASSERT_LT(first, result.spans.size());
      EXPECT_EQ(result.spans[first - 1].kind, SpanKind::kOptimizer);
      if (rank == 0) {
        EXPECT_EQ(result.spans.front().kind, SpanKind::kData);
      }
      EXPECT_NEAR(idle, result.wait_seconds, 1e-9);
      EXPECT_NEAR(summed, static_cast<double>(covered_us) * 1e-6, 1e-9);
    }
  }
}

// A rank's activation peak comes at the backward that follows its most
// microbatches in flight: k stashes plus the output gradients that
// backward keeps, c * k + g bytes with c and g fixed per rank (identical
// microbatches). So across schedules the measured peaks lie on one line in
// the simulator's in-flight peaks k: gpipe (k = M) and 1f1b (k = P - r) fix
// it, and eager-1f1b (k = min(2(P-r)-1, M)) must fall on it.
TEST(StageExecutorTest, PeakActivationsFollowTheSimulatedInFlightPeaks) {
  const JobSpec job = MakeJob(false, 4, false);
  const int m = static_cast<int>(job.training.microbatches);
  std::map<ScheduleKind, std::vector<int>> simulated;
  std::map<ScheduleKind, std::vector<size_t>> measured;
  for (ScheduleKind kind :
       {ScheduleKind::k1F1B, ScheduleKind::kEager1F1B, ScheduleKind::kGPipe,
        ScheduleKind::kZeroBubbleH2}) {
    auto schedule =
        *scheduler::GenerateSchedule(kind, {.ranks = 4, .microbatches = m});
    auto sim = scheduler::Simulate(
        schedule,
        scheduler::SplitsBackward(kind)
            ? scheduler::SimulationCosts<int64_t>::UniformSplit(1, 1, 1)
            : scheduler::SimulationCosts<int64_t>::Uniform(1, 2));
    ASSERT_TRUE(sim.ok()) << sim.status();
    simulated[kind] = sim->peak_inflight;
    const Params run = Pipelined(job, kind, 4, 1);
    ASSERT_THAT(run.failures, ::testing::IsEmpty());
    for (int r = 0; r < 4; ++r) {
      measured[kind].push_back(run.last_step.at(r).peak_activation_bytes);
    }
  }
  EXPECT_THAT(simulated[ScheduleKind::kEager1F1B], ElementsAre(7, 5, 3, 1));
  EXPECT_THAT(simulated[ScheduleKind::kZeroBubbleH2], ElementsAre(7, 7, 7, 7));
  auto k = [&](ScheduleKind kind, int r) {
    return static_cast<int64_t>(simulated[kind][r]);
  };
  auto bytes = [&](ScheduleKind kind, int r) {
    return static_cast<int64_t>(measured[kind][r]);
  };
  const ScheduleKind one = ScheduleKind::k1F1B, all = ScheduleKind::kGPipe,
                     eager = ScheduleKind::kEager1F1B,
                     h2 = ScheduleKind::kZeroBubbleH2;
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_GT(bytes(one, r), 0);
    // Every held microbatch costs bytes: the line rises.
    EXPECT_GT(bytes(all, r) - bytes(one, r), 0);
    EXPECT_EQ((bytes(eager, r) - bytes(one, r)) * (k(all, r) - k(one, r)),
              (bytes(all, r) - bytes(one, r)) * (k(eager, r) - k(one, r)));
    // A microbatch whose BI ran and whose BW waits holds other tensors than
    // a whole stash (its output gradients, less what only BI needed), so
    // split schedules sit off this line; holding more microbatches than
    // 1F1B must still cost more bytes.
    if (k(h2, r) > k(one, r)) {
      EXPECT_GT(bytes(h2, r), bytes(one, r));
    }
  }
}

// A rank whose stage runs data parallel over a 2-device mesh (each
// microbatch of 2 rows split into 1 + 1) trains as the single-device
// reference does, up to the order of the gradient sums; with clipping the
// gradient norm must see the summed gradients.
TEST(StageExecutorTest, MeshStageMatchesTheReference) {
  struct MeshCase {
    bool transformer;
    int mesh_rank;
    bool clip;
  };
  for (const MeshCase& c :
       {MeshCase{false, 0, false}, MeshCase{false, 1, true},
        MeshCase{true, 1, false}, MeshCase{true, 0, true}}) {
    JobSpec job = MakeJob(c.transformer, 2, c.clip);
    if (c.transformer) {
      // The key bias has a zero gradient in exact arithmetic (softmax ignores
      // a constant added to a row of scores), so its computed gradient is
      // rounding noise, which Adam normalizes into lr-sized steps that differ
      // with the order of the sums. SGD leaves noise as noise.
      job.optimizer.kind = engine::OptimizerConfig::Kind::kSgd;
      job.optimizer.lr = 0.1;
      job.optimizer.momentum = 0.9;
    }
    const std::string what = absl::StrCat(
        c.transformer ? "transformer" : "mlp", " with rank ", c.mesh_rank,
        " on a 2-device mesh", c.clip ? ", clipping" : "");
    const Params run = Pipelined(job, ScheduleKind::k1F1B, 2, 1, c.mesh_rank,
                                 /*mesh_devices=*/2);
    ExpectSame(run, Reference(job), what, /*bitwise=*/false);
    EXPECT_TRUE(run.replicas_identical) << what;
    // The shards' activations add up to the whole microbatch's.
    ASSERT_EQ(run.last_step.size(), 2u) << what;
    const Params single = Pipelined(job, ScheduleKind::k1F1B, 2, 1);
    EXPECT_EQ(run.last_step.at(c.mesh_rank).peak_activation_bytes,
              single.last_step.at(c.mesh_rank).peak_activation_bytes)
        << what;
  }
}

// A byte-token model whose lm_head is tied to its embedding: embedding,
// `stages` - 1 causal transformer blocks each beginning a stage, a final
// layernorm and the tied head, on a byte file (vocabulary 128) written to
// `dir`.
JobSpec MakeTiedJob(int stages, bool clip, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 1200; ++i) {
    text.push_back(static_cast<char>(' ' + (i * 37 + i / 7) % 90));
  }
  std::ofstream(dir / "tokens.bin", std::ios::binary) << text;
  std::string layers = "    - embedding: {vocab_size: 128, features: 8}\n";
  for (int s = 1; s < stages; ++s) {
    layers +=
        "    - boundary\n"
        "    - transformer_block: {heads: 2, mlp_features: 16, causal: "
        "true, norm: pre}\n";
  }
  if (stages == 1) {
    layers += "    - dense: {features: 8}\n";
  }
  layers += "    - layernorm\n    - lm_head: {vocab_size: 128, tied: true}\n";
  auto model = engine::ParseModelSpecYaml(
      absl::StrCat("model:\n  input_shape: [6]\n  init: {seed: 4}\n"
                   "  layers:\n",
                   layers, "  loss: cross_entropy\n"),
      "tied.yaml");
  EXPECT_TRUE(model.ok()) << model.status();
  JobSpec job;
  job.name = "tied";
  job.model = *model;
  job.data = {.kind = engine::DataConfig::Kind::kTokens,
              .path = (dir / "tokens.bin").string(),
              .vocab_size = 128};
  job.optimizer = {.kind = engine::OptimizerConfig::Kind::kAdamW, .lr = 1e-2};
  if (clip) job.optimizer.clip_grad_norm = 0.05;
  job.training = {.steps = 3, .batch_size = 8, .microbatches = 4};
  return job;
}

// The tied embedding's two gradients are summed before every update, on
// one rank or across two: the copies stay bitwise equal (checked by the
// executor after every step, and here), and the run equals the reference,
// bitwise without clipping (the reference sums original + copy as the
// executors do).
TEST(StageExecutorTest, TiedEmbeddingsStayIdenticalAndMatchTheReference) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("tied_", getpid());
  struct TiedCase {
    ScheduleKind kind;
    int ranks, virtual_stages;
    bool clip;
  };
  for (const TiedCase& c :
       {TiedCase{ScheduleKind::k1F1B, 1, 1, false},
        TiedCase{ScheduleKind::k1F1B, 2, 1, false},
        TiedCase{ScheduleKind::kZeroBubbleH1, 3, 1, false},
        TiedCase{ScheduleKind::kInterleaved1F1B, 2, 2, false},
        TiedCase{ScheduleKind::k1F1B, 4, 1, true}}) {
    const JobSpec job = MakeTiedJob(c.ranks * c.virtual_stages, c.clip, dir);
    const std::string what =
        absl::StrCat(scheduler::ScheduleKindName(c.kind), " P=", c.ranks,
                     " V=", c.virtual_stages, c.clip ? " clipping" : "");
    const Params reference = Reference(job);
    const Params run = Pipelined(job, c.kind, c.ranks, c.virtual_stages);
    ExpectSame(run, reference, what, /*bitwise=*/!c.clip);
    ASSERT_EQ(run.copies.size(), 1u) << what;
    EXPECT_EQ(run.copies.at("layers.0.weight"),
              run.values.at("layers.0.weight"))
        << what;
    EXPECT_EQ(reference.copies.at("layers.0.weight"),
              reference.values.at("layers.0.weight"))
        << what;
    // Training moved the shared matrix (the comparisons are not of an
    // untouched init).
    const Params untrained = [&] {
      JobSpec none = job;
      none.training.steps = 0;
      return Reference(none);
    }();
    EXPECT_NE(run.values.at("layers.0.weight"),
              untrained.values.at("layers.0.weight"))
        << what;
  }
  std::filesystem::remove_all(dir);
}

// A copy that drifts from its original (here: nudged on the last stage's
// rank before step 2) fails the step, naming the parameter and the stages,
// instead of training two different models in silence.
TEST(StageExecutorTest, ADivergedTiedCopyFailsTheStep) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("tied_diverged_", getpid());
  const JobSpec job = MakeTiedJob(2, false, dir);
  const Params run = Pipelined(
      job, ScheduleKind::k1F1B, 2, 1, -1, 1,
      [](int rank, int64_t step,
         const std::vector<engine::Parameter*>& params) {
        if (rank != 1 || step != 1) return;
        for (engine::Parameter* p : params) {
          if (!p->tied_copy) continue;
          std::vector<float> v = ToVector(p->value);
          v[5] = std::nextafter(v[5], 1.0f);
          ASSERT_TRUE(
              CpuBackend::Get()
                  ->CopyFromHost(v.data(), v.size() * sizeof(float), p->value)
                  .ok());
        }
      });
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(run.failures.empty());
  EXPECT_THAT(run.failures,
              ::testing::Contains(::testing::HasSubstr(
                  "tied parameter layers.0.weight: after step 2 the copy on "
                  "stage 1 differs from the original on stage 0")));
  EXPECT_EQ(run.losses.size(), 1u);  // Step 1 went through.
}

TEST(StageExecutorTest, RejectsStagesOnTheWrongRank) {
  const JobSpec job = MakeJob(false, 2, false);
  auto stage = *engine::Stage::Create(CpuBackend::Get(), job.model, 1);
  transport::InMemoryHub hub(2);
  auto e = StageExecutor::Create({.rank = 0, .num_ranks = 2, .num_stages = 2},
                                 {{1, stage.get()}}, nullptr, nullptr,
                                 hub.endpoint(0), CpuBackend::Get());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(e.status().message(),
              ::testing::HasSubstr("stage 1 does not belong on rank 0"));
}

}  // namespace
}  // namespace conveyor::worker
