#include "engine/host_staging_pool.h"

#include <cstdlib>
#include <set>
#include <utility>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;

// malloc and free, counted: what the CUDA backend does with cudaHostAlloc.
struct Counting {
  int allocated = 0;
  int released = 0;
  std::set<void*> live;

  HostStagingPool::Allocate Allocate() {
    return [this](size_t bytes) -> absl::StatusOr<void*> {
      void* p = std::malloc(bytes);
      ++allocated;
      live.insert(p);
      return p;
    };
  }
  HostStagingPool::Release Release() {
    return [this](void* p) {
      ++released;
      live.erase(p);
      std::free(p);
    };
  }
};

TEST(HostStagingPoolTest, ReusesBlocksOfTheSameSize) {
  Counting mem;
  HostStagingPool pool(mem.Allocate(), mem.Release(), 1 << 20);
  CpuBackend* cpu = CpuBackend::Get();
  void* first = nullptr;
  {
    absl::StatusOr<Tensor> t = pool.Empty(cpu, {4, 8}, DType::kF32);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->backend(), cpu);
    EXPECT_EQ(t->bytes(), 128u);
    cpu->Fill(*t, 2.5f);  // Host memory the CPU kernels may use.
    EXPECT_EQ(t->data<float>()[31], 2.5f);
    first = t->raw();
  }
  EXPECT_EQ(pool.stats().cached_bytes, 128u);
  // Same size: the same block, no new allocation. Another size: a new one.
  absl::StatusOr<Tensor> again = pool.Empty(cpu, {32}, DType::kF32);
  absl::StatusOr<Tensor> other = pool.Empty(cpu, {3}, DType::kI64);
  ASSERT_TRUE(again.ok() && other.ok());
  EXPECT_EQ(again->raw(), first);
  EXPECT_NE(other->raw(), first);
  EXPECT_EQ(mem.allocated, 2);
  const HostStagingPool::Stats s = pool.stats();
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.reuses, 1);
  EXPECT_EQ(s.cached_bytes, 0u);
}

TEST(HostStagingPoolTest, KeepsAtMostTheCacheLimit) {
  Counting mem;
  HostStagingPool pool(mem.Allocate(), mem.Release(), 100);
  {
    absl::StatusOr<Tensor> a = pool.Empty(CpuBackend::Get(), {15}, DType::kF32);
    absl::StatusOr<Tensor> b = pool.Empty(CpuBackend::Get(), {15}, DType::kF32);
    ASSERT_TRUE(a.ok() && b.ok());
  }
  // 60 bytes each: the first returned fits under 100, the second does not.
  EXPECT_EQ(pool.stats().cached_bytes, 60u);
  EXPECT_EQ(mem.released, 1);
}

TEST(HostStagingPoolTest, TensorsMayOutliveThePoolAndEverythingIsReleased) {
  Counting mem;
  absl::StatusOr<Tensor> kept;
  {
    HostStagingPool pool(mem.Allocate(), mem.Release(), 1 << 20);
    {
      absl::StatusOr<Tensor> cached =
          pool.Empty(CpuBackend::Get(), {8}, DType::kF32);
      ASSERT_TRUE(cached.ok());
    }
    kept = pool.Empty(CpuBackend::Get(), {16}, DType::kF32);
    ASSERT_TRUE(kept.ok());
  }
  // The pool object is gone; its cached block waits for the last tensor.
  EXPECT_EQ(mem.live.size(), 2u);
  kept->data<float>()[15] = 1.0f;
  kept = absl::StatusOr<Tensor>();
  EXPECT_TRUE(mem.live.empty());
  EXPECT_EQ(mem.released, 2);
}

TEST(HostStagingPoolTest, EmptyShapesBadShapesAndAllocationErrors) {
  int calls = 0;
  HostStagingPool pool(
      [&](size_t) -> absl::StatusOr<void*> {
        ++calls;
        return absl::ResourceExhaustedError("cudaHostAlloc: out of memory");
      },
      [](void*) {}, 1 << 20);
  absl::StatusOr<Tensor> empty =
      pool.Empty(CpuBackend::Get(), {0, 5}, DType::kF32);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(pool.Empty(CpuBackend::Get(), {-1}, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Empty(CpuBackend::Get(), {int64_t{1} << 40, int64_t{1} << 40},
                       DType::kF32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status oom = pool.Empty(CpuBackend::Get(), {4}, DType::kF32).status();
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("out of memory"));
}

// The default staging memory of a backend is plain CPU memory.
TEST(HostStagingPoolTest, TheCpuBackendStagesInItsFp32Instance) {
  absl::StatusOr<Tensor> t =
      CpuBackend::Get(Precision::kBf16)->EmptyHostStaging({2, 2}, DType::kF32);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->backend(), CpuBackend::Get());
  EXPECT_EQ(t->bytes(), 16u);
}

}  // namespace
}  // namespace conveyor::engine
