// RankThreads: runs one function per rank of a mesh at once, rank 0 on the
// calling thread and the others on threads kept for the owner's life (a
// stage runs several actions per microbatch; a thread per action would cost
// more than a small layer's forward).
//
// The ranks of a tensor-parallel group must run at once: each blocks in the
// group's collectives until the others arrive. The caller's cancellation
// (common/cancellation.h) is installed on every rank's thread for the call,
// so a cancelled job stops its ranks wherever they are.
//
// Thread-compatible: one thread calls Run at a time.
#ifndef CONVEYOR_ENGINE_INTERNAL_RANK_THREADS_H_
#define CONVEYOR_ENGINE_INTERNAL_RANK_THREADS_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/cancellation.h"
#include "common/mutex.h"

namespace conveyor::engine {

class RankThreads {
 public:
  // `ranks` >= 1; starts ranks - 1 threads.
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int ranks() const { return ranks_; }

  // fn(r) for every rank r at once; returns once all have returned: OK, or
  // the error of the lowest failed rank. As soon as a rank fails,
  // on_error(its status) runs on that rank's thread (to release the others
  // from a collective: TensorParallelGroup::Abort); it may run on several
  // threads at once. An exception a rank's thread throws becomes an
  // Internal error of that rank.
  absl::Status Run(absl::FunctionRef<absl::Status(int)> fn,
                   absl::FunctionRef<void(const absl::Status&)> on_error)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Serve(int rank) ABSL_LOCKS_EXCLUDED(mu_);

  const int ranks_;
  Mutex mu_;
  CondVar changed_;
  // The call in progress; valid while pending_ > 0.
  uint64_t call_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::FunctionRef<absl::Status(int)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::FunctionRef<void(const absl::Status&)>* on_error_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  const Cancellation* cancellation_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_INTERNAL_RANK_THREADS_H_
