// NcclJoin: what a rank needs to join its job's NCCL communicator
// (transport/nccl/nccl_channel.h, NcclChannelOptions), as the job runner
// hands it to DeviceBackends and DeviceBackends to the CUDA plugin
// (cuda_plugin_api.h), which needs nothing else of the worker.
//
// Thread-compatible (a value).
#ifndef CONVEYOR_WORKER_NCCL_JOIN_H_
#define CONVEYOR_WORKER_NCCL_JOIN_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/precision.h"
#include "transport/channel.h"
#include "transport/nccl/header_link.h"

namespace conveyor::worker {

struct NcclJoin {
  int rank = 0;
  int world_size = 1;
  std::string unique_id;   // CreateNcclUniqueId() of rank 0.
  uint64_t job = 0;        // Data-plane job number.
  std::vector<int> peers;  // Pipeline neighbours; empty: all others.
  transport::HeaderLink* header_link = nullptr;  // Outlives the channel.
  engine::Precision precision = engine::Precision::kFp32;  // Which backend.
  std::chrono::milliseconds init_timeout{60000};
  std::chrono::milliseconds stall_timeout{60000};
  bool abort_on_recv_timeout = true;
  // Optional; the data-plane metrics. Outlives the channel.
  transport::DataPlaneObserver* observer = nullptr;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_NCCL_JOIN_H_
