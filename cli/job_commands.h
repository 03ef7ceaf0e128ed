// The conveyorctl commands that talk to a running coordinator:
//
//   submit JOB.yaml [--set k.path=v ...] [--steps N] [--watch]
//                                                    send a job; print its id
//   status JOB                                       one job in detail
//   watch JOB [--log-every N]                        follow a job to its end
//   cancel JOB
//   jobs                                             every job, as a table
//   workers                                          every worker, as a table
//   drain WORKER [--reason TEXT] [--no-wait]   move the worker's job off it
//                                      without losing a step, then make it
//                                      leave; waits until it has
//   trace JOB [--step N] [--format json|svg] [--output FILE]
//                                      a step's measured timeline: Chrome
//                                      trace JSON (Perfetto) or an SVG like
//                                      `schedule --format svg`
//
// submit, status, cancel, jobs, workers and drain take `-o json` for the
// coordinator's messages as JSON (cli/json_output.h) instead of a table.
// Each takes --coordinator ADDRESS (else $CONVEYOR_COORDINATOR, else
// 127.0.0.1:7070) and --timeout SECONDS for each unary call. The coordinator
// validates jobs: a bad one comes back InvalidArgument "file:line:col: ..."
// and conveyorctl exits 2. `watch` (and `submit --watch`) exits 0 only when
// the job SUCCEEDED.
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_JOB_COMMANDS_H_
#define CONVEYOR_CLI_JOB_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "cli/coordinator_flags.h"
#include "cli/job_file.h"
#include "cli/watch.h"
#include "conveyor/v1/conveyor.pb.h"
#include "proto/credentials.h"

namespace conveyor::cli {

struct JobCommandOptions : CoordinatorFlags {
  std::string job_file;                // submit
  std::vector<std::string> overrides;  // submit --set
  int64_t steps = 0;                   // submit --steps; 0: as in the job
  bool watch = false;                  // submit --watch
  std::string job_id;                  // status, watch, cancel
  int64_t log_every = 0;               // watch; 0: about 20 lines per job
  int64_t step = 0;                    // trace; 0: the newest kept step
  std::string format = "json";         // trace: json or svg
  std::string output;                  // trace; empty or "-": stdout
  std::string worker;                  // drain: id or name
  std::string reason;                  // drain
  bool no_wait = false;                // drain
  double wait_timeout_seconds = 0;     // drain; 0: as long as it takes
  // submit, status, cancel, jobs, workers, drain: "table" (or the command's
  // own lines) or "json" (cli/json_output.h).
  std::string output_format = "table";
  bool json() const { return output_format == "json"; }
};

// The subcommands, for the caller to see which one was parsed.
struct JobCommands {
  CLI::App* submit = nullptr;
  CLI::App* status = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* jobs = nullptr;
  CLI::App* workers = nullptr;
  CLI::App* trace = nullptr;
  CLI::App* drain = nullptr;

  bool AnyParsed() const;
};

JobCommands AddJobCommands(CLI::App& app, JobCommandOptions& options);

// Connects to the coordinator and runs whichever of `commands` was parsed.
// `tty`: standard output is a terminal (watch redraws a progress bar).
absl::Status RunJobCommand(const JobCommands& commands,
                           const JobCommandOptions& options, bool tty,
                           std::ostream& out);

// The request `submit` sends for `source`.
v1::SubmitJobRequest MakeSubmitRequest(const JobSource& source);

// The commands over a connected client. Errors are the coordinator's (see
// CoordinatorClient); RunSubmit also fails as ReadJobSource does, and
// RunWatch (RunSubmit with options.watch) as JobOutcomeStatus does.
absl::Status RunSubmit(CoordinatorClient& client,
                       const JobCommandOptions& options,
                       const WatchOptions& watch, std::ostream& out);
absl::Status RunStatus(CoordinatorClient& client, const std::string& id,
                       absl::Time now, std::ostream& out, bool json = false);
absl::Status RunWatch(CoordinatorClient& client, const std::string& id,
                      const WatchOptions& watch, std::ostream& out);
absl::Status RunCancel(CoordinatorClient& client, const std::string& id,
                       std::ostream& out, bool json = false);
absl::Status RunJobs(CoordinatorClient& client, absl::Time now,
                     std::ostream& out, bool json = false);
absl::Status RunWorkers(CoordinatorClient& client, std::ostream& out,
                        bool json = false);
// Drains options.worker, then (unless no_wait) polls every `poll` until the
// coordinator no longer lists it: DeadlineExceeded after
// wait_timeout_seconds (when positive), saying what it still holds.
absl::Status RunDrain(CoordinatorClient& client,
                      const JobCommandOptions& options, std::ostream& out,
                      absl::Duration poll = absl::Milliseconds(200));
// Writes the trace to options.output (atomically) and a summary of where
// each rank's step time went to `out`; or the trace itself to `out` when
// options.output is empty or "-".
absl::Status RunTrace(CoordinatorClient& client,
                      const JobCommandOptions& options, std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_JOB_COMMANDS_H_
