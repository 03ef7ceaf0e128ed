// LocalCluster: the embedded cluster of `conveyorctl run`: one
// conveyor-coordinator and N conveyor-worker daemons started as child
// processes on 127.0.0.1, their logs in a temporary directory.
//
// Startup, by the daemons' contract:
//   conveyor-coordinator --listen 127.0.0.1:0 --ready-file DIR/coordinator.addr
//                        --heartbeat-timeout 5
//     writes "host:port\n" to the ready file (atomically) once it serves,
//     then "metrics host:port\n" when given --metrics-address;
//   conveyor-worker --coordinator host:port --data-address 127.0.0.1:0
//                   --name local-<i>
//     registers and shows up IDLE in ListWorkers.
// Each wait fails early, with the end of the child's log, if a daemon exits;
// and returns Cancelled when the caller's `interrupted` says so (a signal).
//
// Stop() (also run by the destructor) sends SIGTERM to every daemon, waits
// for them, SIGKILLs what is left and reaps everything.
// Thread-compatible: one thread (the one that started it, because of
// PR_SET_PDEATHSIG, see cli/subprocess.h) drives a LocalCluster.
#ifndef CONVEYOR_CLI_LOCAL_CLUSTER_H_
#define CONVEYOR_CLI_LOCAL_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "cli/subprocess.h"

namespace conveyor::cli {

inline constexpr char kCoordinatorBinary[] = "conveyor-coordinator";
inline constexpr char kWorkerBinary[] = "conveyor-worker";
inline constexpr char kBinDirEnv[] = "CONVEYOR_BIN_DIR";

// Where to look for a daemon binary, in order: `bin_dir` alone when set
// (from $CONVEYOR_BIN_DIR: an explicit choice is not second-guessed), else
// `self_dir` (where conveyorctl itself is, as the build and installs put
// the three binaries together), else each directory of `path` ($PATH).
struct BinarySearch {
  std::string bin_dir;
  std::string self_dir;
  std::string path;

  // From the environment and /proc/self/exe.
  static BinarySearch FromEnvironment();
};

// The path of the executable `name`. NotFound saying where it looked.
absl::StatusOr<std::string> FindDaemonBinary(absl::string_view name,
                                             const BinarySearch& search);

struct LocalClusterOptions {
  int num_workers = 1;
  std::string coordinator_binary;  // Paths, as found by FindDaemonBinary.
  std::string worker_binary;
  int heartbeat_timeout_seconds = 5;
  // The workers' --devices: one entry serves every worker, or one per
  // worker (worker i gets entry i); empty: the worker's default (the CPU).
  std::vector<std::string> worker_devices;
  // Worker i's --cpu-cores (a cpu list it is pinned to); empty: none
  // pinned. One entry per worker when set.
  std::vector<std::string> worker_cpu_cores;
  absl::Duration ready_timeout = absl::Seconds(20);    // The ready file.
  absl::Duration workers_timeout = absl::Seconds(20);  // N IDLE workers.
  absl::Duration stop_timeout = absl::Seconds(5);      // SIGTERM to SIGKILL.
  // Every daemon serves /metrics on a free loopback port (the coordinator's
  // in metrics_address(), the workers' in ListWorkers).
  bool metrics = false;
  // Polled while waiting; true makes the wait return Cancelled.
  std::function<bool()> interrupted;
};

class LocalCluster {
 public:
  // Makes the log directory ($TMPDIR or /tmp, "conveyorctl-XXXXXX"), starts
  // the coordinator, waits for its ready file, then starts the workers.
  // Errors: the errno-derived code for the directory or a spawn;
  // FailedPrecondition when the coordinator exits first, DeadlineExceeded
  // when it is not ready in time (both with the end of its log); Cancelled
  // when interrupted. Whatever was started is stopped on error.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      LocalClusterOptions options);

  // Stop(); the log directory stays unless RemoveLogs() was called.
  ~LocalCluster();

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Polls `client.ListWorkers()` until num_workers workers are IDLE.
  // Errors: FailedPrecondition when a daemon exits, DeadlineExceeded after
  // workers_timeout (with the workers seen and the end of the logs),
  // Cancelled when interrupted.
  absl::Status WaitForWorkers(CoordinatorClient& client);

  // FailedPrecondition naming the first daemon that has exited, with the
  // end of its log; OK while all run.
  absl::Status CheckDaemons();

  // SIGTERM to every daemon, up to stop_timeout for them to exit, then
  // SIGKILL and reap. Idempotent.
  void Stop();

  // Deletes the log directory (after a successful run).
  void RemoveLogs();

  const std::string& coordinator_address() const { return address_; }
  // Where the coordinator serves /metrics; empty without options.metrics.
  const std::string& metrics_address() const { return metrics_address_; }
  // The process id of worker `i` (named "local-<i>"), for tests that kill
  // one; -1 when there is no such worker.
  pid_t worker_pid(int i) const {
    return i >= 0 && i < static_cast<int>(workers_.size()) ? workers_[i]->pid()
                                                           : -1;
  }
  const std::string& log_dir() const { return dir_; }
  // Every daemon's log file.
  std::vector<std::string> LogPaths() const;

 private:
  LocalCluster(LocalClusterOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}

  absl::Status StartCoordinator();
  absl::Status StartWorkers();
  bool Interrupted() const {
    return options_.interrupted && options_.interrupted();
  }
  // "<name> <how it ended>; the end of its log (<path>):\n<tail>".
  static std::string DescribeExit(Subprocess& daemon, absl::string_view how);

  const LocalClusterOptions options_;
  const std::string dir_;
  std::string address_;
  std::string metrics_address_;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
};

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_LOCAL_CLUSTER_H_
