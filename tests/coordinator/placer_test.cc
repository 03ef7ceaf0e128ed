#include "coordinator/placer.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_run_context.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;

class PlacerTest : public ::testing::Test {
 protected:
  explicit PlacerTest(JobManagerOptions options = JobManagerOptions())
      : context_(std::move(options)), placer_(context_, jobs_) {
    context_.update_queue_positions = [this] {
      placer_.UpdateQueuePositions();
    };
  }

  // Job `number` of `yaml`, submitted: at the tail of the queue.
  JobRun& Submit(uint64_t number, const std::string& yaml) {
    JobRun& run = context_.AddJob(jobs_, number, yaml);
    context_.queue().Add(number, run.job().info.priority());
    return run;
  }
  int Prepares(const std::string& worker) {
    return static_cast<int>(context_.connections.at(worker)
                                ->Of(v1::CoordinatorMessage::kPrepare)
                                .size());
  }

  FakeJobRunContext context_;
  std::map<uint64_t, JobRun> jobs_;
  Placer placer_;
};

TEST_F(PlacerTest, AJobWaitsWithAQueueReasonNamingTheWorkersItNeeds) {
  const std::string w1 = context_.AddWorker("a");
  JobRun& run = Submit(1, JobYaml(2));
  placer_.Schedule();
  EXPECT_EQ(run.job().info.state(), v1::QUEUED);
  EXPECT_EQ(run.job().info.queue_position(), 1);
  EXPECT_EQ(run.job().info.queue_reason(),
            "needs 2 workers; 1 is live: it waits for more to register");
  EXPECT_EQ(Prepares(w1), 0);

  // A second worker: placed, stage s on rank s, every rank its program.
  const std::string w2 = context_.AddWorker("b");
  placer_.Schedule();
  const v1::Job& info = run.job().info;
  EXPECT_EQ(info.state(), v1::PLANNING);
  EXPECT_EQ(info.queue_reason(), "");
  EXPECT_THAT(info.worker_ids(), ElementsAre(w1, w2));
  EXPECT_TRUE(context_.queue().empty());
  EXPECT_EQ(context_.Worker(w2).info.state(), v1::BUSY);
  EXPECT_EQ(context_.Worker(w2).info.job_id(), "job-1");
  EXPECT_THAT(context_.Worker(w2).info.stages(), ElementsAre(1));
  EXPECT_EQ(Prepares(w1), 1);
  EXPECT_EQ(Prepares(w2), 1);
  EXPECT_TRUE(run.job().programs_sent);
  EXPECT_EQ(info.layouts_size(), 1);
}

TEST_F(PlacerTest, TheQueueIsFirstComeFirstServed) {
  const std::string w1 = context_.AddWorker("a");
  const std::string w2 = context_.AddWorker("b");
  JobRun& first = Submit(1, JobYaml(2));
  JobRun& second = Submit(2, JobYaml(1));
  JobRun& third = Submit(3, JobYaml(1));
  placer_.Schedule();
  EXPECT_EQ(first.job().info.state(), v1::PLANNING);
  EXPECT_EQ(second.job().info.queue_position(), 1);
  EXPECT_EQ(second.job().info.queue_reason(),
            "needs 1 worker, 0 free; the others run jobs it cannot preempt "
            "(of equal or higher priority, or without checkpoint.dir)");
  EXPECT_EQ(third.job().info.queue_position(), 2);
  EXPECT_EQ(third.job().info.queue_reason(),
            "needs 1 worker, 0 free; behind job-2 (normal)");
}

TEST_F(PlacerTest, HigherPriorityGoesFirstAndHoldsUpThoseBehindIt) {
  JobRun& low = Submit(1, JobYaml(1) + "priority: low\n");
  JobRun& normal = Submit(2, JobYaml(1));
  JobRun& urgent = Submit(3, JobYaml(2) + "priority: urgent\n");
  JobRun& high = Submit(4, JobYaml(1) + "priority: 250\n");
  const std::string w1 = context_.AddWorker("a");
  placer_.Schedule();
  // The urgent job needs 2 of the 1 live worker: it waits for another to
  // register. Gang placement: none of it is placed on the one there is.
  EXPECT_EQ(urgent.job().info.queue_position(), 1);
  EXPECT_EQ(urgent.job().info.queue_reason(),
            "needs 2 workers; 1 is live: it waits for more to register");
  // No backfill: the others wait behind it though one worker is idle.
  EXPECT_EQ(high.job().info.state(), v1::QUEUED);
  EXPECT_EQ(high.job().info.queue_position(), 2);
  EXPECT_EQ(high.job().info.queue_reason(),
            "needs 1 worker, 1 free; behind job-3 (urgent)");
  EXPECT_EQ(context_.Worker(w1).info.state(), v1::IDLE);
  const std::string w2 = context_.AddWorker("b");
  placer_.Schedule();
  EXPECT_EQ(urgent.job().info.state(), v1::PLANNING);
  EXPECT_EQ(high.job().info.queue_reason(),
            "needs 1 worker, 0 free; the others run jobs it cannot preempt "
            "(of equal or higher priority, or without checkpoint.dir)");
  EXPECT_EQ(normal.job().info.queue_position(), 2);
  EXPECT_EQ(low.job().info.queue_position(), 3);
  EXPECT_EQ(low.job().info.queue_reason(),
            "needs 1 worker, 0 free; behind job-4 (250)");
  EXPECT_EQ(low.job().info.priority(), 0);
  EXPECT_EQ(high.job().info.effective_priority(), 250);
}

