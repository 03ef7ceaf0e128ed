#include "common/heap_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace conveyor {

bool TuneHeapForPlanning() {
#if defined(__GLIBC__)
  // Setting either threshold also turns off glibc's adaptation of both.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapMmapThreshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapTrimThreshold)) == 1;
#else
  return true;
#endif
}

}  // namespace conveyor
