#include "engine/host_staging_pool.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace conveyor::engine {

struct HostStagingPool::State {
  State(Allocate a, Release r, size_t max)
      : allocate(std::move(a)), release(std::move(r)), max_cached(max) {}
  ~State() {
    for (auto& [bytes, blocks] : free) {
      for (void* block : blocks) release(block);
    }
  }

  // A tensor's buffer went away: keep its block if there is room.
  void Return(void* data, size_t bytes) ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      if (cached + bytes <= max_cached) {
        free[bytes].push_back(data);
        cached += bytes;
        return;
      }
    }
    release(data);
  }

  const Allocate allocate;
  const Release release;
  const size_t max_cached;
  mutable absl::Mutex mu;
  std::map<size_t, std::vector<void*>> free ABSL_GUARDED_BY(mu);
  size_t cached ABSL_GUARDED_BY(mu) = 0;
  int64_t allocations ABSL_GUARDED_BY(mu) = 0;
  int64_t reuses ABSL_GUARDED_BY(mu) = 0;
};

HostStagingPool::HostStagingPool(Allocate allocate, Release release,
                                 size_t max_cached_bytes)
    : state_(std::make_shared<State>(std::move(allocate), std::move(release),
                                     max_cached_bytes)) {}

HostStagingPool::~HostStagingPool() = default;

absl::StatusOr<Tensor> HostStagingPool::Empty(Backend* host, const Shape& shape,
                                              DType dtype) {
  ASSIGN_OR_RETURN(const uint64_t bytes, ShapeBytes(shape, dtype));
  if (bytes == 0) return host->Empty(shape, dtype);
  void* data = nullptr;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->free.find(bytes);
    if (it != state_->free.end() && !it->second.empty()) {
      data = it->second.back();
      it->second.pop_back();
      state_->cached -= bytes;
      ++state_->reuses;
    } else {
      ++state_->allocations;
    }
  }
  if (data == nullptr) {
    ASSIGN_OR_RETURN(data, state_->allocate(bytes));
  }
  // The buffer holds the state, so a tensor outliving the pool object still
  // returns its block somewhere valid.
  auto buffer = std::make_shared<Buffer>(
      host, data, bytes,
      [state = state_](void* p, size_t n) { state->Return(p, n); });
  return Tensor(std::move(buffer), shape, dtype);
}

HostStagingPool::Stats HostStagingPool::stats() const {
  absl::MutexLock lock(&state_->mu);
  return {.allocations = state_->allocations,
          .reuses = state_->reuses,
          .cached_bytes = state_->cached};
}

}  // namespace conveyor::engine
