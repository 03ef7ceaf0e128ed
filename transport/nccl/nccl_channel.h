// NcclChannel: a rank's Channel endpoint when pipeline stages run on
// different GPUs: tensors move GPU to GPU over NCCL (NVLink, PCIe or the
// network, whatever NCCL picks), never through host memory. It is a
// P2pChannel (p2p_channel.h: headers over a HeaderLink, payloads in NCCL
// groups agreed in rounds, so no Send/Recv order can deadlock) over an
// NcclCommunicator (nccl_communicator.h: non-blocking communicator,
// communication stream ordered after compute by events, async errors
// polled, ncclCommAbort on failure).
//
// How the worker uses it (worker/job_runner.cc; docs/cuda.md, "Where it
// runs"):
//  1. Prepare. Every rank reports in JobReady its GPU's UUID and whether
//     its worker has NCCL.
//  2. Decide. The coordinator puts the job on NCCL only when every rank has
//     a GPU of its own with NCCL (NCCL refuses two ranks on one GPU and
//     cannot reach a CPU rank), else on TCP, and says so in StartJob, so
//     every rank makes the same choice.
//  3. Start. Each worker connects its TcpChannel as for any job (it carries
//     the header messages: TcpHeaderLink, over message frames). Rank 0 then
//     calls CreateNcclUniqueId() and sends the id to every rank as its
//     first message; the id names a bootstrap root in rank 0's process,
//     which waits until every rank has joined, so it is made only for a job
//     that uses it. Each rank calls Create with its rank, the world size,
//     its device and that device's backend, the id, the job number, its
//     pipeline neighbours as peers and the connect timeout as init_timeout; it
//     returns once all ranks have joined and connected, or fails with
//     DeadlineExceeded, which fails the job like a failed Connect.
//  4. Run. The StageExecutor gets the NcclChannel as its Channel; tensors
//     it sends must stay unmodified after Send (as with every channel),
//     and it receives device tensors of its backend.
//  5. End. A cancel or a failure calls Abort (ncclCommAbort; the peers
//     hear of it over the header link and abort too). The channel is
//     destroyed before the header link and the backend; the destructor
//     finishes the rounds already proposed and shuts the communicator
//     down.
//
// Thread-safe, as every Channel.
#ifndef CONVEYOR_TRANSPORT_NCCL_NCCL_CHANNEL_H_
#define CONVEYOR_TRANSPORT_NCCL_NCCL_CHANNEL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/channel.h"
#include "transport/nccl/header_link.h"
#include "transport/nccl/p2p_channel.h"

namespace conveyor::engine {
class Backend;
}  // namespace conveyor::engine

namespace conveyor::transport {

// The size of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A fresh unique id for one job's communicator, as kNcclUniqueIdBytes opaque
// bytes. Starts NCCL's bootstrap root in this process, which must outlive
// the communicator's creation on every rank. Unavailable when NCCL cannot
// open its bootstrap socket (no usable network interface). Needs no GPU.
absl::StatusOr<std::string> CreateNcclUniqueId();

struct NcclChannelOptions {
  int rank = 0;
  int world_size = 1;  // Ranks in the job, all on NCCL.
  int device = 0;      // CUDA ordinal; must be backend->device_ordinal().
  // CreateNcclUniqueId() of rank 0, the same on every rank.
  std::string unique_id;
  uint64_t job = 0;  // Data-plane job number, as in Tag::job.
  // The ranks exchanged with (symmetric); empty: all others.
  std::vector<int> peers;
  // Both outlive the channel; the backend also outlives every tensor Recv
  // returned.
  HeaderLink* header_link = nullptr;
  engine::Backend* backend = nullptr;
  // Joining the communicator and connecting to the peers.
  std::chrono::milliseconds init_timeout{60000};

  // P2pChannelOptions (p2p_channel.h).
  uint64_t max_tensor_bytes = uint64_t{1} << 36;
  bool abort_on_recv_timeout = true;
  std::chrono::milliseconds stall_timeout{60000};
  std::chrono::milliseconds linger{10000};
  DataPlaneObserver* observer = nullptr;
};

class NcclChannel final : public Channel {
 public:
  // Joins the job's communicator and starts the channel. Returns
  //   InvalidArgument: rank outside [0, world_size), a unique id of the
  //     wrong size, a null link or backend, device !=
  //     backend->device_ordinal(), non-positive timeouts, a bad peer list;
  //   DeadlineExceeded: not every rank joined, or a peer did not connect,
  //     within init_timeout (the communicator is aborted; nothing hangs);
  //   FailedPrecondition: NCCL refused the setup (e.g. two ranks on one
  //     GPU: use TCP there);
  //   Unavailable / Internal: other NCCL or CUDA failures, as mapped by
  //     nccl_status.h and engine/cuda/cuda_status.h.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Create(
      const NcclChannelOptions& options);

  ~NcclChannel() override;

  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  // Channel, as P2pChannel documents. Send accepts tensors of the
  // channel's backend and CPU tensors (copied to the device first);
  // Recv returns tensors of the channel's backend.
  absl::Status Send(int to, const Tag& tag,
                    const engine::Tensor& tensor) override;
  absl::StatusOr<engine::Tensor> Recv(
      const Tag& tag, std::chrono::milliseconds timeout) override;
  void Abort(const absl::Status& status) override;

  // OK, or the status the channel was aborted with.
  absl::Status status() const;
  P2pChannel::Stats stats() const;

 private:
  explicit NcclChannel(std::unique_ptr<P2pChannel> channel);

  std::unique_ptr<P2pChannel> channel_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_NCCL_CHANNEL_H_
