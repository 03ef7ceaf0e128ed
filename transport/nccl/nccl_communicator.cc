#include "transport/nccl/nccl_communicator.h"

#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "transport/nccl/nccl_launch_lock.h"
#include "transport/nccl/nccl_status.h"

namespace conveyor::transport {
namespace {

using Clock = std::chrono::steady_clock;

// Polling period while NCCL initializes, connects or finalizes: these take
// milliseconds to seconds, so a millisecond costs nothing.
constexpr std::chrono::milliseconds kSetupPoll{1};

}  // namespace

// Events for compute fences and group completions, recycled: creating one
// per send would cost a driver call each. Thread-safe (fences are made on
// Send's caller's thread and dropped on the progress thread).
class NcclCommunicator::EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
  }

  absl::StatusOr<cudaEvent_t> Acquire() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    // An event belongs to the device current when it is made, and must be
    // recorded on that device's streams: the caller's thread may have
    // another device current (a mesh stage's last peer copy leaves its
    // last device current before the send).
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_),
                               absl::StrCat("cudaSetDevice(", device_, ")")));
    cudaEvent_t e = nullptr;
    RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
        absl::StrCat("cudaEventCreateWithFlags on device ", device_)));
    return e;
  }

  // A released event may be recorded again at once: a cudaStreamWaitEvent
  // already enqueued keeps waiting for the record it saw.
  void Release(cudaEvent_t e) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    free_.push_back(e);
  }

 private:
  const int device_;
  absl::Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

namespace {

// An event recorded on the compute stream after the work producing a send.
class CudaFence final : public ComputeFence {
 public:
  CudaFence(std::function<void(cudaEvent_t)> release, cudaEvent_t event)
      : release_(std::move(release)), event_(event) {}
  ~CudaFence() override { release_(event_); }
  cudaEvent_t event() const { return event_; }

 private:
  std::function<void(cudaEvent_t)> release_;
  cudaEvent_t event_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(engine::Backend* backend,
                                   const NcclCommunicatorOptions& options)
    : backend_(backend),
      options_(options),
      events_(std::make_unique<EventPool>(backend->device_ordinal())) {}

NcclCommunicator::~NcclCommunicator() {
  // Best effort: a broken context is no reason not to release the rest.
  (void)Activate();
  comm_.reset();  // Aborts a communicator Close did not destroy.
  for (auto& [id, event] : groups_) events_->Release(event);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    engine::Backend* backend, const NcclCommunicatorOptions& options) {
  if (backend == nullptr || backend->device_ordinal() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicator needs a GPU backend, not ",
        backend == nullptr ? "none" : std::string(backend->Name())));
  }
  if (options.unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id has ", NCCL_UNIQUE_ID_BYTES,
                     " bytes, not ", options.unique_id.size()));
  }
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " outside a communicator of ",
                     options.world_size, " ranks"));
  }
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(backend, options));
  RETURN_IF_ERROR(comm->Init());
  return comm;
}

absl::Status NcclCommunicator::Activate() const {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess &&
      current == backend_->device_ordinal()) {
    return absl::OkStatus();
  }
  return CudaStatus(
      cudaSetDevice(backend_->device_ordinal()),
      absl::StrCat("cudaSetDevice(", backend_->device_ordinal(), ")"));
}

absl::Status NcclCommunicator::Init() {
  const Clock::time_point deadline = Clock::now() + options_.init_timeout;
  const int device = backend_->device_ordinal();
  const std::string where = absl::StrCat(
      "rank ", options_.rank, " of ", options_.world_size, " on cuda:", device);
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                             absl::StrCat(where, ": cudaSetDevice")));

  int least = 0, greatest = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                 absl::StrCat(where, ": cudaDeviceGetStreamPriorityRange")));
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
      absl::StrCat(where, ": cudaStreamCreateWithPriority")));
  stream_.reset(stream);
  cudaEvent_t fence = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&fence, cudaEventDisableTiming),
                 absl::StrCat(where, ": cudaEventCreateWithFlags")));
  compute_fence_.reset(fence);

  ncclUniqueId id;
  std::memcpy(id.internal, options_.unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  // Non-blocking: the call returns at once and NCCL joins the other ranks
  // in the background, so a rank that never comes can be given up on.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t raw = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(
      &raw, options_.world_size, id, options_.rank, &config);
  comm_.reset(raw);  // Aborted on every error path below.
  if (result != ncclSuccess && result != ncclInProgress) {
    return NcclStatus(result, absl::StrCat(where, ": ncclCommInitRankConfig"),
                      raw);
  }
  RETURN_IF_ERROR(
      WaitReady(absl::StrCat("joining the NCCL communicator of ",
                             options_.world_size, " ranks"),
                "a rank did not join (not started, or given another unique id)",
                deadline));
  return WarmUp(deadline);
}

