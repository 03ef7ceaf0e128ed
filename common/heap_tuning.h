// Heap settings for processes that plan schedules over and over (the
// coordinator, and the planning benchmark that stands for it).
//
// Planning a job allocates a few MiB of short-lived buffers (the schedule,
// the validator's and simulator's tables). glibc's default adapts its mmap
// and trim thresholds as chunks come and go, and depending on what the
// process did before it can end up returning those buffers to the kernel
// after every plan and faulting them in again on the next: measured on
// plan/interleaved-zb/P:32/M:256/V:4, 3,300 page faults a plan and 12-16 ms
// instead of 6-7 ms. Fixed thresholds keep freed heap memory for reuse.
//
// Thread-safety: call once at startup, before other threads exist.
#ifndef CONVEYOR_COMMON_HEAP_TUNING_H_
#define CONVEYOR_COMMON_HEAP_TUNING_H_

#include <cstddef>

namespace conveyor {

// Allocations below this come from the heap, not fresh mappings.
inline constexpr size_t kHeapMmapThreshold = size_t{32} << 20;
// Freed memory at the top of the heap is returned to the kernel only past
// this much: the process keeps up to this much unused heap.
inline constexpr size_t kHeapTrimThreshold = size_t{64} << 20;

// Sets both thresholds (glibc's mallopt); a no-op elsewhere. False when the
// C library refused a setting.
bool TuneHeapForPlanning();

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_HEAP_TUNING_H_
