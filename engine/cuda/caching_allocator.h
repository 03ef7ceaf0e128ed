// CachingAllocator: device memory for one device, handed out from free lists
// of size-rounded blocks, so that after the first training step every
// allocation is served from the cache and the step path never calls
// cudaMalloc or cudaFree (both are slow, and cudaFree synchronizes the whole
// device).
//
// Sizes are rounded (RoundSize) so that tensors of nearly equal size share a
// free list; a freed block goes back to the list of its rounded size and is
// handed out again only for a request that rounds to the same size. Blocks
// are never split or merged: training repeats the same shapes every step, and
// exact size classes keep the bookkeeping trivial to check.
//
// The allocator knows nothing of CUDA: it gets raw memory from an injected
// RawAllocator (cudaMalloc/cudaFree in the CUDA backend, malloc/free in the
// tests). When the raw allocation fails it releases every cached block and
// tries once more before reporting the failure.
//
// Reuse is only safe in stream order: a block freed while kernels that use it
// are still queued may be handed to the next allocation, which is fine as
// long as every user of the memory runs on the same stream (the backend's
// compute stream). Memory used by another stream must be kept alive by its
// user until that stream is done with it.
//
// Thread-safe: tensors may be dropped (and their blocks freed) on any thread.
#ifndef CONVEYOR_ENGINE_CUDA_CACHING_ALLOCATOR_H_
#define CONVEYOR_ENGINE_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::engine {

class CachingAllocator {
 public:
  // Where memory really comes from. `allocate` returns `bytes` bytes or an
  // error (ResourceExhausted when out of memory); `release` returns a block
  // that `allocate` handed out, with its size.
  struct RawAllocator {
    std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
    std::function<void(void* ptr, size_t bytes)> release;
  };

  struct Stats {
    size_t bytes_in_use = 0;       // Rounded sizes of blocks handed out.
    size_t peak_bytes_in_use = 0;  // Highest bytes_in_use so far.
    size_t bytes_cached = 0;       // Rounded sizes of blocks in free lists.
    // Highest bytes_in_use + bytes_cached: what the device gave us.
    size_t peak_bytes_reserved = 0;
    int64_t blocks_in_use = 0;
    int64_t blocks_cached = 0;
    int64_t raw_allocations = 0;  // Calls to RawAllocator::allocate.
    int64_t raw_releases = 0;     // Calls to RawAllocator::release.
    int64_t cache_hits = 0;       // Allocations served from a free list.
  };

  // The smallest block; every size rounds up to a multiple of it, which also
  // keeps every block aligned for any element type and for cuBLAS.
  static constexpr size_t kMinBlockBytes = 512;
  // Up to this size, sizes round to a multiple of kMinBlockBytes; above it,
  // to a quarter of the largest power of two not above the size, so a
  // rounded block wastes at most 25%.
  static constexpr size_t kSmallSizeLimit = size_t{1} << 20;

  explicit CachingAllocator(RawAllocator raw);
  // Releases the cached blocks. Blocks still handed out are a bug in the
  // owner (a tensor outliving its backend) and abort.
  ~CachingAllocator();

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The size a request of `bytes` really gets; 0 for a request too large to
  // round (above half the address space).
  static size_t RoundSize(size_t bytes);

  // A block of RoundSize(bytes) bytes (a zero-byte request still gets a
  // block, so a tensor's data pointer is always valid). Returns
  // ResourceExhausted when the raw allocator fails even after the cache was
  // emptied, or for a size too large to round; other raw-allocator errors as
  // they are.
  absl::StatusOr<void*> Allocate(size_t bytes) ABSL_LOCKS_EXCLUDED(mutex_);

  // Returns a block from Allocate to its free list. Aborts for a pointer this
  // allocator did not hand out, or one already freed.
  void Free(void* ptr) ABSL_LOCKS_EXCLUDED(mutex_);

  // Releases every cached block to the raw allocator (for CUDA this
  // synchronizes the device: never call it on the step path).
  void EmptyCache() ABSL_LOCKS_EXCLUDED(mutex_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mutex_);
  // Starts the peaks again at the current figures.
  void ResetPeaks() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const RawAllocator raw_;
  mutable absl::Mutex mutex_;
  // Free blocks by rounded size.
  std::map<size_t, std::vector<void*>> free_lists_ ABSL_GUARDED_BY(mutex_);
  // Blocks handed out, with their rounded sizes.
  std::unordered_map<void*, size_t> in_use_ ABSL_GUARDED_BY(mutex_);
  Stats stats_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CUDA_CACHING_ALLOCATOR_H_
