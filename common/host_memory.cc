#include "common/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace conveyor {

std::optional<uint64_t> AvailableHostMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    uint64_t kib = 0;
    if (fields >> key >> kib >> unit && key == "MemAvailable:" &&
        unit == "kB") {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

std::string FormatBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B",   "KiB", "MiB", "GiB",
                                    "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

absl::Status CheckHostAllocation(uint64_t bytes, absl::string_view what) {
  const std::optional<uint64_t> available = AvailableHostMemoryBytes();
  if (!available.has_value() || bytes <= *available) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " needs ", FormatBytes(bytes),
                   " of host memory and this machine has ",
                   FormatBytes(*available), " available"));
}

}  // namespace conveyor
