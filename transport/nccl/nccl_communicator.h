// NcclCommunicator: CommunicatorInterface over one non-blocking NCCL
// communicator and a communication stream on a GPU backend's device.
//
//  - Creation joins the communicator (ncclCommInitRankConfig with
//    blocking = 0, so a peer that never shows up ends in DeadlineExceeded
//    and ncclCommAbort instead of a hang), then runs one warm-up group with
//    a one-byte send and receive per peer, so every connection is set up
//    (and every peer proven alive) before the first tensor, inside the same
//    deadline.
//  - Sends wait on the communication stream for the event PrepareSend
//    recorded on the compute stream (cudaStreamWaitEvent, never a host
//    wait). Receive buffers come from the backend's caching allocator,
//    whose blocks are reused in compute-stream order, so each group also
//    waits for the compute work enqueued before it.
//  - Each group is ncclGroupStart, the sends and receives, ncclGroupEnd
//    (polling ncclCommGetAsyncError while NCCL reports ncclInProgress),
//    then an event on the communication stream that Poll queries.
//  - The communication stream has the highest priority, so transfers are
//    not starved by long compute kernels.
//
// Thread-safety: as CommunicatorInterface says. Needs NCCL >= 2.14
// (non-blocking communicators, ncclCommFinalize).
#ifndef CONVEYOR_TRANSPORT_NCCL_NCCL_COMMUNICATOR_H_
#define CONVEYOR_TRANSPORT_NCCL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_handles.h"
#include "transport/nccl/communicator.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "transport/nccl needs NCCL 2.14 or later (non-blocking communicators)"
#endif

namespace conveyor::transport {

// Owns an ncclComm_t; the deleter aborts it (the orderly path, Close,
// destroys it first and releases the handle).
struct NcclCommDeleter {
  void operator()(ncclComm_t comm) const noexcept { (void)ncclCommAbort(comm); }
};
using NcclCommPtr =
    std::unique_ptr<std::remove_pointer_t<ncclComm_t>, NcclCommDeleter>;

struct NcclCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  std::string unique_id;  // NCCL_UNIQUE_ID_BYTES bytes.
  // The ranks to connect to during creation (the channel's peers).
  std::vector<int> peers;
  // Joining the communicator and the warm-up together.
  std::chrono::milliseconds init_timeout{60000};
  // How long one ncclGroupEnd may stay in progress (connection setup).
  std::chrono::milliseconds launch_timeout{60000};
};

class NcclCommunicator final : public CommunicatorInterface {
 public:
  // Joins the communicator on backend->device_ordinal() (which the caller
  // checked against the job's ordinal). Returns:
  //   InvalidArgument for a unique id of the wrong size;
  //   DeadlineExceeded when not every rank joined, or a peer did not
  //     connect, within init_timeout (the message says which phase);
  //   FailedPrecondition for NCCL's invalid usage (two ranks on one GPU);
  //   other NCCL and CUDA failures as NcclStatus / CudaStatus map them.
  // `backend` outlives the communicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      engine::Backend* backend, const NcclCommunicatorOptions& options);

  // Aborts the communicator if Close did not run.
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  absl::StatusOr<PreparedSend> PrepareSend(
      const engine::Tensor& tensor) override;
  absl::StatusOr<engine::Tensor> AllocateRecv(const engine::Shape& shape,
                                              engine::DType dtype) override;
  absl::StatusOr<uint64_t> Launch(const std::vector<P2pOp>& ops) override;
  absl::StatusOr<bool> Poll(uint64_t id) override;
  absl::Status AsyncError() override;
  void Abort() override;
  void Interrupt() override { interrupted_.store(true); }
  bool Quiescent() override;
  absl::Status Close(std::chrono::milliseconds timeout) override;

 private:
  class EventPool;

  NcclCommunicator(engine::Backend* backend,
                   const NcclCommunicatorOptions& options);

  absl::Status Init();
  absl::Status WarmUp(std::chrono::steady_clock::time_point deadline);
  // Polls ncclCommGetAsyncError until the communicator leaves
  // ncclInProgress: OK, or NCCL's error about `what`. After `deadline`,
  // aborts the communicator and returns DeadlineExceeded naming `what` and
  // the likely `timeout_reason`.
  absl::Status WaitReady(absl::string_view what,
                         absl::string_view timeout_reason,
                         std::chrono::steady_clock::time_point deadline);
  // The group's ncclSend/ncclRecv calls between ncclGroupStart and
  // ncclGroupEnd, on stream_.
  absl::Status EnqueueGroup(const std::vector<P2pOp>& ops,
                            std::chrono::steady_clock::time_point deadline);
  // Makes the backend's device current on the calling thread.
  absl::Status Activate() const;

  engine::Backend* const backend_;
  const NcclCommunicatorOptions options_;
  std::unique_ptr<EventPool> events_;  // Outlives every fence it handed out.
  CudaStreamPtr stream_;
  CudaEventPtr compute_fence_;  // Progress thread only.
  engine::Tensor warmup_buffer_;
  NcclCommPtr comm_;
  std::map<uint64_t, cudaEvent_t> groups_;  // Launched, not yet done.
  uint64_t next_group_ = 0;
  std::atomic<bool> interrupted_{false};  // Ends WaitReady early.
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_NCCL_NCCL_COMMUNICATOR_H_
