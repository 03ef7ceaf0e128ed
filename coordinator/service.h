// The coordinator's gRPC services over a JobManager:
//   CoordinatorService    conveyor.v1.Coordinator, what conveyorctl calls;
//   WorkerSessionService  conveyor.v1.WorkerSession, one stream per worker.
//
// Both are thin: they translate between gRPC and the JobManager, whose
// Status codes are gRPC's (INVALID_ARGUMENT for a bad job, NOT_FOUND,
// RESOURCE_EXHAUSTED, FAILED_PRECONDITION for version skew), and both refuse
// calls without the cluster's auth token, when one is set, UNAUTHENTICATED.
//
// Worker sessions and WatchJob streams use gRPC's callback API, so an open
// stream holds no thread: a coordinator of thousands of workers would
// otherwise spend two threads (and their stacks) on each. A session's
// writes go through its own queue, so the JobManager never blocks on a slow
// worker while holding its lock; its messages are handled one at a time, in
// order, on a small pool shared by all sessions, because handling waits for
// the manager's lock and state-file writes, which gRPC's reactions must not.
// When the manager declares a worker lost, the session ends with that
// status; when the stream breaks, the worker is declared lost. WatchJob
// streams are served by a WatchHub (coordinator/watch_hub.h); the other
// calls are synchronous.
//
// Thread-safe: gRPC calls the handlers from its thread pool.
#ifndef CONVEYOR_COORDINATOR_SERVICE_H_
#define CONVEYOR_COORDINATOR_SERVICE_H_

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "common/thread_pool.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "coordinator/job_manager.h"
#include "coordinator/stream_limiter.h"
#include "coordinator/watch_hub.h"

namespace conveyor::coordinator {

class CoordinatorService final
    : public v1::Coordinator::WithCallbackMethod_WatchJob<
          v1::Coordinator::Service> {
 public:
  // With a non-empty `auth_token` every call must present it
  // (common/auth_token.h) or fails UNAUTHENTICATED.
  // Open WatchJob streams at most, in all and per client host; past these a
  // watch is refused (RESOURCE_EXHAUSTED). Watches hold no thread, only a
  // little memory each: the caps keep one client from taking it all.
  struct WatchLimits {
    int max_total = 4096;
    int max_per_client = 1024;
  };

  explicit CoordinatorService(JobManager* manager, std::string auth_token = "")
      : CoordinatorService(manager, std::move(auth_token), WatchLimits{}) {}
  CoordinatorService(JobManager* manager, std::string auth_token,
                     WatchLimits limits)
      : manager_(manager),
        auth_token_(std::move(auth_token)),
        watches_(limits.max_total, limits.max_per_client),
        hub_(manager) {}

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;

  // WatchJob streams open now.
  int open_watches() const { return hub_.open(); }
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status GetTrace(grpc::ServerContext* context,
                        const v1::GetTraceRequest* request,
                        v1::Trace* response) override;
  grpc::Status DrainWorker(grpc::ServerContext* context,
                           const v1::DrainWorkerRequest* request,
                           v1::Worker* response) override;

 private:
  JobManager* manager_;
  const std::string auth_token_;
  StreamLimiter watches_;
  WatchHub hub_;  // After watches_: its watches give their slots back.
};

class WorkerSessionService final : public v1::WorkerSession::CallbackService {
 public:
  // Threads that handle the sessions' messages. The manager handles one at
  // a time under its lock; more threads let one session's state-file write
  // overlap the next message's wait.
  static constexpr int kHandlerThreads = 4;

  // As CoordinatorService: a session without the token is refused before
  // its registration is read.
  explicit WorkerSessionService(JobManager* manager,
                                std::string auth_token = "")
      : manager_(manager),
        auth_token_(std::move(auth_token)),
        pool_(kHandlerThreads) {}

  // Told the kind of each worker message and how long the manager took to
  // handle it (waiting for its lock, the handling and any state-file write
  // it caused): the daemon feeds CoordinatorMetrics' handling histogram.
  // Set before the server starts; called from the handler threads. The
  // time runs from the message's arrival, so queueing for a handler
  // thread counts.
  using MessageTimer = std::function<void(v1::WorkerMessage::KindCase,
                                          std::chrono::steady_clock::duration)>;
  void set_message_timer(MessageTimer timer) { timer_ = std::move(timer); }

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  JobManager* manager_;
  const std::string auth_token_;
  MessageTimer timer_;
  // Last: destroyed first, it runs what sessions posted before it joins,
  // while the manager and the timer are still there.
  ThreadPool pool_;
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_SERVICE_H_
