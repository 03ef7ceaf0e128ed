// Pipelined training with the stage executor, one thread per rank over the
// in-memory data plane, must equal the in-process reference for every
// schedule: the final parameters (allclose) and every step's loss.
#include "worker/stage_executor.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/generators.h"
#include "tests/engine/test_util.h"
#include "transport/in_memory_channel.h"

namespace conveyor::worker {
namespace {

using engine::CpuBackend;
using engine::JobSpec;
using engine::testing_util::AllClose;
using engine::testing_util::ToVector;
using scheduler::ScheduleKind;

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
  return job;
}

struct Params {
  std::map<std::string, std::vector<float>> values;
  std::vector<double> losses;
};

Params Reference(const JobSpec& job) {
  auto trainer = *engine::InProcessTrainer::Create(CpuBackend::Get(), job);
  Params p;
  EXPECT_TRUE(trainer
                  ->Run([&](const engine::StepReport& r) {
                    p.losses.push_back(r.loss);
                  })
                  .ok());
  for (engine::Parameter* param : trainer->parameters()) {
    p.values[param->name] = ToVector(param->value);
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

Params Pipelined(const JobSpec& job, ScheduleKind kind, int ranks,
                 int virtual_stages) {
  auto schedule = *scheduler::GenerateSchedule(
      kind, {.ranks = ranks,
             .microbatches = static_cast<int>(job.training.microbatches),
             .virtual_stages = virtual_stages});
  transport::InMemoryHub hub(ranks);
  SumBarrier barrier(ranks);
  Params out;
  std::mutex out_mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      engine::Backend* be = CpuBackend::Get();
      std::vector<std::unique_ptr<engine::Stage>> owned;
      std::map<int, engine::Stage*> stages;
      std::vector<engine::Parameter*> params;
      for (int s = r; s < job.model.num_stages; s += ranks) {
        owned.push_back(*engine::Stage::Create(be, job.model, s));
        ASSERT_TRUE(owned.back()->InitializeFromSeed(*job.model.seed).ok());
        stages[s] = owned.back().get();
        for (auto* p : owned.back()->parameters()) params.push_back(p);
      }
      auto data = *engine::DataSource::Create(
          job.data,
          {.input = job.model.input_shape, .target = job.model.target_shape});
      auto optimizer = *engine::Optimizer::Create(be, job.optimizer, params);
      auto executor = StageExecutor::Create(
          {.job = 1,
           .rank = r,
           .num_ranks = ranks,
           .num_stages = job.model.num_stages,
           .batch_size = job.training.batch_size,
           .microbatches = static_cast<int>(job.training.microbatches),
           .loss = job.model.loss},
          stages, data.get(), optimizer.get(), hub.endpoint(r), be);
      ASSERT_TRUE(executor.ok()) << executor.status();
      AllReduceSum reduce = nullptr;
      if (job.optimizer.clip_grad_norm) {
        reduce = [&](double x) -> absl::StatusOr<double> {
          return barrier.Sum(x);
        };
      }
      for (int64_t step = 0; step < job.training.steps; ++step) {
        auto result = (*executor)->RunStep(step, schedule.actions[r], reduce);
        if (!result.ok()) {
          hub.AbortAll(result.status());
          ADD_FAILURE() << result.status();
          return;
        }
        if (result->has_loss) {
          std::lock_guard<std::mutex> lock(out_mu);
          out.losses.push_back(result->loss);
        }
      }
      std::lock_guard<std::mutex> lock(out_mu);
      for (auto* p : params) out.values[p->name] = ToVector(p->value);
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
  ASSERT_EQ(pipelined.values.size(), reference.values.size()) << what;
  for (const auto& [name, values] : reference.values) {
    if (bitwise) {
      EXPECT_EQ(pipelined.values.at(name), values) << what << ": " << name;
    } else {
      EXPECT_TRUE(AllClose(pipelined.values.at(name), values, 1e-5, 1e-6))
          << what << ": " << name;
    }
  }
  ASSERT_EQ(pipelined.losses.size(), reference.losses.size()) << what;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    EXPECT_NEAR(pipelined.losses[i], reference.losses[i],
                1e-5 * std::abs(reference.losses[i]))
        << what << " step " << i;
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
  ExpectSame(Pipelined(job, c.kind, c.ranks, c.virtual_stages), Reference(job),
             what);
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
                          Case{ScheduleKind::kGPipe, 4, 2}),
        ::testing::Bool()));

TEST(StageExecutorTest, GlobalNormClippingMatchesTheReference) {
  const JobSpec job = MakeJob(false, 4, /*clip=*/true);
  ExpectSame(Pipelined(job, ScheduleKind::k1F1B, 4, 1), Reference(job),
             "1f1b P=4 with clipping", /*bitwise=*/false);
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
