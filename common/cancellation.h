// Cancellation: how a job's long work learns, at once, that the job was
// cancelled, wherever the job thread happens to be.
//
// A cancelled job must stop within two seconds in every phase (README). Its
// steps are easy: Cancel aborts the data plane, which wakes a blocked
// receive. Everything else on the job thread is not blocked on the data
// plane: parsing, initializing a billion parameters, reading a data or init
// file of gigabytes, generating synthetic data, a `delay` layer waiting a
// minute. Those loops poll the cancellation of the job they run for, and a
// wait blocks on it instead of sleeping.
//
// The cancellation travels with the thread (CancellationScope), not as an
// argument: the loops that poll it sit under interfaces that have no reason
// to know about jobs (a layer's Forward, ReadFile, a parameter's init), and
// a worker runs a job on one thread from its build to its end. Work the
// engine fans out to other threads within one call (OpenBLAS, the data
// sources' row loops) is not polled: a call ends in bounded time anyway.
// Code outside any scope is never cancelled, as before.
//
// Thread-safe.
#ifndef CONVEYOR_COMMON_CANCELLATION_H_
#define CONVEYOR_COMMON_CANCELLATION_H_

#include <atomic>
#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace conveyor {

class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Cancels with `status` (Cancelled "cancelled" when OK) and wakes every
  // WaitUntil. The first call's status stays; later calls do nothing.
  void Cancel(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // One atomic load: cheap enough for a loop to poll every few megabytes.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // OK until cancelled, then Cancel's status.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `deadline` or a Cancel, whichever comes first; returns
  // status(). A deadline in the past returns at once.
  absl::Status WaitUntil(std::chrono::steady_clock::time_point deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::atomic<bool> cancelled_{false};
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// The cancellation installed on the calling thread, or nullptr.
const Cancellation* CurrentCancellation();

// OK, or the status of the calling thread's cancellation once it is
// cancelled. What long loops call between chunks of work.
absl::Status CheckCancelled();

// Installs `cancellation` (not owned; it outlives the scope) as the calling
// thread's for the scope's life, restoring the previous one after.
class CancellationScope {
 public:
  explicit CancellationScope(const Cancellation* cancellation);
  ~CancellationScope();
  CancellationScope(const CancellationScope&) = delete;
  CancellationScope& operator=(const CancellationScope&) = delete;

 private:
  const Cancellation* previous_;
};

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_CANCELLATION_H_
