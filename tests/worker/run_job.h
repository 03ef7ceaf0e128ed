// Runs a job as the workers run it, for tests: the coordinator's programs
// for a job YAML, every rank's JobRunner on its own thread over real
// TcpChannels on loopback, and the in-process reference trainer, each
// returning the final parameters and the losses.
#ifndef CONVEYOR_TESTS_WORKER_RUN_JOB_H_
#define CONVEYOR_TESTS_WORKER_RUN_JOB_H_

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "job/job_spec.h"
#include "job/planner.h"
#include "job/rank_program.h"
#include "job/trainer.h"
#include "proto/protocol.h"
#include "tests/engine/test_util.h"
#include "worker/job_runner.h"

namespace conveyor::worker::testing_util {

// The coordinator's programs for `yaml`, one per rank.
inline std::vector<v1::JobProgram> Programs(
    const std::string& yaml, const std::string& checkpoint_dir = "") {
  // The checkpoint directory is the job's (the worker compiles the same
  // program from the YAML), so the tests write theirs into it.
  std::string text = yaml;
  if (!checkpoint_dir.empty()) {
    if (absl::StrContains(text, "dir: unused")) {
      text = absl::StrReplaceAll(text,
                                 {{"dir: unused", "dir: " + checkpoint_dir}});
    } else {
      absl::StrAppend(&text, "checkpoint: {dir: ", checkpoint_dir, "}\n");
    }
  }
  auto job = job::ParseJobSpec(text, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  auto plan = job::PlanJob(*job);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<v1::JobProgram> programs;
  for (int r = 0; r < plan->num_ranks; ++r) {
    programs.push_back(job::CompileRankProgram(*plan, r,
                                               {.job_id = "job-7",
                                                .job_number = 7,
                                                .secret = "test-secret",
                                                .yaml = text,
                                                .file_name = "job.yaml",
                                                .recv_timeout_ms = 10000}));
  }
  return programs;
}

struct Result {
  std::vector<absl::Status> statuses;  // By rank.
  std::map<std::string, std::vector<float>> params;
  // Tied copies (Parameter::tied_copy), by name.
  std::map<std::string, std::vector<float>> tied_copies;
  std::vector<double> losses;
  std::vector<double> learning_rates;  // Rank 0's.
};

// Creates every rank's runner, then starts and runs each on its own thread.
// `during_run(runners)` is called once rank 0 has finished its first step.
inline Result RunJob(
    const std::vector<v1::JobProgram>& programs,
    const std::function<void(std::vector<JobRunner*>&)>& during_run = nullptr,
    std::vector<JobRunnerOptions> options = {}) {
  std::vector<std::unique_ptr<JobRunner>> owned;
  std::vector<JobRunner*> runners;
  std::vector<std::string> peers;
  Result out;
  options.resize(programs.size());
  for (size_t r = 0; r < programs.size(); ++r) {
    auto runner = JobRunner::Create(programs[r], options[r]);
    if (!runner.ok()) {
      ADD_FAILURE() << runner.status();
      return out;
    }
    peers.push_back((*runner)->data_endpoint());
    runners.push_back(runner->get());
    owned.push_back(*std::move(runner));
  }
  out.statuses.resize(runners.size());
  std::mutex mu;
  std::atomic<bool> first_step{false};
  std::vector<std::thread> threads;
  for (size_t r = 0; r < runners.size(); ++r) {
    threads.emplace_back([&, r] {
      absl::Status s = runners[r]->Start(peers);
      if (s.ok()) {
        s = runners[r]->Run([&](const StepProgress& p) {
          std::lock_guard<std::mutex> lock(mu);
          if (p.has_loss) out.losses.push_back(p.loss);
          if (r == 0) {
            out.learning_rates.push_back(p.learning_rate);
            first_step = true;
          }
        });
      }
      std::lock_guard<std::mutex> lock(mu);
      out.statuses[r] = s;
      for (engine::Parameter* param : runners[r]->parameters()) {
        (param->tied_copy ? out.tied_copies : out.params)[param->name] =
            engine::testing_util::ToVector(param->value);
      }
    });
  }
  if (during_run) {
    while (!first_step.load()) std::this_thread::yield();
    during_run(runners);
  }
  for (auto& t : threads) t.join();
  return out;
}

inline Result Reference(const std::string& yaml) {
  auto job = job::ParseJobSpec(yaml, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  // The backend `conveyorctl run --in-process` and the workers pick.
  auto trainer = *job::InProcessTrainer::Create(
      engine::CpuBackend::Get(job->training.precision), *job);
  Result out;
  EXPECT_TRUE(trainer
                  ->Run([&](const job::StepReport& r) {
                    out.losses.push_back(r.loss);
                    out.learning_rates.push_back(r.learning_rate);
                  })
                  .ok());
  for (engine::Parameter* p : trainer->parameters()) {
    (p->tied_copy ? out.tied_copies : out.params)[p->name] =
        engine::testing_util::ToVector(p->value);
  }
  return out;
}

}  // namespace conveyor::worker::testing_util

#endif  // CONVEYOR_TESTS_WORKER_RUN_JOB_H_
