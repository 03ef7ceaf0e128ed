#include "engine/cuda/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace conveyor::engine {

CachingAllocator::CachingAllocator(RawAllocator raw) : raw_(std::move(raw)) {
  CONVEYOR_CHECK(raw_.allocate && raw_.release,
                 "caching allocator needs both raw functions");
}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mutex_);
  CONVEYOR_CHECK(in_use_.empty(),
                 "device memory is still in use while its allocator goes "
                 "away: a tensor outlived its backend");
  EmptyCacheLocked();
}

size_t CachingAllocator::RoundSize(size_t bytes) {
  if (bytes > (SIZE_MAX >> 1)) return 0;
  if (bytes <= kMinBlockBytes) return kMinBlockBytes;
  size_t step = kMinBlockBytes;
  if (bytes > kSmallSizeLimit) step = std::bit_floor(bytes) / 4;
  return (bytes + step - 1) / step * step;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  const size_t size = RoundSize(bytes);
  if (size == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes: too large"));
  }
  absl::MutexLock lock(&mutex_);
  void* ptr = nullptr;
  if (auto it = free_lists_.find(size);
      it != free_lists_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= size;
    --stats_.blocks_cached;
    ++stats_.cache_hits;
  } else {
    // The raw allocation runs under the lock: it is off the step path once
    // the cache is warm, and a concurrent Free only has to wait for it.
    ++stats_.raw_allocations;
    absl::StatusOr<void*> raw = raw_.allocate(size);
    if (!raw.ok() && absl::IsResourceExhausted(raw.status()) &&
        stats_.blocks_cached > 0) {
      // Cached blocks of other sizes may be what stands in the way.
      EmptyCacheLocked();
      ++stats_.raw_allocations;
      raw = raw_.allocate(size);
    }
    if (!raw.ok()) {
      return absl::Status(
          raw.status().code(),
          absl::StrCat(raw.status().message(), " (allocating ", size,
                       " bytes with ", stats_.bytes_in_use, " bytes in use)"));
    }
    ptr = *raw;
    CONVEYOR_CHECK(ptr != nullptr, "raw allocator returned null");
  }
  in_use_.emplace(ptr, size);
  stats_.bytes_in_use += size;
  ++stats_.blocks_in_use;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) {
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  stats_.peak_bytes_reserved = std::max(
      stats_.peak_bytes_reserved, stats_.bytes_in_use + stats_.bytes_cached);
  return ptr;
}

void CachingAllocator::Free(void* ptr) {
  absl::MutexLock lock(&mutex_);
  auto it = in_use_.find(ptr);
  CONVEYOR_CHECK(it != in_use_.end(),
                 "freeing a block this allocator did not hand out (or freed "
                 "twice)");
  const size_t size = it->second;
  in_use_.erase(it);
  free_lists_[size].push_back(ptr);
  stats_.bytes_in_use -= size;
  --stats_.blocks_in_use;
  stats_.bytes_cached += size;
  ++stats_.blocks_cached;
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mutex_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, blocks] : free_lists_) {
    for (void* ptr : blocks) {
      raw_.release(ptr, size);
      ++stats_.raw_releases;
    }
  }
  free_lists_.clear();
  stats_.bytes_cached = 0;
  stats_.blocks_cached = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  absl::MutexLock lock(&mutex_);
  return stats_;
}

void CachingAllocator::ResetPeaks() {
  absl::MutexLock lock(&mutex_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_in_use + stats_.bytes_cached;
}

}  // namespace conveyor::engine
