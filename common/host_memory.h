// How much host memory this machine can still give, and a check that an
// allocation whose size comes from outside (a job's model or data) fits
// before it is made. An allocation past it would either throw std::bad_alloc
// (a job once terminated every worker so: a synthetic data source of
// 1,000,000 x 1,000,000 floats) or, under Linux's overcommit, succeed and
// bring the OOM killer once touched. Thread-safe.
#ifndef CONVEYOR_COMMON_HOST_MEMORY_H_
#define CONVEYOR_COMMON_HOST_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace conveyor {

// MemAvailable of /proc/meminfo, in bytes: what the kernel can give without
// swapping. nullopt where it cannot be read (then nothing is refused).
std::optional<uint64_t> AvailableHostMemoryBytes();

// OK when `bytes` fit in the available host memory (or it is unknown);
// otherwise ResourceExhausted "<what> needs 3.6 TiB of host memory and this
// machine has 20.1 GiB available", to which callers add the setting that
// sizes it.
absl::Status CheckHostAllocation(uint64_t bytes, absl::string_view what);

// "512 B", "3.0 KiB", "20.1 GiB", "3.6 TiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_HOST_MEMORY_H_
