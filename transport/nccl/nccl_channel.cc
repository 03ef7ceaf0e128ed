#include "transport/nccl/nccl_channel.h"

#include <nccl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend.h"
#include "transport/nccl/nccl_communicator.h"
#include "transport/nccl/nccl_status.h"

namespace conveyor::transport {

static_assert(kNcclUniqueIdBytes == NCCL_UNIQUE_ID_BYTES,
              "kNcclUniqueIdBytes must match nccl.h");

absl::StatusOr<std::string> CreateNcclUniqueId() {
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Create(
    const NcclChannelOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " outside a job of ",
                     options.world_size, " ranks"));
  }
  if (options.unique_id.size() != kNcclUniqueIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the NCCL unique id has ", options.unique_id.size(),
                     " bytes, not ", kNcclUniqueIdBytes));
  }
  if (options.header_link == nullptr || options.backend == nullptr) {
    return absl::InvalidArgumentError(
        "NcclChannel needs a header link and a CUDA backend");
  }
  if (options.backend->device_ordinal() != options.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclChannel for cuda:", options.device,
        " given the backend of cuda:", options.backend->device_ordinal()));
  }
  const std::chrono::milliseconds zero(0);
  if (options.init_timeout <= zero || options.stall_timeout <= zero ||
      options.linger < zero) {
    return absl::InvalidArgumentError(
        "init_timeout and stall_timeout must be positive, linger not "
        "negative");
  }
  ASSIGN_OR_RETURN(
      std::vector<int> peers,
      ResolvePeers(options.rank, options.world_size, options.peers));

  ASSIGN_OR_RETURN(
      std::unique_ptr<NcclCommunicator> comm,
      NcclCommunicator::Create(options.backend,
                               {.rank = options.rank,
                                .world_size = options.world_size,
                                .unique_id = options.unique_id,
                                .peers = peers,
                                .init_timeout = options.init_timeout,
                                .launch_timeout = options.stall_timeout}));
  ASSIGN_OR_RETURN(std::unique_ptr<P2pChannel> channel,
                   P2pChannel::Create(
                       std::move(comm), options.header_link,
                       {.job = options.job,
                        .peers = peers,
                        .max_tensor_bytes = options.max_tensor_bytes,
                        .abort_on_recv_timeout = options.abort_on_recv_timeout,
                        .stall_timeout = options.stall_timeout,
                        .linger = options.linger,
                        .observer = options.observer}));
  return std::unique_ptr<NcclChannel>(new NcclChannel(std::move(channel)));
}

NcclChannel::NcclChannel(std::unique_ptr<P2pChannel> channel)
    : channel_(std::move(channel)) {}
NcclChannel::~NcclChannel() = default;

absl::Status NcclChannel::Send(int to, const Tag& tag,
                               const engine::Tensor& tensor) {
  return channel_->Send(to, tag, tensor);
}

absl::StatusOr<engine::Tensor> NcclChannel::Recv(
    const Tag& tag, std::chrono::milliseconds timeout) {
  return channel_->Recv(tag, timeout);
}

void NcclChannel::Abort(const absl::Status& status) { channel_->Abort(status); }

absl::Status NcclChannel::status() const { return channel_->status(); }

P2pChannel::Stats NcclChannel::stats() const { return channel_->stats(); }

}  // namespace conveyor::transport
