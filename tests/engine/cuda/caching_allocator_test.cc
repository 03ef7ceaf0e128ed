// The caching allocator's bookkeeping, on host memory: no GPU needed. A fake
// raw allocator (malloc/free with counters and an optional memory limit)
// stands in for cudaMalloc/cudaFree.
#include "engine/cuda/caching_allocator.h"

#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;

// malloc/free with a limit on the bytes held, like a device's memory.
struct FakeDevice {
  size_t limit = SIZE_MAX;
  size_t held = 0;
  std::set<void*> live;

  CachingAllocator::RawAllocator Raw() {
    return {
        .allocate = [this](size_t bytes) -> absl::StatusOr<void*> {
          if (bytes > limit - held) {
            return absl::ResourceExhaustedError("fake device out of memory");
          }
          void* p = std::malloc(bytes);
          held += bytes;
          live.insert(p);
          return p;
        },
        .release =
            [this](void* p, size_t bytes) {
              EXPECT_EQ(live.erase(p), 1u) << "released an unknown block";
              held -= bytes;
              std::free(p);
            },
    };
  }
};

TEST(CachingAllocatorTest, RoundSizeUsesSmallStepsThenQuarterPowersOfTwo) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  // Above 1 MiB: steps of a quarter of the power of two below.
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1),
            (size_t{1} << 20) + (size_t{1} << 18));
  EXPECT_EQ(CachingAllocator::RoundSize(3'000'000), 3'145'728u);  // 3 MiB.
  EXPECT_EQ(CachingAllocator::RoundSize(SIZE_MAX), 0u);
  // Waste stays below 25% everywhere.
  for (size_t bytes = 1000; bytes < (size_t{1} << 34); bytes = bytes * 3 + 7) {
    const size_t rounded = CachingAllocator::RoundSize(bytes);
    EXPECT_GE(rounded, bytes);
    EXPECT_LE(rounded, bytes + bytes / 4 + 512) << bytes;
    EXPECT_EQ(rounded % 512, 0u);
  }
}

TEST(CachingAllocatorTest, FreedBlocksAreReusedWithoutRawAllocations) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  void* a = *allocator.Allocate(1000);
  void* b = *allocator.Allocate(5000);
  EXPECT_EQ(allocator.stats().raw_allocations, 2);
  EXPECT_EQ(allocator.stats().bytes_in_use, 1024u + 5120u);
  allocator.Free(a);
  allocator.Free(b);
  CachingAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.bytes_cached, 1024u + 5120u);
  EXPECT_EQ(s.blocks_cached, 2);
  EXPECT_EQ(s.raw_releases, 0);  // Free never goes to the device.

  // A "second step" with the same sizes (1000 and 1010 both round to 1024).
  void* a2 = *allocator.Allocate(1010);
  void* b2 = *allocator.Allocate(5000);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
  s = allocator.stats();
  EXPECT_EQ(s.raw_allocations, 2);
  EXPECT_EQ(s.cache_hits, 2);
  EXPECT_EQ(s.bytes_cached, 0u);
  EXPECT_EQ(s.peak_bytes_in_use, 1024u + 5120u);
  allocator.Free(a2);
  allocator.Free(b2);
}

// The step line's "reserved" peak counts cached blocks too, and a reset
// (each step's) starts both peaks at what is held now.
TEST(CachingAllocatorTest, PeaksCountReservedBlocksAndReset) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  void* a = *allocator.Allocate(1000);
  allocator.Free(a);
  void* b = *allocator.Allocate(5000);  // Another size class: a raw block.
  CachingAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.peak_bytes_in_use, 5120u);
  EXPECT_EQ(s.peak_bytes_reserved, 1024u + 5120u);
  allocator.Free(b);
  allocator.ResetPeaks();
  s = allocator.stats();
  EXPECT_EQ(s.peak_bytes_in_use, 0u);
  EXPECT_EQ(s.peak_bytes_reserved, 1024u + 5120u);  // Still cached.
  allocator.EmptyCache();
  allocator.ResetPeaks();
  EXPECT_EQ(allocator.stats().peak_bytes_reserved, 0u);
}

