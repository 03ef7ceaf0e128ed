#include "engine/cpu/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace conveyor::engine {
namespace {

// A fixed set of workers that each take one part of the current loop. The
// caller takes part 0, so a 2-core machine has one worker.
class Pool {
 public:
  Pool() {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < cores; ++i) {
      workers_.emplace_back([this, i] { Work(static_cast<int>(i)); });
    }
  }

  int parts() const { return static_cast<int>(workers_.size()) + 1; }

  // False when another caller holds the pool; the caller then runs inline.
  bool TryRun(int64_t n, const std::function<void(int64_t, int64_t)>& chunk) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      chunk_ = &chunk;
      n_ = n;
      pending_ = parts() - 1;
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
    const int64_t per = (n_ + parts() - 1) / parts();
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
        work_cv_.wait(lock, [&] { return generation_ != seen; });
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

void ParallelChunks(int64_t n,
                    const std::function<void(int64_t, int64_t)>& chunk) {
  Pool& pool = GetPool();
  if (pool.parts() == 1 || !pool.TryRun(n, chunk)) chunk(0, n);
}

}  // namespace conveyor::engine
