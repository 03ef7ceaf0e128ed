#include "coordinator/job_run.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_run_context.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Counts what a JobRun tells the metrics.
class CountingObserver final : public JobObserver {
 public:
  void OnSubmitted(const v1::Job&) override {}
  void OnStep(const v1::Job&, const v1::StepSummary& step) override {
    steps.push_back(step.step());
  }
  void OnFinished(const v1::Job& job) override {
    finished.push_back(job.state());
  }
  void OnRestarted(const v1::Job&, absl::string_view reason,
                   bool /*layout_changed*/) override {
    restarted.push_back(std::string(reason));
  }
  std::vector<int64_t> steps;
  std::vector<v1::JobState> finished;
  std::vector<std::string> restarted;
};

class JobRunTest : public ::testing::Test {
 protected:
  JobRunTest()
      : context_({.failure_grace = std::chrono::milliseconds(500),
                  .observer = &observer_,
                  .version = kVersion,
                  .clock = [this] { return now_; }}) {
    w1_ = context_.AddWorker("a");
    w2_ = context_.AddWorker("b");
  }

  // Job 1 of `yaml` placed on w1 and w2 (as the Placer leaves it), both of
  // which report ready: RUNNING.
  JobRun& StartJob(const std::string& yaml) {
    JobRun& run = context_.AddJob(jobs_, 1, yaml);
    JobRun::JobRecord& job = run.job();
    job.ranks.Start(2);
    job.programs_sent = true;
    for (const std::string& id : {w1_, w2_}) {
      job.info.add_worker_ids(id);
      WorkerRecord& w = context_.Worker(id);
      w.info.set_state(v1::BUSY);
      w.info.set_job_id(job.info.id());
    }
    run.SetState(v1::PLANNING);
    Ready(run, w1_, 5001);
    Ready(run, w2_, 5002);
    EXPECT_EQ(job.info.state(), v1::RUNNING);
    return run;
  }
  void Ready(JobRun& run, const std::string& worker, int port) {
    v1::JobReady ready;
    ready.set_job_id(run.job().info.id());
    ready.set_data_endpoint(absl::StrCat("127.0.0.1:", port));
    run.OnReady(context_.Worker(worker), ready);
  }
  void Step(JobRun& run, const std::string& worker, int64_t step) {
    v1::StepReport report;
    report.set_job_id(run.job().info.id());
    report.set_step(step);
    report.set_seconds(0.5);
    run.OnStep(context_.Worker(worker), report);
  }
  // Events in the job's log that carry a step summary.
  int StepEvents(const JobRun& run) {
    int64_t cursor = 0;
    int n = 0;
    for (const v1::JobEvent& e : run.job().events.Read(&cursor)) {
      if (e.has_step()) ++n;
    }
    return n;
  }
  int Sent(const std::string& worker, v1::CoordinatorMessage::KindCase kind) {
    return static_cast<int>(context_.connections.at(worker)->Of(kind).size());
  }

  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  CountingObserver observer_;
  FakeJobRunContext context_;
  std::map<uint64_t, JobRun> jobs_;
  std::string w1_, w2_;
};

TEST_F(JobRunTest, ReadyFromEveryRankStartsTheJobOnAllOfThem) {
  JobRun& run = StartJob(JobYaml(2));
  EXPECT_EQ(Sent(w1_, v1::CoordinatorMessage::kStart), 1);
  EXPECT_EQ(Sent(w2_, v1::CoordinatorMessage::kStart), 1);
  const v1::StartJob start = context_.connections.at(w2_)
                                 ->Of(v1::CoordinatorMessage::kStart)[0]
                                 .start();
  EXPECT_THAT(start.peers(), ElementsAre("127.0.0.1:5001", "127.0.0.1:5002"));
  EXPECT_THAT(start.peer_names(), ElementsAre("a", "b"));
  EXPECT_EQ(context_.Worker(w1_).info.data_endpoint(), "127.0.0.1:5001");
  EXPECT_GT(run.job().info.started_unix_ms(), 0);
}

