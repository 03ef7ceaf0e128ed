// The parts of WorkerSession (worker/session.h) that its two source files
// share: the writer serializing one stream's writes, and the record of one
// job. session.cc holds the stream (registration, heartbeats, dispatch,
// reconnection, Shutdown); session_jobs.cc the jobs, from PrepareJob or
// ProfileModel to JobEnded, on their own thread. Nothing outside
// WorkerSession includes this.
//
// Thread-safety: StreamWriter may be used from any thread; a Job's fields
// other than the constant program and writer are guarded by the session's
// mu_.
#ifndef CONVEYOR_WORKER_INTERNAL_SESSION_INTERNAL_H_
#define CONVEYOR_WORKER_INTERNAL_SESSION_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/cancellation.h"
#include "conveyor/v1/conveyor.pb.h"
#include "job/parsed_job.h"
#include "worker/coordinator_stream.h"
#include "worker/job_runner.h"
#include "worker/session.h"

namespace conveyor::worker {

// Serializes the writes of the reading, heartbeat and job threads to one
// stream, and drops them once the stream is closed for writing or gone, so
// a job that outlives its stream never touches a dead or newer stream.
class WorkerSession::StreamWriter {
 public:
  explicit StreamWriter(CoordinatorStreamInterface* stream) : stream_(stream) {}

  // False when the message was not sent (stream closed or broken).
  bool Write(const v1::WorkerMessage& message) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || done_) return false;
    if (!stream_->Write(message)) {
      // The call is over; Read will say why.
      done_ = true;
      return false;
    }
    return true;
  }

  // Half-closes the stream: the coordinator sees the end of our messages.
  void WritesDone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || done_) return;
    done_ = true;
    stream_->WritesDone();
  }

  // The stream is about to be finished and destroyed.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  CoordinatorStreamInterface* stream_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One job, from PrepareJob to JobEnded. Fields other than the constant
// program and writer are guarded by the session's mu_.
struct WorkerSession::Job {
  v1::JobProgram program;
  // The stream the job came on; its reports go there only.
  std::shared_ptr<StreamWriter> writer;
  std::optional<std::vector<std::string>> peers;  // From StartJob.
  std::vector<std::string> peer_names;            // From StartJob.
  bool nccl = false;                              // From StartJob.
  absl::Status cancel;                            // Not OK once cancelled.
  JobRunner* runner = nullptr;  // While the job thread holds one.
  bool ended = false;           // The worker is no longer busy with it.
  bool reported = false;        // JobEnded written (or dropped).
  std::thread thread;
  // A ProfileModel job: `profile` is the request; once `profiled` (the
  // answer went out) the worker holds itself for the job's PrepareJob, and a
  // CancelJob must still be answered (`cancel_answered`).
  std::optional<v1::ProfileModel> profile;
  bool profiled = false;
  // The job file as profiling parsed it; handed from the profiled job to
  // its PrepareJob's, so the worker parses the file once.
  std::shared_ptr<const job::ParsedJob> parsed;
  bool cancel_answered = false;
  // Cancelled with `cancel`; installed on the job thread, so the job's
  // preparation and profile stop at its cancel (common/cancellation.h).
  Cancellation cancellation;
  // The step the job stopped after for a drain (DrainJob); 0: none.
  int64_t drained_after_step = 0;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_INTERNAL_SESSION_INTERNAL_H_
