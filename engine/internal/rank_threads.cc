#include "engine/internal/rank_threads.h"

#include <exception>

#include "absl/strings/str_cat.h"

namespace conveyor::engine {
namespace {

absl::Status RunGuarded(absl::FunctionRef<absl::Status(int)> fn, int rank) {
  try {
    return fn(rank);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("tensor-parallel rank ", rank, ": ", e.what()));
  }
}

}  // namespace

RankThreads::RankThreads(int ranks) : ranks_(ranks < 1 ? 1 : ranks) {
  {
    MutexLock lock(mu_);
    results_.resize(ranks_);
  }
  for (int r = 1; r < ranks_; ++r)
    threads_.emplace_back([this, r] { Serve(r); });
}

RankThreads::~RankThreads() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    changed_.NotifyAll();
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status RankThreads::Run(
    absl::FunctionRef<absl::Status(int)> fn,
    absl::FunctionRef<void(const absl::Status&)> on_error) {
  if (ranks_ == 1) return RunGuarded(fn, 0);
  {
    MutexLock lock(mu_);
    fn_ = &fn;
    on_error_ = &on_error;
    cancellation_ = CurrentCancellation();
    pending_ = ranks_ - 1;
    for (absl::Status& s : results_) s = absl::OkStatus();
    ++call_;
    changed_.NotifyAll();
  }
  const absl::Status first = RunGuarded(fn, 0);
  if (!first.ok()) on_error(first);
  MutexLock lock(mu_);
  changed_.Wait(
      mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
  results_[0] = first;
  fn_ = nullptr;
  on_error_ = nullptr;
  for (const absl::Status& s : results_) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void RankThreads::Serve(int rank) {
  uint64_t done = 0;
  while (true) {
    absl::FunctionRef<absl::Status(int)>* fn;
    absl::FunctionRef<void(const absl::Status&)>* on_error;
    const Cancellation* cancellation;
    {
      MutexLock lock(mu_);
      changed_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || call_ != done;
      });
      if (stop_) return;
      done = call_;
      fn = fn_;
      on_error = on_error_;
      cancellation = cancellation_;
    }
    absl::Status status;
    {
      const CancellationScope scope(cancellation);
      status = RunGuarded(*fn, rank);
    }
    if (!status.ok()) (*on_error)(status);
    MutexLock lock(mu_);
    results_[rank] = std::move(status);
    if (--pending_ == 0) changed_.NotifyAll();
  }
}

}  // namespace conveyor::engine
