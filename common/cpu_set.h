// Which CPU cores a process runs on: Linux cpu lists ("0-3,8"), the cores
// this process may use, pinning every thread of the process to a set, and
// splitting a machine's cores among local workers.
//
// Why whole-process pinning: a CPU worker owns N cores (--devices cpu:N,
// --cpu-cores), and everything it runs there (the kernels' pool, OpenBLAS's
// threads, gRPC and the data plane) should stay off its neighbours' cores.
// OpenBLAS starts its threads when the library loads, before main, so
// setting the calling thread's mask is not enough: PinProcess sets the mask
// of every thread that exists (/proc/self/task) and the main thread's, which
// threads created later inherit.
//
// Thread-safety: all functions may be called from any thread; PinProcess
// races with threads being created concurrently (call it early).
#ifndef CONVEYOR_COMMON_CPU_SET_H_
#define CONVEYOR_COMMON_CPU_SET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor {

// The largest core number a list may name (glibc's CPU_SETSIZE - 1).
inline constexpr int kMaxCpu = 1023;

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}: sorted, no duplicates.
// InvalidArgument naming the bad part for an empty list, a part that is not
// N or N-M with N <= M, a number above kMaxCpu, or a core named twice.
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);

// The inverse: sorted cores as ranges, "0-3,8,10-11"; "" for none.
std::string FormatCpuList(const std::vector<int>& cpus);

// The cores this process may run on (sched_getaffinity), sorted.
absl::StatusOr<std::vector<int>> AllowedCpus();

// Pins every thread of this process, and those it creates later, to `cpus`
// (which may be wider than the current mask, within what the OS allows).
// InvalidArgument, with the mask unchanged, when a core does not exist or
// is not available to the process (offline, outside its cgroup's cpuset),
// naming it and the cores the process runs on; the OS's error (e.g.
// PermissionDenied in a restricted container) otherwise. A thread that
// exits meanwhile is not an error.
absl::Status PinProcess(const std::vector<int>& cpus);

// `cpus` in `parts` disjoint, consecutive shares of equal size
// (cpus.size() / parts each; the remainder is left over): the cores of P
// local workers. Empty when there are fewer cores than parts, so that no
// two workers are pinned to one core.
std::vector<std::vector<int>> SplitCpus(const std::vector<int>& cpus,
                                        int parts);

}  // namespace conveyor

#endif  // CONVEYOR_COMMON_CPU_SET_H_