TEST_F(JobRunTest, AStepReportFromEveryRankMakesOneStepEvent) {
  JobRun& run = StartJob(JobYaml(2));
  Step(run, w1_, 1);
  EXPECT_EQ(StepEvents(run), 0);  // Rank 1 has not reported yet.
  EXPECT_EQ(run.job().info.steps_done(), 0);
  Step(run, w1_, 1);  // A second report of a rank counts once.
  Step(run, w2_, 1);
  EXPECT_EQ(StepEvents(run), 1);
  EXPECT_EQ(run.job().info.steps_done(), 1);
  EXPECT_THAT(observer_.steps, ElementsAre(1));
  // A report past the job's last step is ignored.
  Step(run, w1_, 4);
  Step(run, w2_, 4);
  EXPECT_EQ(StepEvents(run), 1);
}

TEST_F(JobRunTest, ARestartPolicyRequeuesInsteadOfFailing) {
  JobRun& run =
      StartJob(absl::StrCat(JobYaml(2), "restart: {max_restarts: 1}\n"));
  run.FailOrRestart("worker-2 (b) lost: gone", "worker_lost");
  const v1::Job& info = run.job().info;
  EXPECT_EQ(info.state(), v1::QUEUED);
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_EQ(info.last_restart_reason(), "worker-2 (b) lost: gone");
  EXPECT_TRUE(info.worker_ids().empty());
  EXPECT_EQ(context_.queue().head(), 1u);
  EXPECT_THAT(observer_.restarted, ElementsAre("worker_lost"));
  EXPECT_TRUE(observer_.finished.empty());
  // The workers of the attempt that ended are told to stop.
  EXPECT_EQ(Sent(w1_, v1::CoordinatorMessage::kCancel), 1);
  EXPECT_EQ(Sent(w2_, v1::CoordinatorMessage::kCancel), 1);
}

TEST_F(JobRunTest, WithoutARestartPolicyAFailureEndsTheJob) {
  JobRun& run = StartJob(JobYaml(2));
  run.FailOrRestart("worker-2 (b) lost: gone", "worker_lost");
  EXPECT_EQ(run.job().info.state(), v1::FAILED);
  EXPECT_EQ(run.job().info.message(), "worker-2 (b) lost: gone");
  EXPECT_TRUE(context_.queue().empty());
  EXPECT_THAT(observer_.finished, ElementsAre(v1::FAILED));
  EXPECT_THAT(context_.ended, ElementsAre(1u));
  // An ended job keeps only its names and hashes.
  EXPECT_TRUE(run.job().parsed.yaml.empty());
}

TEST_F(JobRunTest, AReportedFailureWaitsForTheGraceThenFails) {
  JobRun& run = StartJob(JobYaml(2));
  v1::JobEnded ended;
  ended.set_job_id(run.job().info.id());
  ended.set_state(v1::FAILED);
  ended.set_message("peer rank 1 closed the connection");
  run.OnEnded(context_.Worker(w1_), ended);
  // Freed, and the other rank told to stop; the job waits for the grace.
  EXPECT_THAT(context_.released, ElementsAre(w1_));
  EXPECT_EQ(Sent(w2_, v1::CoordinatorMessage::kCancel), 1);
  EXPECT_EQ(run.job().info.state(), v1::RUNNING);
  run.CheckDeadlines(now_ + std::chrono::milliseconds(100));
  EXPECT_EQ(run.job().info.state(), v1::RUNNING);
  run.CheckDeadlines(now_ + std::chrono::milliseconds(500));
  EXPECT_EQ(run.job().info.state(), v1::FAILED);
  EXPECT_THAT(run.job().info.message(),
              HasSubstr("worker-1 (a): peer rank 1 closed the connection"));
}

TEST_F(JobRunTest, ADrainStopsEveryRankAfterTheLatestPoint) {
  JobRun& run = StartJob(JobYaml(2, "mlp", 10));
  run.DrainJob("worker-2 (b) is drained: test");
  EXPECT_EQ(Sent(w1_, v1::CoordinatorMessage::kDrain), 1);
  v1::DrainPoint point;
  point.set_job_id(run.job().info.id());
  point.set_step(3);
  run.OnDrainPoint(context_.Worker(w1_), point);
  EXPECT_EQ(run.job().drain_step, 0);  // Rank 1 has not answered.
  point.set_step(4);
  run.OnDrainPoint(context_.Worker(w2_), point);
  EXPECT_EQ(run.job().drain_step, 4);
  const auto drains =
      context_.connections.at(w1_)->Of(v1::CoordinatorMessage::kDrain);
  ASSERT_EQ(drains.size(), 2u);
  EXPECT_EQ(drains[1].drain().stop_after_step(), 4);
}

}  // namespace
}  // namespace conveyor::coordinator