class PlacerQuotaTest : public PlacerTest {
 protected:
  PlacerQuotaTest()
      : PlacerTest(JobManagerOptions{.owner_quotas = {{"team-a", 2}}}) {}
};

TEST_F(PlacerQuotaTest, AJobOverItsOwnersQuotaWaitsWithoutHoldingUpOthers) {
  for (const char* name : {"a", "b", "c", "d", "e"}) context_.AddWorker(name);
  JobRun& first = Submit(1, JobYaml(2) + "owner: team-a\n");
  placer_.Schedule();
  // Urgent, but team-a's first job holds its 2 workers.
  JobRun& second = Submit(2, JobYaml(1) + "owner: team-a\npriority: urgent\n");
  JobRun& other = Submit(3, JobYaml(2) + "owner: team-b\n");
  JobRun& none = Submit(4, JobYaml(1));
  placer_.Schedule();
  EXPECT_EQ(first.job().info.state(), v1::PLANNING);
  EXPECT_EQ(second.job().info.state(), v1::QUEUED);
  EXPECT_EQ(second.job().info.queue_position(), 1);
  EXPECT_EQ(second.job().info.queue_reason(),
            "owner team-a at quota 2 (its jobs hold 2; this one needs 1)");
  // Passed over: team-b's job and the one without an owner run meanwhile.
  EXPECT_EQ(other.job().info.state(), v1::PLANNING);
  EXPECT_EQ(none.job().info.state(), v1::PLANNING);
  EXPECT_EQ(first.job().info.owner(), "team-a");

  // The first job ends: its workers free and the quota with them.
  first.Finish(v1::CANCELLED, "done");
  for (const std::string& id : first.job().info.worker_ids()) {
    context_.ReleaseWorker(context_.Worker(id));
  }
  placer_.Schedule();
  EXPECT_EQ(second.job().info.state(), v1::PLANNING);
}

TEST_F(PlacerQuotaTest, AJobLargerThanItsOwnersQuotaSaysItCannotRun) {
  for (const char* name : {"a", "b", "c"}) context_.AddWorker(name);
  JobRun& big = Submit(1, JobYaml(3) + "owner: team-a\n");
  JobRun& small = Submit(2, JobYaml(1));
  placer_.Schedule();
  EXPECT_EQ(big.job().info.queue_reason(),
            "needs 3 workers, more than owner team-a's quota of 2: it cannot "
            "run until the quota is raised");
  EXPECT_EQ(small.job().info.state(), v1::PLANNING);
}

TEST_F(PlacerTest, AJobIsNotPlacedBeforeItIsDurable) {
  context_.AddWorker("a");
  context_.AddWorker("b");
  JobRun& run = Submit(1, JobYaml(2));
  run.job().durable = false;
  placer_.Schedule();
  EXPECT_EQ(run.job().info.state(), v1::QUEUED);
  run.job().durable = true;
  placer_.Schedule();
  EXPECT_EQ(run.job().info.state(), v1::PLANNING);
}

TEST_F(PlacerTest, EachAttemptsProgramHasItsOwnJobNumberAndTheSecret) {
  context_.AddWorker("a");
  context_.AddWorker("b");
  JobRun& run = Submit(3, JobYaml(2));
  run.job().attempt = 2;
  placer_.Schedule();
  const v1::JobProgram program = placer_.MakeProgram(run, 1);
  EXPECT_EQ(program.job_number(), (uint64_t{3} << 16) | 2);
  EXPECT_EQ(program.secret(), run.job().secret);
  EXPECT_EQ(program.secret().size(), 32u);
}

TEST_F(PlacerTest, AWorkerWhoseSessionClosedIsLostWhenPlaced) {
  const std::string w1 = context_.AddWorker("a");
  const std::string w2 = context_.AddWorker("b");
  context_.connections.at(w2)->closed = true;
  Submit(1, JobYaml(2));
  placer_.Schedule();
  EXPECT_THAT(context_.lost,
              ElementsAre("worker-2: its session closed before the program "
                          "was sent"));
}

}  // namespace
}  // namespace conveyor::coordinator
