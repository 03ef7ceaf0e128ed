#include "engine/cpu/parallel.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace conveyor::engine {
namespace {

int AllowedCoreCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// SetCpuThreads's value; 0: the default.
std::atomic<int> requested_threads{0};

// Workers that each take one part of the current loop; the caller takes
// part 0, so a loop split in two wakes one worker. Workers are started as
// a loop first needs them and never stopped: fewer threads later leave the
// extra ones asleep.
class Pool {
 public:
  // False when another caller holds the pool; the caller then runs inline.
  bool TryRun(int parts, int64_t n,
              const std::function<void(int64_t, int64_t)>& chunk) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Under run_mu_: no loop is in flight, so no worker reads parts_.
      while (static_cast<int>(workers_.size()) < parts - 1) {
        const int part = static_cast<int>(workers_.size()) + 1;
        workers_.emplace_back([this, part] { Work(part); });
      }
      parts_ = parts;
      chunk_ = &chunk;
      n_ = n;
      pending_ = parts - 1;
      ++generation_;
    }
    work_cv_.notify_all();
    RunPart(0);
    std::unique_lock<std::mutex> lock(mu_);
    // Wait for every worker even if a part threw: they still read chunk_.
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    chunk_ = nullptr;
    if (error_) {
      std::exception_ptr error = std::exchange(error_, nullptr);
      lock.unlock();
      std::rethrow_exception(error);  // To the caller, as a serial loop would.
    }
    return true;
  }

 private:
  // Runs one part; an exception is kept for the caller rather than left to
  // end a worker thread (which would terminate the process).
  void RunPart(int part) {
    const int64_t per = (n_ + parts_ - 1) / parts_;
    const int64_t begin = std::min(n_, part * per);
    const int64_t end = std::min(n_, begin + per);
    if (begin >= end) return;
    try {
      (*chunk_)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }

  void Work(int part) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // A worker beyond the loop's parts sleeps through it; it must not
        // count itself done either.
        work_cv_.wait(lock,
                      [&] { return generation_ != seen && part < parts_; });
        seen = generation_;
      }
      RunPart(part);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex run_mu_;  // Held by the caller of the current loop.
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* chunk_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 1;  // Of the current loop, caller included.
  int pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;  // The first part's exception, if any.
  std::vector<std::thread> workers_;
};

Pool& GetPool() {
  // Never destroyed: workers block forever on work_cv_, and a pool torn down
  // during static destruction could race with a late caller.
  static Pool* pool = new Pool();
  return *pool;
}

}  // namespace

int CpuThreads() {
  const int requested = requested_threads.load(std::memory_order_relaxed);
  if (requested > 0) return requested;
  // Counted once: the mask of a process is set at its start (taskset,
  // --cpu-cores before any kernel runs), and sched_getaffinity is a syscall.
  static const int allowed = AllowedCoreCount();
  return allowed;
}

void SetCpuThreads(int threads) {
  requested_threads.store(std::max(threads, 0), std::memory_order_relaxed);
  openblas_set_num_threads(threads > 0 ? threads : AllowedCoreCount());
}

void ParallelChunks(int64_t n,
                    const std::function<void(int64_t, int64_t)>& chunk) {
  const int parts = CpuThreads();
  if (parts <= 1 || !GetPool().TryRun(parts, n, chunk)) chunk(0, n);
}

}  // namespace conveyor::engine
