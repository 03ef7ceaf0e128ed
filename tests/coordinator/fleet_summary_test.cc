#include "coordinator/fleet_summary.h"

#include "gtest/gtest.h"

namespace conveyor::coordinator {
namespace {

TEST(FleetSummaryTest, CountsWorkersByStateAndLiveJobs) {
  std::vector<v1::Worker> workers(4);
  workers[0].set_state(v1::IDLE);
  workers[1].set_state(v1::BUSY);
  workers[2].set_state(v1::BUSY);
  workers[3].set_state(v1::LOST);
  std::vector<v1::Job> jobs(4);
  jobs[0].set_state(v1::RUNNING);
  jobs[1].set_state(v1::QUEUED);
  jobs[2].set_state(v1::QUEUED);
  jobs[3].set_state(v1::SUCCEEDED);
  EXPECT_EQ(FleetSummary(workers, jobs),
            "4 workers (1 idle, 2 busy, 1 lost); 1 job running, 2 queued");
}

TEST(FleetSummaryTest, OneWorkerIsSingular) {
  std::vector<v1::Worker> workers(1);
  workers[0].set_state(v1::IDLE);
  EXPECT_EQ(FleetSummary(workers, {}),
            "1 worker (1 idle, 0 busy); 0 jobs running, 0 queued");
}

}  // namespace
}  // namespace conveyor::coordinator
