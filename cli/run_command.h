// `conveyorctl run JOB.yaml`: trains a job on this machine.
//
// By default on an embedded local cluster (cli/local_cluster.h): a
// conveyor-coordinator and N conveyor-worker daemons as child processes
// (N: --workers, else as many as the job's pipeline needs), the job
// submitted and watched as `submit --watch` would (a progress bar on a
// terminal, a line every --log-every steps otherwise), then the daemons
// stopped. The exit code is the job's outcome: 0 only when it SUCCEEDED.
// SIGINT or SIGTERM cancels the job, stops the daemons and exits 130 or 143.
//
// With --in-process, the whole job trains in this process with the
// reference trainer, every stage in turn, and the final parameters go to
// checkpoint.dir/params.safetensors.
//
// The daemons' logs are kept, and their paths printed, when the job does
// not succeed; --keep-logs keeps them after a success too.
//
// --overwrite removes the step-<N> directories an earlier run left in
// checkpoint.dir before the run (a job that does not resume is otherwise
// refused over them).
//
// --set k.path=v overrides the job (cli/overrides.h); --steps S is
// --set training.steps=S.
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_RUN_COMMAND_H_
#define CONVEYOR_CLI_RUN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct RunCommandOptions {
  std::string job_file;
  bool in_process = false;
  // Remove the checkpoint steps an earlier run left in checkpoint.dir first.
  bool overwrite = false;
  int workers = 0;  // 0: as many as the job needs.
  // The workers' --devices: one value for all (e.g. "cuda:0": every worker
  // shares that GPU), or one per worker ("cuda:0", "cuda:1": each its own,
  // so their tensors go over NCCL); empty: the worker's default, the CPU.
  std::vector<std::string> devices;
  std::vector<std::string> overrides;
  int64_t steps = 0;      // 0: the job's training.steps.
  int64_t log_every = 0;  // 0: about 20 lines over the job.
  // Keep the daemons' logs after a job that succeeded too (they are always
  // kept, and their paths printed, after one that did not).
  bool keep_logs = false;
  // Do not pin local CPU workers to their share of the cores (they still
  // get that many threads).
  bool no_pin = false;
};

CLI::App* AddRunCommand(CLI::App& app, RunCommandOptions& options);

// `tty`: standard output is a terminal. Progress goes to `out`, notes about
// the cluster (interruption, where the logs are) to `err`.
// InvalidArgument for a bad job or flags (exit 2); an AlreadyReported status
// for a job that did not succeed (exit 1) or an interruption (130, 143);
// other errors exit 1.
absl::Status RunRunCommand(const RunCommandOptions& options, bool tty,
                           std::ostream& out, std::ostream& err);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_RUN_COMMAND_H_
