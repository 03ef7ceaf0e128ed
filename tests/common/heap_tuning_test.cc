#include "common/heap_tuning.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

// After tuning, a buffer well under the mmap threshold but far over glibc's
// default (128 KiB) comes from the heap: freeing it keeps it in the arena
// (counted in mallinfo2's free bytes), instead of unmapping it.
TEST(HeapTuningTest, LargeBuffersStayInTheHeapAfterFree) {
  ASSERT_TRUE(TuneHeapForPlanning());
  constexpr size_t kBytes = size_t{4} << 20;
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(kBytes);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kBytes);
  const struct mallinfo2 held = mallinfo2();
  // Not a fresh mapping: no mmapped bytes were added for it.
  EXPECT_EQ(held.hblkhd, before.hblkhd);
  std::free(p);
  const struct mallinfo2 after = mallinfo2();
  // Kept for reuse: the arena did not shrink below what held it.
  EXPECT_GE(after.arena, held.arena);
  EXPECT_GE(after.fordblks, kBytes);
}

}  // namespace
}  // namespace conveyor
