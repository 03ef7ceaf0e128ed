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
  PlacerTest() : placer_(context_, jobs_) {
    context_.update_queue_positions = [this] {
      placer_.UpdateQueuePositions();
    };
  }

  // Job `number` of `yaml`, submitted: at the tail of the queue.
  JobRun& Submit(uint64_t number, const std::string& yaml) {
    JobRun& run = context_.AddJob(jobs_, number, yaml);
    context_.queue().Add(number);
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
            "needs 1 worker idle; 0 are (the others run or finish other "
            "jobs)");
  EXPECT_EQ(third.job().info.queue_position(), 2);
  EXPECT_EQ(third.job().info.queue_reason(),
            "behind 1 job (first come, first served)");
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
