// FakeJobRunContext: the JobRunContext of the JobRun, Placer and JobStore
// tests, in place of a JobManager: a real WorkerRegistry and JobQueue, and a
// record of what the parts asked of the manager. Not thread-safe (tests).
#ifndef CONVEYOR_TESTS_COORDINATOR_FAKE_JOB_RUN_CONTEXT_H_
#define CONVEYOR_TESTS_COORDINATOR_FAKE_JOB_RUN_CONTEXT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/job_run.h"
#include "gtest/gtest.h"
#include "job/parsed_job.h"
#include "job/planner.h"
#include "proto/protocol.h"
#include "tests/coordinator/test_util.h"

namespace conveyor::coordinator {

class FakeJobRunContext final : public JobRunContext {
 public:
  explicit FakeJobRunContext(JobManagerOptions options = JobManagerOptions())
      : options_(std::move(options)),
        workers_(kVersion),
        queue_(options_.aging_per_minute) {
    options_.version = kVersion;
  }

  const JobManagerOptions& options() const override { return options_; }
  WorkerRegistry& workers() override { return workers_; }
  JobQueue& queue() override { return queue_; }
  void MarkChanged() override { ++changes; }
  void EventAdded(uint64_t) override { ++events; }
  void UpdateQueuePositions() override {
    ++queue_updates;
    if (update_queue_positions) update_queue_positions();
  }
  void ReleaseWorker(WorkerRecord& w) override {
    if (w.info.state() != v1::BUSY) return;
    released.push_back(w.info.id());
    w.info.set_state(v1::IDLE);
    w.info.clear_job_id();
    w.info.clear_stages();
    w.info.clear_data_endpoint();
  }
  void MarkLost(WorkerRecord& w, const std::string& observed) override {
    lost.push_back(absl::StrCat(w.info.id(), ": ", observed));
    w.info.set_state(v1::LOST);
  }
  std::string DescribeWorker(const WorkerRecord& w) const override {
    return w.info.id();
  }
  void OnJobEnded(JobRun& run) override { ended.push_back(run.job().number); }

  // Registers an IDLE worker with `devices`; returns its id.
  std::string AddWorker(const std::string& name,
                        const std::vector<std::string>& devices = {"cpu:1"}) {
    auto connection = std::make_shared<FakeConnection>();
    v1::RegisterRequest r;
    r.set_protocol_version(proto::kProtocolVersion);
    r.set_version(kVersion);
    r.set_name(name);
    for (const std::string& d : devices) r.add_devices(d);
    absl::StatusOr<WorkerRecord*> added =
        workers_.Add(r, connection, options_.clock(), 0);
    EXPECT_TRUE(added.ok()) << added.status();
    connections[(*added)->info.id()] = connection;
    return (*added)->info.id();
  }
  WorkerRecord& Worker(const std::string& id) { return *workers_.Find(id); }

  // A JobRun in `jobs` for job `number` of `yaml`, planned and described
  // as SubmitJob leaves it, QUEUED but not in the queue.
  JobRun& AddJob(std::map<uint64_t, JobRun>& jobs, uint64_t number,
                 const std::string& yaml) {
    JobRun& run = jobs.try_emplace(number, *this, number).first->second;
    JobRun::JobRecord& job = run.job();
    absl::StatusOr<job::ParsedJob> parsed = job::ParseJob(yaml, "job.yaml", "");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    absl::StatusOr<job::JobPlan> plan = job::PlanJob(parsed->spec);
    EXPECT_TRUE(plan.ok()) << plan.status();
    job.parsed = *std::move(parsed);
    job.plan = *std::move(plan);
    job.file_ranks = job.plan.num_ranks;
    job.secret = JobRun::MakeSecret();
    job.info.set_id(absl::StrCat("job-", number));
    job.info.set_name(job.plan.job.name);
    job.info.set_priority(job.plan.job.priority);
    job.info.set_owner(job.plan.job.owner);
    run.DescribePlan();
    job.info.set_state(v1::QUEUED);
    return run;
  }

  std::map<std::string, std::shared_ptr<FakeConnection>> connections;
  int changes = 0;
  int events = 0;
  int queue_updates = 0;
  std::function<void()> update_queue_positions;
  std::vector<std::string> released;
  std::vector<std::string> lost;
  std::vector<uint64_t> ended;

 private:
  JobManagerOptions options_;
  WorkerRegistry workers_;
  JobQueue queue_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_TESTS_COORDINATOR_FAKE_JOB_RUN_CONTEXT_H_
