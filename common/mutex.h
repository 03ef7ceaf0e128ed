// Mutex, MutexLock, CondVar: std::mutex, std::lock_guard and
// std::condition_variable with the capability attributes that clang's
// -Wthread-safety needs to check ABSL_GUARDED_BY and ABSL_*_LOCKS_*.
//
// libstdc++'s std::mutex carries no such attributes, so clang cannot tell
// that a std::lock_guard holds it: an ABSL_GUARDED_BY naming a std::mutex is
// only a comment (and clang says so, -Wthread-safety-attributes). These
// wrappers add the attributes and nothing else: the same std::mutex
// underneath (not recursive, no deadlock detection), and CondVar waits are
// std::condition_variable's, with its clocks, spurious wake-ups and
// predicate loops. Guarded state uses this Mutex or absl::Mutex, never
// std::mutex (docs/development.md). Use this one where std semantics
// matter, e.g. a wait until a steady_clock deadline.
//
//   mutable conveyor::Mutex mu_;
//   int count_ ABSL_GUARDED_BY(mu_) = 0;
//   conveyor::CondVar changed_;
//
//   conveyor::MutexLock lock(mu_);
//   changed_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
//     return count_ > 0;
//   });
//
// A predicate is called with the mutex held, but clang analyses a lambda
// on its own, so one that reads guarded state says so as above.
//
// Thread-safe, as std::mutex and std::condition_variable are.
#ifndef CONVEYOR_COMMON_MUTEX_H_
#define CONVEYOR_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/base/thread_annotations.h"

namespace conveyor {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // True when the mutex was free and is now held by the caller.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }

  // BasicLockable / Lockable, for std::unique_lock and std::scoped_lock
  // (which clang cannot follow: prefer MutexLock).
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to the end of the scope (std::lock_guard).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_.Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::condition_variable for a Mutex the caller holds. Each wait releases
// `mu` while it blocks and holds it again when it returns, as
// std::condition_variable::wait does with a std::unique_lock; to the caller
// (and to the analysis) `mu` is held throughout.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Blocks until `pred()` is true.
  template <typename Predicate>
  void Wait(Mutex& mu, Predicate pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    cv_.wait(lock.lock, std::move(pred));
  }

  // Blocks until `pred()` is true or `deadline` passes; returns `pred()`.
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex& mu,
                 const std::chrono::time_point<Clock, Duration>& deadline,
                 Predicate pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_until(lock.lock, deadline, std::move(pred));
  }

  // Blocks until `pred()` is true or `timeout` has passed; returns `pred()`.
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout,
               Predicate pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Adopted lock(mu);
    return cv_.wait_for(lock.lock, timeout, std::move(pred));
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  // The caller's hold on `mu` as the std::unique_lock that
  // std::condition_variable takes; handed back, still locked, on the way
  // out, so the caller's MutexLock is the one that unlocks it.
  struct Adopted {
    explicit Adopted(Mutex& mu) : lock(mu.mu_, std::adopt_lock) {}
    ~Adopted() { lock.release(); }
    std::unique_lock<std::mutex> lock;
  };

  std::condition_variable cv_;
};

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_MUTEX_H_
