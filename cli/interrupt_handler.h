// InterruptHandler: what SIGINT and SIGTERM do while `run` drives a local
// cluster. Dying at once would leave a job half-run on daemons that are
// about to be killed; instead the first signal cancels the tracked job (the
// watch then sees it end CANCELLED), and if the job has not ended after a
// grace period, or on a second signal, every watch on the client is
// cancelled so the caller can tear down. The caller exits 128 + signal().
//
// The signal handler only writes the signal's number to a pipe (all it may
// safely do); a thread of the handler's own reads the pipe and does the
// rest, which needs locks and gRPC. A handler rather than blocked signals:
// a process-directed signal goes to any thread that does not block it, and
// libraries start threads we do not control (OpenBLAS at load time), whose
// default action would kill the process. Daemons started afterwards get the
// default dispositions back at exec.
//
// One InterruptHandler may be installed at a time. Thread-safe.
#ifndef CONVEYOR_CLI_INTERRUPT_HANDLER_H_
#define CONVEYOR_CLI_INTERRUPT_HANDLER_H_

#include <signal.h>

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"

namespace conveyor::cli {

class InterruptHandler {
 public:
  // Installs handlers for SIGINT and SIGTERM and starts the thread that acts
  // on them. `err` receives one line per signal. FailedPrecondition if one
  // is installed already; the errno-derived code if the pipe or the
  // handlers cannot be set up.
  static absl::StatusOr<std::unique_ptr<InterruptHandler>> Install(
      absl::Duration grace, std::ostream& err);

  // Stops the thread and restores the previous dispositions. A signal that
  // arrives after this is handled as it was before Install.
  ~InterruptHandler();

  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

  // The client whose watches a signal cancels, and the job it cancels
  // (empty: none yet). If a signal came before, acts on it now. `client`
  // must outlive the tracking: call Untrack() before destroying it.
  void Track(CoordinatorClient* client, const std::string& job_id)
      ABSL_LOCKS_EXCLUDED(mutex_);
  void Untrack() ABSL_LOCKS_EXCLUDED(mutex_);

  // The first signal received, 0 if none.
  int signal() const { return signal_.load(); }

 private:
  InterruptHandler(absl::Duration grace, std::ostream& err, int read_fd)
      : grace_(grace), err_(err), read_fd_(read_fd) {}

  void Loop() ABSL_LOCKS_EXCLUDED(mutex_);
  void OnSignal(int sig, int count) ABSL_LOCKS_EXCLUDED(mutex_);
  // Cancels the job if there is one not yet cancelled; with no job to wait
  // for, cancels the watches instead.
  void CancelJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void CancelWatches() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const absl::Duration grace_;
  std::ostream& err_;
  const int read_fd_;
  struct sigaction old_int_;
  struct sigaction old_term_;
  std::atomic<bool> stop_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;

  absl::Mutex mutex_;
  CoordinatorClient* client_ ABSL_GUARDED_BY(mutex_) = nullptr;
  std::string job_id_ ABSL_GUARDED_BY(mutex_);
  bool job_cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  bool watches_cancelled_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Time cancelled_at_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_INTERRUPT_HANDLER_H_