absl::Status NcclCommunicator::WaitReady(absl::string_view what,
                                         absl::string_view timeout_reason,
                                         Clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_.get(), &state),
                               "ncclCommGetAsyncError", comm_.get()));
    if (state != ncclInProgress) {
      return NcclStatus(state, absl::StrCat("rank ", options_.rank, ": ", what),
                        comm_.get());
    }
    if (interrupted_.load()) {
      comm_.reset();  // ncclCommAbort: stops NCCL's background work.
      return absl::CancelledError(absl::StrCat(
          "rank ", options_.rank, ": ", what, ": the channel is failing"));
    }
    if (Clock::now() > deadline) {
      comm_.reset();  // ncclCommAbort: stops NCCL's background work.
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", options_.rank, ": ", what,
                       ": not done by the deadline: ", timeout_reason));
    }
    std::this_thread::sleep_for(kSetupPoll);
  }
}

absl::Status NcclCommunicator::WarmUp(Clock::time_point deadline) {
  if (options_.peers.empty()) return absl::OkStatus();
  const auto n = static_cast<int64_t>(options_.peers.size());
  // One byte out and one in per peer; the contents do not matter. Kept
  // for the communicator's lifetime: if the warm-up is aborted, nothing can
  // reuse memory a kernel might still touch.
  ASSIGN_OR_RETURN(warmup_buffer_, backend_->Empty({2, n}, engine::DType::kU8));
  const engine::Tensor out = warmup_buffer_.Rows(0, 1).Reshape({n});
  const engine::Tensor in = warmup_buffer_.Rows(1, 2).Reshape({n});
  std::vector<P2pOp> ops;
  for (int64_t i = 0; i < n; ++i) {
    const int peer = options_.peers[i];
    ops.push_back(SendOp(peer, out.Rows(i, i + 1)));
    ops.push_back(RecvOp(peer, in.Rows(i, i + 1)));
  }
  const std::string what = absl::StrCat("connecting to rank(s) ",
                                        absl::StrJoin(options_.peers, ", "));
  RETURN_IF_ERROR(EnqueueGroup(ops, deadline));
  RETURN_IF_ERROR(CudaStatus(
      cudaEventRecord(compute_fence_.get(), stream_.get()), "cudaEventRecord"));
  while (true) {
    const cudaError_t done = cudaEventQuery(compute_fence_.get());
    if (done == cudaSuccess) break;
    if (done != cudaErrorNotReady) {
      return CudaStatus(done, absl::StrCat("rank ", options_.rank, ": ", what));
    }
    RETURN_IF_ERROR(AsyncError());
    if (Clock::now() > deadline) {
      comm_.reset();
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", options_.rank, ": ", what,
                       ": not done by the deadline: a peer does not answer "
                       "(it did not list this rank as a peer, or hung)"));
    }
    std::this_thread::sleep_for(kSetupPoll);
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::EnqueueGroup(const std::vector<P2pOp>& ops,
                                            Clock::time_point deadline) {
  RETURN_IF_ERROR(Activate());
  // Receive buffers may be blocks the compute stream just freed, with
  // kernels still queued that use them: write them only after those.
  bool receives = false;
  for (const P2pOp& op : ops) receives |= op.kind == P2pOp::Kind::kRecv;
  if (receives) {
    RETURN_IF_ERROR(backend_->RecordEvent(compute_fence_.get()));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(stream_.get(), compute_fence_.get(), 0),
                   "cudaStreamWaitEvent"));
  }
  // Each payload is complete once the compute stream reaches the fence
  // recorded at Send.
  for (const P2pOp& op : ops) {
    if (op.kind != P2pOp::Kind::kSend || op.fence == nullptr) continue;
    const auto* fence = static_cast<const CudaFence*>(op.fence.get());
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(stream_.get(), fence->event(), 0),
                   "cudaStreamWaitEvent"));
  }
  ncclComm_t comm = comm_.get();
  // No other thread may issue NCCL operations on this device (a mesh's
  // communicator) until this group is launched.
  NcclLaunchLock launch({backend_->device_ordinal()});
  RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", comm));
  ncclResult_t first = ncclSuccess;
  for (const P2pOp& op : ops) {
    const ncclResult_t r =
        op.kind == P2pOp::Kind::kSend
            ? ncclSend(op.tensor.raw(), op.tensor.bytes(), ncclUint8, op.peer,
                       comm, stream_.get())
            : ncclRecv(op.tensor.raw(), op.tensor.bytes(), ncclUint8, op.peer,
                       comm, stream_.get());
    if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
      first = r;
    }
  }
  // Ended even after an error, so the thread's group state is reset.
  const ncclResult_t end = ncclGroupEnd();
  if (first != ncclSuccess) {
    return NcclStatus(first, "ncclSend/ncclRecv", comm);
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return NcclStatus(end, "ncclGroupEnd", comm);
  }
  // Until NCCL leaves ncclInProgress (connection setup) the kernels may not
  // be on the stream yet, so nothing may be recorded after them before.
  if (end == ncclInProgress) {
    RETURN_IF_ERROR(WaitReady("launching a group",
                              "a peer is not connecting (lost or hung)",
                              deadline));
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedSend> NcclCommunicator::PrepareSend(
    const engine::Tensor& tensor) {
  engine::Tensor payload = tensor;
  if (tensor.backend() != backend_) {
    if (!tensor.backend()->host_resident()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a tensor of ", tensor.backend()->Name(),
          " cannot be sent by the NCCL channel on ", backend_->Name()));
    }
    // A host tensor is copied to the device first; CopyFromHost has read the
    // host memory when it returns.
    ASSIGN_OR_RETURN(payload, backend_->Empty(tensor.shape(), tensor.dtype()));
    RETURN_IF_ERROR(
        backend_->CopyFromHost(tensor.raw(), tensor.bytes(), payload));
  }
  ASSIGN_OR_RETURN(cudaEvent_t event, events_->Acquire());
  if (absl::Status s = backend_->RecordEvent(event); !s.ok()) {
    events_->Release(event);
    return s;
  }
  EventPool* pool = events_.get();
  return PreparedSend{payload,
                      std::make_shared<CudaFence>(
                          [pool](cudaEvent_t e) { pool->Release(e); }, event)};
}