TEST(CachingAllocatorTest, DifferentSizeClassesDoNotShareBlocks) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  void* small = *allocator.Allocate(100);
  allocator.Free(small);
  void* big = *allocator.Allocate(100'000);
  EXPECT_NE(big, small);
  EXPECT_EQ(allocator.stats().raw_allocations, 2);
  EXPECT_EQ(allocator.stats().blocks_cached, 1);
  allocator.Free(big);
}

TEST(CachingAllocatorTest, ZeroByteRequestsGetARealBlock) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  absl::StatusOr<void*> p = allocator.Allocate(0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE(*p, nullptr);
  EXPECT_EQ(allocator.stats().bytes_in_use, CachingAllocator::kMinBlockBytes);
  allocator.Free(*p);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  FakeDevice device;
  device.limit = 4096;
  CachingAllocator allocator(device.Raw());
  // Fill the "device" with cached 1 KiB blocks.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*allocator.Allocate(1024));
  for (void* p : blocks) allocator.Free(p);
  EXPECT_EQ(allocator.stats().bytes_cached, 4096u);
  // A 2 KiB block fits only once the cached ones are released.
  absl::StatusOr<void*> p = allocator.Allocate(2048);
  ASSERT_TRUE(p.ok()) << p.status();
  const CachingAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.raw_releases, 4);
  EXPECT_EQ(s.bytes_cached, 0u);
  EXPECT_EQ(s.raw_allocations, 4 + 2);  // The failed try and the retry.
  allocator.Free(*p);
}

TEST(CachingAllocatorTest, OutOfMemoryIsReportedWithSizes) {
  FakeDevice device;
  device.limit = 1024;
  CachingAllocator allocator(device.Raw());
  void* held = *allocator.Allocate(1024);
  const absl::StatusOr<void*> p = allocator.Allocate(600);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("fake device out of memory"));
  EXPECT_THAT(p.status().message(), HasSubstr("allocating 1024 bytes"));
  EXPECT_THAT(p.status().message(), HasSubstr("1024 bytes in use"));
  EXPECT_EQ(allocator.stats().blocks_in_use, 1);
  allocator.Free(held);
}

TEST(CachingAllocatorTest, TooLargeRequestIsResourceExhausted) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  EXPECT_EQ(allocator.Allocate(SIZE_MAX - 10).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.stats().raw_allocations, 0);
}

TEST(CachingAllocatorTest, EmptyCacheAndDestructorReleaseEverythingCached) {
  FakeDevice device;
  {
    CachingAllocator allocator(device.Raw());
    void* a = *allocator.Allocate(700);
    void* b = *allocator.Allocate(70'000);
    allocator.Free(a);
    allocator.EmptyCache();
    EXPECT_EQ(allocator.stats().raw_releases, 1);
    EXPECT_EQ(device.live.size(), 1u);
    allocator.Free(b);
    EXPECT_EQ(device.live.size(), 1u);  // Cached, not released.
  }
  EXPECT_TRUE(device.live.empty());
  EXPECT_EQ(device.held, 0u);
}

TEST(CachingAllocatorTest, ConcurrentFreesKeepTheBooksBalanced) {
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  constexpr int kPerThread = 200;
  std::vector<void*> blocks;
  for (int i = 0; i < 4 * kPerThread; ++i) {
    blocks.push_back(*allocator.Allocate(512 * (1 + i % 5)));
  }
  // Tensors may be dropped on any thread (e.g. a transport thread).
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        allocator.Free(blocks[t * kPerThread + i]);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const CachingAllocator::Stats s = allocator.stats();
  EXPECT_EQ(s.blocks_in_use, 0);
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_EQ(s.blocks_cached, 4 * kPerThread);
}

TEST(CachingAllocatorDeathTest, FreeingAnUnknownPointerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  int not_a_block = 0;
  EXPECT_DEATH(allocator.Free(&not_a_block), HasSubstr("did not hand out"));
}

TEST(CachingAllocatorDeathTest, DoubleFreeAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FakeDevice device;
  CachingAllocator allocator(device.Raw());
  void* p = *allocator.Allocate(10);
  allocator.Free(p);
  EXPECT_DEATH(allocator.Free(p), HasSubstr("freed twice"));
}

}  // namespace
}  // namespace conveyor::engine
