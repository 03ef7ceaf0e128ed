#include "cli/interrupt_handler.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/time/clock.h"
#include "common/file.h"

namespace conveyor::cli {
namespace {

// How often the thread wakes up to check for the end of the grace period
// and for the destructor.
constexpr int kTickMs = 100;

// The write end of the installed handler's pipe; -1 when none is installed.
std::atomic<int> signal_pipe{-1};

// Async-signal-safe: one write(2), errno preserved for the interrupted code.
void WriteSignal(int sig) {
  const int saved = errno;
  const int fd = signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    (void)!write(fd, &byte, 1);
  }
  errno = saved;
}

const char* SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace

absl::StatusOr<std::unique_ptr<InterruptHandler>> InterruptHandler::Install(
    absl::Duration grace, std::ostream& err) {
  if (signal_pipe.load() >= 0) {
    return absl::FailedPreconditionError(
        "an InterruptHandler is installed already");
  }
  int fds[2];
  // Non-blocking writes: a signal storm must not block the handler when the
  // pipe is full (the first signals are what matter).
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return ErrnoError(errno, "signal pipe", "pipe2");
  }
  std::unique_ptr<InterruptHandler> handler(
      new InterruptHandler(grace, err, fds[0]));
  signal_pipe = fds[1];
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = WriteSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGINT, &action, &handler->old_int_) != 0 ||
      sigaction(SIGTERM, &action, &handler->old_term_) != 0) {
    const int saved = errno;
    signal_pipe = -1;
    close(fds[0]);
    close(fds[1]);
    return ErrnoError(saved, "SIGINT/SIGTERM", "sigaction");
  }
  handler->thread_ = std::thread([h = handler.get()] { h->Loop(); });
  return handler;
}

InterruptHandler::~InterruptHandler() {
  stop_ = true;
  thread_.join();
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  const int write_fd = signal_pipe.exchange(-1);
  // A signal that came after the loop ended still counts.
  unsigned char byte;
  while (read(read_fd_, &byte, 1) == 1) {
    int none = 0;
    signal_.compare_exchange_strong(none, byte);
  }
  close(read_fd_);
  close(write_fd);
}

void InterruptHandler::Track(CoordinatorClient* client,
                             const std::string& job_id) {
  absl::MutexLock lock(&mutex_);
  if (job_id != job_id_) job_cancelled_ = false;
  client_ = client;
  job_id_ = job_id;
  if (signal_.load() != 0) CancelJob();
}

void InterruptHandler::Untrack() {
  absl::MutexLock lock(&mutex_);
  client_ = nullptr;
  job_id_.clear();
}

void InterruptHandler::Loop() {
  int count = 0;
  while (!stop_.load()) {
    pollfd p = {read_fd_, POLLIN, 0};
    if (poll(&p, 1, kTickMs) > 0) {
      unsigned char byte;
      while (read(read_fd_, &byte, 1) == 1) OnSignal(byte, ++count);
    }
    absl::MutexLock lock(&mutex_);
    if (job_cancelled_ && !watches_cancelled_ &&
        absl::Now() >= cancelled_at_ + grace_) {
      err_ << "conveyorctl: the job did not end within "
           << absl::FormatDuration(grace_) << " of its cancellation\n";
      err_.flush();
      CancelWatches();
    }
  }
}

void InterruptHandler::OnSignal(int sig, int count) {
  absl::MutexLock lock(&mutex_);
  if (count > 1) {
    CancelWatches();
    return;
  }
  signal_ = sig;
  // On its own line: a progress bar may be showing.
  err_ << "\nconveyorctl: " << SignalName(sig)
       << ": cancelling the job and stopping the local cluster (send it "
          "again to stop waiting for the job)\n";
  err_.flush();
  CancelJob();
}

void InterruptHandler::CancelJob() {
  // Without a client there is nothing to cancel yet: Track() acts when one
  // comes, and until then the caller polls signal().
  if (client_ == nullptr || job_cancelled_) return;
  if (job_id_.empty()) {
    CancelWatches();
    return;
  }
  job_cancelled_ = true;
  cancelled_at_ = absl::Now();
  if (absl::StatusOr<v1::Job> job = client_->CancelJob(job_id_); !job.ok()) {
    err_ << "conveyorctl: cancelling " << job_id_ << ": "
         << job.status().message() << "\n";
    err_.flush();
    CancelWatches();
  }
}

void InterruptHandler::CancelWatches() {
  if (watches_cancelled_ || client_ == nullptr) return;
  watches_cancelled_ = true;
  client_->CancelWatches();
}

}  // namespace conveyor::cli
