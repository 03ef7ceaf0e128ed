#include "common/cpu_set.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace conveyor {
namespace {

absl::StatusOr<int> ParseCpu(absl::string_view text, absl::string_view part) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", part, "' is not a core number or range N-M (e.g. 0-3,8)"));
  }
  int cpu = -1;
  if (!absl::SimpleAtoi(text, &cpu) || cpu > kMaxCpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "core ", text, " is above the largest core number, ", kMaxCpu));
  }
  return cpu;
}

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(list);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError(
        "an empty core list; give cores as N, N-M or both, comma-separated "
        "(e.g. 0-3,8)");
  }
  std::set<int> cpus;
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t dash = part.find('-');
    int first = 0, last = 0;
    if (dash == absl::string_view::npos) {
      absl::StatusOr<int> cpu = ParseCpu(part, part);
      if (!cpu.ok()) return cpu.status();
      first = last = *cpu;
    } else {
      absl::StatusOr<int> a = ParseCpu(part.substr(0, dash), part);
      if (!a.ok()) return a.status();
      absl::StatusOr<int> b = ParseCpu(part.substr(dash + 1), part);
      if (!b.ok()) return b.status();
      if (*a > *b) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", part, "' is a range that runs backwards; write ",
                         *b, "-", *a));
      }
      first = *a;
      last = *b;
    }
    for (int cpu = first; cpu <= last; ++cpu) {
      if (!cpus.insert(cpu).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("core ", cpu, " is named twice"));
      }
    }
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ',';
    absl::StrAppend(&out, sorted[i]);
    if (j > i) absl::StrAppend(&out, "-", sorted[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return ErrnoStatus(errno, "sched_getaffinity");
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status PinProcess(const std::vector<int>& cpus) {
  if (cpus.empty()) {
    return absl::InvalidArgumentError("no cores to pin the process to");
  }
  absl::StatusOr<std::vector<int>> before = AllowedCpus();
  if (!before.ok()) return before.status();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu < 0 || cpu > kMaxCpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("core ", cpu, " is outside 0-", kMaxCpu));
    }
    CPU_SET(cpu, &set);
  }
  // The calling thread first, and checked: the kernel refuses a mask with
  // no core this process may use (EINVAL) and quietly drops cores of a
  // partly usable one (offline, or outside the cgroup's cpuset), which
  // would leave the worker on fewer cores than it was told it owns.
  const auto refused = [&](const std::vector<int>& got) {
    std::vector<int> missing;
    for (int cpu : cpus) {
      if (!std::binary_search(got.begin(), got.end(), cpu)) {
        missing.push_back(cpu);
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        missing.size() == 1 ? "core " : "cores ", FormatCpuList(missing),
        missing.size() == 1 ? " is" : " are",
        " not available to this process (it runs on ", FormatCpuList(*before),
        ")"));
  };
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    if (errno == EINVAL) return refused({});
    return ErrnoStatus(
        errno, absl::StrCat("sched_setaffinity(", FormatCpuList(cpus), ")"));
  }
  absl::StatusOr<std::vector<int>> after = AllowedCpus();
  if (!after.ok()) return after.status();
  std::vector<int> wanted = cpus;
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  if (*after != wanted) {
    const absl::Status status = refused(*after);
    cpu_set_t previous;
    CPU_ZERO(&previous);
    for (int cpu : *before) CPU_SET(cpu, &previous);
    (void)sched_setaffinity(0, sizeof(previous), &previous);
    return status;
  }
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task", error)) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    if (sched_setaffinity(tid, sizeof(set), &set) != 0 && errno != ESRCH) {
      return ErrnoStatus(errno, absl::StrCat("sched_setaffinity(thread ", tid,
                                             ", ", FormatCpuList(cpus), ")"));
    }
  }
  if (error) {
    return absl::InternalError(
        absl::StrCat("listing /proc/self/task: ", error.message()));
  }
  return absl::OkStatus();
}

std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus,
                                        int parts) {
  std::vector<std::vector<int>> shares;
  if (parts <= 0 || cpus.size() < static_cast<size_t>(parts)) return shares;
  const size_t each = cpus.size() / parts;
  for (int p = 0; p < parts; ++p) {
    shares.emplace_back(cpus.begin() + p * each, cpus.begin() + (p + 1) * each);
  }
  return shares;
}

}  // namespace conveyor
