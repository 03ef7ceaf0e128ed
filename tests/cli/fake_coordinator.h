// FakeCoordinator: conveyor-coordinator's two gRPC services, faked for
// conveyorctl's tests (in-process in the unit tests, and as the
// fake conveyor-coordinator binary that `run` is tested with).
//
// Jobs are parsed and planned with the real code, so a bad job gets the
// real INVALID_ARGUMENT "file:line:col: ..." answer. A job then "runs"
// while someone watches it: the first WatchJob stream drives it through
// PLANNING and RUNNING, one step event per step (the loss falls as 1/step),
// then the scripted outcome; CancelJob ends it CANCELLED at the next step.
// Workers register through WorkerSession (the fake worker binary) or are
// added by the test.
//
// Thread-safe: gRPC calls the services from its own threads.
#ifndef CONVEYOR_TESTS_CLI_FAKE_COORDINATOR_H_
#define CONVEYOR_TESTS_CLI_FAKE_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "conveyor/v1/conveyor.grpc.pb.h"

namespace conveyor::cli::testing {

class FakeCoordinator final : public v1::Coordinator::Service,
                              public v1::WorkerSession::Service {
 public:
  struct Options {
    absl::Duration step_delay = absl::ZeroDuration();
    v1::JobState outcome = v1::SUCCEEDED;  // Or FAILED.
    // FAILED: after this step (0: after the last).
    int64_t fail_after_step = 0;
    std::string failure_message = "worker-2 lost: no heartbeat for 5 s";
    // ListJobsResponse.warning (an unhealthy coordinator).
    std::string jobs_warning = "";
  };

  FakeCoordinator() : FakeCoordinator(Options()) {}
  explicit FakeCoordinator(Options options) : options_(std::move(options)) {}

  // Adds an IDLE worker (id assigned if empty).
  void AddWorker(const std::string& name) ABSL_LOCKS_EXCLUDED(mutex_);
  // Every SubmitJob request received, in order.
  std::vector<v1::SubmitJobRequest> submitted() const
      ABSL_LOCKS_EXCLUDED(mutex_);
  // Every job id CancelJob was called with.
  std::vector<std::string> cancelled() const ABSL_LOCKS_EXCLUDED(mutex_);

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::Job* response) override ABSL_LOCKS_EXCLUDED(mutex_);
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const v1::CancelJobRequest* request,
                         v1::Job* response) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  grpc::Status WatchJob(grpc::ServerContext* context,
                        const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override
      ABSL_LOCKS_EXCLUDED(mutex_);

  grpc::Status Session(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
          stream) override ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct JobEntry {
    v1::Job job;
    bool driven = false;  // A watch is running it.
    bool cancel_requested = false;
  };

  std::string AddWorkerLocked(v1::Worker worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void EndJobLocked(JobEntry& entry, v1::JobState state,
                    const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Options options_;
  mutable absl::Mutex mutex_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mutex_);
  std::map<std::string, v1::Worker> workers_ ABSL_GUARDED_BY(mutex_);
  std::vector<v1::SubmitJobRequest> submitted_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mutex_);
  int next_job_ ABSL_GUARDED_BY(mutex_) = 1;
  int next_worker_ ABSL_GUARDED_BY(mutex_) = 1;
};

}  // namespace conveyor::cli::testing

#endif  // CONVEYOR_TESTS_CLI_FAKE_COORDINATOR_H_
