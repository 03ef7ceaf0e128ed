// ThreadPool: a fixed set of threads that run posted tasks, first posted,
// first started.
//
// For work that must leave the thread that found it: gRPC's callback
// reactions must not block, so the coordinator's worker sessions hand each
// message to a pool whose threads may wait for the JobManager's lock and its
// state-file writes.
//
//   ThreadPool pool(4);
//   pool.Post([&] { Handle(message); });
//
// Tasks may post more tasks. The destructor runs every task posted before
// it returns (including those posted by tasks meanwhile), then joins.
//
// Thread-safe.
#ifndef CONVEYOR_COMMON_THREAD_POOL_H_
#define CONVEYOR_COMMON_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace conveyor {

class ThreadPool {
 public:
  // `threads` >= 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task);

  // Tasks posted and not yet started.
  int queued() const;

 private:
  void Run();

  mutable Mutex mu_;
  CondVar changed_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_THREAD_POOL_H_
