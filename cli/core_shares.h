// How `conveyorctl run` divides the machine among its local workers: each
// CPU worker gets an equal, disjoint share of the cores conveyorctl may run
// on, as many kernel and BLAS threads (--devices cpu:N) and, unless told
// not to, those cores only (--cpu-cores), so that P workers never
// oversubscribe the machine: on 2 cores, the GPT example's two workers
// trained 1.37x faster with one thread each than with two each
// (docs/architecture.md).
#ifndef CONVEYOR_CLI_CORE_SHARES_H_
#define CONVEYOR_CLI_CORE_SHARES_H_

#include <string>
#include <vector>

namespace conveyor::cli {

struct CoreShareRequest {
  std::vector<int> cores = {};  // Those this process may use (AllowedCpus).
  int workers = 1;
  int devices_per_stage = 1;  // A worker's mesh splits its share.
  // The user's --devices (as RunCommandOptions has them); kept as given,
  // and a GPU worker is neither given threads nor pinned.
  std::vector<std::string> devices = {};
  bool pin = true;  // false: --no-pin.
};

struct CoreShares {
  // The workers' --devices when the user gave none ("cpu:N", or a mesh
  // "cpu:N,cpu:N"); empty: keep the user's.
  std::vector<std::string> worker_devices;
  // Worker i's --cpu-cores; empty: nobody pinned.
  std::vector<std::string> worker_cpu_cores;
  // For the run's start line, e.g. "1 core each, pinned to 0 | 1".
  std::string description;
};

// Shares of cores.size() / workers cores each, in order (the remainder is
// left idle). Fewer cores than workers: one thread each, nobody pinned.
CoreShares PlanCoreShares(const CoreShareRequest& request);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_CORE_SHARES_H_
