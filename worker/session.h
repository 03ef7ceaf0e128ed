// WorkerSession: the worker daemon's side of conveyor.v1.WorkerSession, the
// one long-lived bidirectional stream to the coordinator.
//
// Per stream: the session registers (protocol and release version, name,
// devices, data address), then a heartbeat thread sends Heartbeat{job_id}
// every heartbeat_interval_ms the coordinator asked for, while the calling
// thread reads and dispatches the coordinator's messages:
//   PrepareJob  starts a job thread that builds a JobRunner and answers
//               JobReady (or JobEnded FAILED); a second job while one is
//               held is answered JobEnded{FAILED, "worker busy with job-N"};
//   StartJob    connects the job's data plane and runs it, one StepReport
//               per step, then JobEnded;
//   CancelJob   aborts the job's data plane at once; JobEnded{CANCELLED}.
//   DrainJob    (worker/drain_gate.h) answers DrainPoint, or, with its
//               step, makes the job checkpoint that step and stop after it:
//               JobEnded{CANCELLED, drained_after_step}.
//   Leave       this worker has been drained: Shutdown.
//   ProfileModel (stages: auto) starts a job thread that times each layer
//               of the job's model (engine/profiler.h) and answers
//               ModelProfile; the worker then holds itself for the job's
//               PrepareJob. A failed profile, or a CancelJob before the
//               PrepareJob, is answered JobEnded.
// A job whose StartJob does not come within prepare_timeout ends FAILED, so
// it cannot pin the worker. Every job, however it ends, releases its
// resources and the worker serves the next one. After each checkpoint write
// the job sends CheckpointSaved (the files' sizes and CRC-32C) before its
// next StepReport, so the coordinator can commit the step.
//
// Drain (the daemon's first SIGTERM) asks the coordinator to drain this
// worker, which ends in Leave. Shutdown (Leave, or the daemon's second
// SIGTERM, or its drain grace running out) cancels the job, waits
// (shutdown_grace) for its JobEnded to go out, then sends Deregister and
// closes the stream: the coordinator forgets the worker rather than
// reporting it lost.
//
// A broken stream (or a coordinator that cannot be reached) aborts the job,
// whose results could no longer be reported, and the session reconnects and
// registers again every reconnect_interval, until Shutdown. The one error it
// does not retry is a refused registration (FAILED_PRECONDITION: version
// skew; UNAUTHENTICATED: a missing or wrong auth token): Run returns it,
// since retrying cannot fix a skewed build or a wrong token.
//
// Thread-safety: Run is called from one thread; Shutdown from any thread
// (the daemon's signal thread) and any number of times. Writes to the stream
// come from the reading, heartbeat and job threads and are serialized,
// because gRPC allows one outstanding write per stream.
#ifndef CONVEYOR_WORKER_SESSION_H_
#define CONVEYOR_WORKER_SESSION_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/v1/conveyor.pb.h"
#include "proto/grpc_diagnostics.h"
#include "worker/coordinator_stream.h"
#include "worker/device_backends.h"
#include "worker/worker_metrics.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace conveyor::worker {

struct SessionOptions {
  std::string coordinator = "127.0.0.1:7070";  // host:port
  std::string name;                            // Reported at registration.
  std::vector<std::string> devices = {"cpu:1"};
  // The data plane's listen address for every job ("host:port", port 0 for
  // a free port per job).
  std::string data_address = "127.0.0.1:0";
  // Between connection attempts after a failure or a broken stream.
  std::chrono::milliseconds reconnect_interval{1000};
  // How long a prepared job waits for its StartJob before giving up.
  std::chrono::milliseconds prepare_timeout{120000};
  // How long the coordinator may take to answer a registration.
  std::chrono::milliseconds register_timeout{10000};
  // How long a job's data plane keeps dialing peers at StartJob.
  std::chrono::milliseconds data_connect_timeout{10000};
  // At Shutdown: how long to wait for the job to report its end, and then
  // for the coordinator to close the stream, before cancelling the call.
  std::chrono::milliseconds shutdown_grace{2000};
  // Fault injection for tests (JobRunnerOptions::TEST_checkpoint_delay).
  std::chrono::milliseconds TEST_checkpoint_delay{0};
  // Where this worker's /metrics is served (reported at registration), and
  // the metrics to keep; both optional.
  std::string metrics_address;
  WorkerMetrics* metrics = nullptr;
  // Peak FLOP/s of one device (--peak-tflops), reported at registration and
  // for the MFU of its jobs; 0: the backend's own figure (a GPU's), if any.
  double peak_flops_per_device = 0;
  // What jobs compute on (from --devices); nullptr: the CPU. Outlives the
  // session.
  DeviceBackends* backends = nullptr;
  // The cluster's shared token (common/auth_token.h), presented on the
  // session and keying every job's data-plane handshake; empty: none. A
  // coordinator that refuses it ends Run, as version skew does: retrying
  // cannot fix a wrong token.
  std::string auth_token;
  // TLS to the coordinator (proto/credentials.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Which TLS files it has, to name the likely cause of a refused handshake.
  proto::ClientTls tls;
  // Opens the stream to the coordinator (worker/coordinator_stream.h); null:
  // gRPC's (worker/grpc_coordinator_stream.h) to `coordinator`, with
  // `credentials` and `auth_token`. Tests pass a fake.
  std::shared_ptr<CoordinatorDialerInterface> dialer;
};