absl::StatusOr<engine::Tensor> NcclCommunicator::AllocateRecv(
    const engine::Shape& shape, engine::DType dtype) {
  return backend_->Empty(shape, dtype);
}

absl::StatusOr<uint64_t> NcclCommunicator::Launch(
    const std::vector<P2pOp>& ops) {
  CONVEYOR_CHECK(comm_ != nullptr,
                 "Launch on an aborted or closed communicator");
  RETURN_IF_ERROR(EnqueueGroup(ops, Clock::now() + options_.launch_timeout));
  ASSIGN_OR_RETURN(cudaEvent_t done, events_->Acquire());
  if (absl::Status s = CudaStatus(cudaEventRecord(done, stream_.get()),
                                  "cudaEventRecord after a group");
      !s.ok()) {
    events_->Release(done);
    return s;
  }
  const uint64_t id = next_group_++;
  groups_.emplace(id, done);
  return id;
}

absl::StatusOr<bool> NcclCommunicator::Poll(uint64_t id) {
  auto it = groups_.find(id);
  CONVEYOR_CHECK(it != groups_.end(), "Poll of an unknown or finished group");
  const cudaError_t done = cudaEventQuery(it->second);
  if (done == cudaErrorNotReady) return false;
  if (done != cudaSuccess) {
    return CudaStatus(done, absl::StrCat("rank ", options_.rank,
                                         ": waiting for an NCCL group"));
  }
  events_->Release(it->second);
  groups_.erase(it);
  return true;
}

absl::Status NcclCommunicator::AsyncError() {
  if (comm_ == nullptr) return absl::OkStatus();
  ncclResult_t state = ncclSuccess;
  RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_.get(), &state),
                             "ncclCommGetAsyncError", comm_.get()));
  if (state == ncclInProgress) return absl::OkStatus();
  return NcclStatus(state, "NCCL asynchronous error", comm_.get());
}

void NcclCommunicator::Abort() {
  (void)Activate();
  comm_.reset();  // ncclCommAbort.
}

bool NcclCommunicator::Quiescent() {
  // After ncclCommAbort NCCL's kernels exit; anything still queued on the
  // stream is waiting on compute, which finishes by itself. A broken
  // context (any error) runs nothing anymore either.
  return cudaStreamQuery(stream_.get()) != cudaErrorNotReady;
}

absl::Status NcclCommunicator::Close(std::chrono::milliseconds timeout) {
  if (comm_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(Activate());  // The destructor aborts the communicator.
  const Clock::time_point deadline = Clock::now() + timeout;
  const ncclResult_t result = ncclCommFinalize(comm_.get());
  if (result != ncclSuccess && result != ncclInProgress) {
    absl::Status s = NcclStatus(result, "ncclCommFinalize", comm_.get());
    comm_.reset();
    return s;
  }
  // WaitReady aborts the communicator if finalizing outlives the deadline.
  RETURN_IF_ERROR(WaitReady("finalizing the NCCL communicator",
                            "aborted instead", deadline));
  absl::Status destroyed =
      NcclStatus(ncclCommDestroy(comm_.get()), "ncclCommDestroy");
  (void)comm_.release();  // Destroyed, not to be aborted.
  return destroyed;
}

}  // namespace conveyor::transport
