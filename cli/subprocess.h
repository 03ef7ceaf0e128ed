// Subprocess: a daemon that conveyorctl starts and owns (the embedded local
// cluster of `run`). The child's stdout and stderr go to a log file, its
// stdin is /dev/null, and it is tied to conveyorctl:
//   - it gets SIGTERM when the thread that spawned it dies
//     (PR_SET_PDEATHSIG), so a killed conveyorctl leaves no daemon behind;
//     spawn from a thread that outlives the child (the main thread);
//   - it runs in a process group of its own, so a Ctrl-C at the terminal
//     reaches only conveyorctl, which then cancels the job and stops the
//     daemons in order instead of having them die under it;
//   - it starts with the default signal dispositions and no signal blocked,
//     whatever conveyorctl has set up for itself.
// Thread-compatible: one thread owns a Subprocess (Signal() may be called
// from any thread while the child has not been reaped).
#ifndef CONVEYOR_CLI_SUBPROCESS_H_
#define CONVEYOR_CLI_SUBPROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace conveyor::cli {

class Subprocess {
 public:
  // Starts argv[0] (a path, not searched on PATH) with `argv`, appending its
  // output to `log_path` (created if missing). Errors: the errno-derived
  // code with the path when the log cannot be opened, fork fails, or exec
  // fails (reported back through a close-on-exec pipe, so a missing binary
  // is an error here rather than a line in the log).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Spawn(
      const std::vector<std::string>& argv, const std::string& log_path);

  // Kills (SIGKILL) and reaps the child if it is still running.
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // The binary's file name, for messages: "conveyor-worker".
  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }

  // Reaps the child if it has exited, without waiting. Returns how it ended
  // ("exited with status 1", "killed by signal 9 (Killed)"), or nullopt
  // while it runs.
  std::optional<std::string> Poll();

  // Sends `signal` unless the child has been reaped.
  void Signal(int signal);

  // Polls until the child exits or `timeout` passes; true if it exited.
  bool WaitFor(absl::Duration timeout);

 private:
  Subprocess(pid_t pid, std::string name, std::string log_path)
      : pid_(pid), name_(std::move(name)), log_path_(std::move(log_path)) {}

  const pid_t pid_;
  const std::string name_;
  const std::string log_path_;
  // Set once reaped: the pid may then belong to another process, so it must
  // not be signalled again.
  std::atomic<bool> reaped_{false};
  std::optional<std::string> ended_;
};

// The last `max_lines` lines of the file at `path` (at most 64 KiB of it),
// each indented by two spaces, for error messages; "  (empty)" or
// "  (cannot read: ...)" otherwise.
std::string TailFile(const std::string& path, int max_lines);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_SUBPROCESS_H_