class WorkerSession {
 public:
  // InvalidArgument for an empty coordinator address or name.
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Create(
      SessionOptions options);

  // Run must have returned.
  ~WorkerSession();

  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  // Serves the coordinator until Shutdown (then returns OK) or until the
  // coordinator refuses the registration (returns its FAILED_PRECONDITION or
  // UNAUTHENTICATED, with the coordinator's message). Connection failures are
  // retried.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the current job (CANCELLED "worker shutting down"), lets it
  // report, closes the stream and makes Run return. Does not block.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Asks the coordinator to drain this worker (DrainRequest): its job is
  // checkpointed at a step every rank agrees on and moved to other
  // workers, and then the coordinator's Leave makes this session Shutdown.
  // Not registered: Shutdown at once. Does not block; a drain that takes
  // too long is for the caller to cut short with Shutdown.
  void Drain(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // The id of the latest registration ("" before the first).
  std::string worker_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // Successful registrations so far (more than one after reconnects).
  int64_t registrations() const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the worker is registered with the coordinator on a live stream
  // (what its /readyz answers), and a line saying with which id, or why not.
  struct Standing {
    bool registered = false;
    std::string detail;
  };
  Standing standing() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Defined in worker/internal/session_internal.h. The stream side
  // (RunStream, HeartbeatLoop) is in session.cc, the job side (the On*
  // handlers and the job thread) in session_jobs.cc.
  class StreamWriter;
  struct Job;

  // Defined in the .cc file, where Job is complete.
  explicit WorkerSession(SessionOptions options);

  // One stream: connect, register, serve until it ends. Sets *refused when
  // the coordinator refused the registration.
  absl::Status RunStream(bool* refused) ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop(CoordinatorStreamInterface* stream,
                     const std::shared_ptr<StreamWriter>& writer)
      ABSL_LOCKS_EXCLUDED(mu_);

  void OnPrepare(const v1::PrepareJob& prepare,
                 const std::shared_ptr<StreamWriter>& writer)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnStart(const v1::StartJob& start,
               const std::shared_ptr<StreamWriter>& writer)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnCancel(const v1::CancelJob& cancel) ABSL_LOCKS_EXCLUDED(mu_);
  // DrainJob: answers the job's DrainPoint, or tells it where to stop.
  void OnDrain(const v1::DrainJob& drain,
               const std::shared_ptr<StreamWriter>& writer)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnProfile(const v1::ProfileModel& profile,
                 const std::shared_ptr<StreamWriter>& writer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Starts `job` as the current job on its thread, unless the worker is
  // shutting down or busy: then returns the JobEnded to answer instead.
  std::optional<v1::WorkerMessage> StartJobThread(std::unique_ptr<Job> job)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The job thread.
  void JobMain(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RunJob(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // A ProfileModel job's thread: profiles and answers ModelProfile or
  // JobEnded.
  void ProfileMain(Job* job) ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the current job, if any, with `status`.
  void CancelJobLocked(const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the current job's thread to end and forgets the job.
  void JoinJob() ABSL_LOCKS_EXCLUDED(mu_);

  const SessionOptions options_;
  // options_.dialer, or gRPC's.
  const std::shared_ptr<CoordinatorDialerInterface> dialer_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Drain asked the coordinator to drain this worker: a broken stream ends
  // Run rather than reconnecting.
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  // The current stream, so Shutdown can cancel a connection attempt.
  CoordinatorStreamInterface* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;  // On the current stream.
  bool stream_done_ ABSL_GUARDED_BY(mu_) = false;
  // The current stream's writer, for Drain; null between streams.
  std::shared_ptr<StreamWriter> writer_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds heartbeat_interval_ ABSL_GUARDED_BY(mu_){1000};
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  int64_t registrations_ ABSL_GUARDED_BY(mu_) = 0;
  // Why the last stream ended ("" while none has).
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  // The job this worker holds (or held last; see Job::ended).
  std::unique_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_SESSION_H_
