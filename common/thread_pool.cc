#include "common/thread_pool.h"

#include <utility>

#include "common/check.h"

namespace conveyor {

ThreadPool::ThreadPool(int threads) {
  CONVEYOR_CHECK(threads >= 1, "a thread pool needs a thread");
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.NotifyAll();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Post(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    tasks_.push_back(std::move(task));
  }
  changed_.NotifyOne();
}

int ThreadPool::queued() const {
  MutexLock lock(mu_);
  return static_cast<int>(tasks_.size());
}

void ThreadPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      changed_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !tasks_.empty();
      });
      // Stopping drains the queue first: a posted task is a promise, e.g.
      // a worker session's goodbye that must reach the JobManager.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace conveyor
