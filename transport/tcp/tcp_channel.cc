#include "transport/tcp/tcp_channel.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/internal/net.h"
#include "transport/tcp/tcp_channel_impl.h"

namespace conveyor::transport {

using tcp_internal::Resolve;

TcpChannel::Impl::Impl(const TcpChannelConfig& config, engine::Backend* backend)
    : config_(config),
      backend_(backend),
      writer_(io_, config_, this),
      dialer_(config_, &writer_, this),
      reader_(io_, config_, backend, this),
      inbox_(config.rank,
             [this] { asio::post(io_, [this] { inbox_.Flush(); }); }),
      linger_timer_(io_),
      said_goodbye_(config.world_size, false),
      peer_addresses_(config.world_size),
      mailbox_(config.rank) {
  for (int r = 0; r < config.world_size; ++r) {
    out_.push_back(std::make_unique<OutLink>(io_, r));
  }
}

TcpChannel::Impl::~Impl() {
  {
    absl::MutexLock lock(&mu_);
    if (status_.ok()) {
      status_ = absl::CancelledError(
          absl::StrCat("rank ", config_.rank, " closed its channel"));
    }
  }
  if (thread_.joinable()) {
    asio::post(io_, [this] { BeginClose(); });
    thread_.join();
  }
}

bool TcpChannel::Impl::IsHost(engine::Backend* backend) {
  return backend->host_resident();
}

absl::Status TcpChannel::Impl::Listen() {
  ASSIGN_OR_RETURN(std::vector<tcp::endpoint> endpoints,
                   Resolve(config_.listen_address, /*passive=*/true));
  const asio::error_code ec = reader_.Listen(endpoints.front(), &port_);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("rank ", config_.rank, " cannot listen on ",
                     config_.listen_address, ": ", ec.message()));
  }
  work_.emplace(io_.get_executor());
  reader_.StartAccept();
  thread_ = std::thread([this] { io_.run(); });
  return absl::OkStatus();
}

uint16_t TcpChannel::Impl::port() const { return port_; }

absl::Status TcpChannel::Impl::Connect(const std::vector<std::string>& peers) {
  {
    absl::MutexLock lock(&mu_);
    if (connect_called_) {
      return absl::FailedPreconditionError("Connect called twice");
    }
    connect_called_ = true;
    if (!status_.ok()) return status_;
  }
  if (static_cast<int>(peers.size()) != config_.world_size) {
    const absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("rank ", config_.rank, ": ", peers.size(),
                     " peer addresses for ", config_.world_size, " ranks"));
    Fail(s);
    return s;
  }
  std::vector<std::vector<tcp::endpoint>> endpoints(config_.world_size);
  for (int r = 0; r < config_.world_size; ++r) {
    if (r == config_.rank) continue;
    absl::StatusOr<std::vector<tcp::endpoint>> ep =
        Resolve(peers[r], /*passive=*/false);
    if (!ep.ok()) {
      const absl::Status s = WithContext(
          ep.status(), absl::StrCat("rank ", config_.rank, ", peer rank ", r));
      Fail(s);
      return s;
    }
    endpoints[r] = *std::move(ep);
  }
  {
    absl::MutexLock lock(&mu_);
    connects_pending_ = config_.world_size - 1;
  }
  const Clock::time_point deadline = Clock::now() + config_.connect_timeout;
  asio::post(io_, [this, peers, endpoints, deadline] {
    peer_addresses_ = peers;
    for (int r = 0; r < config_.world_size; ++r) {
      if (r != config_.rank) {
        dialer_.Start(out_[r].get(), endpoints[r], deadline);
      }
    }
  });
  // Every dial ends by its deadline timer at the latest, so this wait is
  // bounded without a timeout of its own.
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return connects_pending_ == 0 || !status_.ok();
  };
  mu_.Await(absl::Condition(&done));
  if (!status_.ok()) return status_;
  connected_ = true;
  return absl::OkStatus();
}

absl::Status TcpChannel::Impl::Send(int to, const Tag& tag,
                                    const engine::Tensor& tensor) {
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    if (!connected_ && to != config_.rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", config_.rank, " sends before Connect succeeded"));
    }
  }
  if (to < 0 || to >= config_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", config_.rank, " sends to unknown rank ", to));
  }
  if (tag.job != config_.job) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", config_.rank,
                                                   " sends the ", ToString(tag),
                                                   " in job ", config_.job));
  }
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", config_.rank, " sends an undefined ", ToString(tag)));
  }
  if (tensor.bytes() > config_.max_frame_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", ToString(tag), " has ", tensor.bytes(),
        " bytes, more than max_frame_bytes ", config_.max_frame_bytes));
  }
  absl::StatusOr<FrameHeader> header = TensorFrameHeader(tag, tensor);
  if (!header.ok()) return header.status();

  // The I/O thread may read only host memory, and only the caller's thread
  // may drive the tensor's backend: stage device tensors here, in the
  // backend's staging memory (page-locked on CUDA, so the copy runs at
  // DMA speed).
  engine::Tensor payload = tensor;
  if (!IsHost(tensor.backend())) {
    absl::StatusOr<engine::Tensor> host =
        tensor.backend()->EmptyHostStaging(tensor.shape(), tensor.dtype());
    if (!host.ok()) return host.status();
    absl::Status s =
        tensor.backend()->CopyToHost(tensor, host->raw(), tensor.bytes());
    if (!s.ok()) return s;
    payload = *std::move(host);
  }
  if (to == config_.rank) {
    return Deliver(tag, std::move(payload), config_.rank);
  }

  auto frame = std::make_shared<OutFrame>();
  EncodeFrameHeader(*header, &frame->header);
  frame->tensor = std::move(payload);
  if (config_.observer != nullptr) {
    frame->queued = std::chrono::steady_clock::now();
  }
  using Direct = tcp_internal::Writer::Direct;
  OutLink* l = out_[to].get();
  const Direct direct = frame->size() <= config_.direct_write_max_bytes
                            ? writer_.TryDirect(l, frame)
                            : Direct::kBusy;
  if (direct == Direct::kWritten && config_.observer != nullptr) {
    config_.observer->OnSent(to, frame->tensor.bytes(),
                             std::chrono::steady_clock::now() - frame->queued);
  }
  if (direct == Direct::kBusy) writer_.Post(l, std::move(frame));
  return absl::OkStatus();
}

absl::Status TcpChannel::Impl::SendMessage(int to, std::string message) {
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    if (!connected_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", config_.rank, " sends a message before Connect succeeded"));
    }
  }
  if (to < 0 || to >= config_.world_size || to == config_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", config_.rank, " sends a message to rank ", to,
                     ", which is not a peer"));
  }
  if (message.size() > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", config_.rank, " sends a message of ",
                     message.size(), " bytes; at most ", kMaxMessageBytes));
  }
  auto frame = std::make_shared<OutFrame>();
  EncodeFrameHeader(MessageFrameHeader(config_.job, message.size()),
                    &frame->header);
  frame->message = std::move(message);
  frame->droppable = true;
  writer_.Post(out_[to].get(), std::move(frame));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpChannel::Impl::TakeMessage(
    int from, std::chrono::milliseconds timeout) {
  return inbox_.Take(from, timeout);
}

void TcpChannel::Impl::SetMessageHandler(MessageHandler* handler) {
  inbox_.SetHandler(handler);
}

absl::StatusOr<engine::Tensor> TcpChannel::Impl::Recv(
    const Tag& tag, std::chrono::milliseconds timeout) {
  engine::Tensor tensor;
  absl::Status timed_out;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<engine::Tensor>> arrived =
        mailbox_.Await(mu_, status_, tag, timeout);
    if (!arrived.ok()) return arrived.status();
    if (arrived->has_value()) {
      tensor = **std::move(arrived);
    } else {
      timed_out = mailbox_.TimeoutError(tag, timeout);
      if (config_.abort_on_recv_timeout) {
        SetAbortStatus(timed_out);
      }
    }
  }
  if (!timed_out.ok()) {
    // Outside mu_ (Observe excludes it): the observer is outside code.
    Observe(DataPlaneObserver::Error::kTimeout);
    return timed_out;
  }
  // Host memory serves every CPU backend (fp32 or bf16 GEMMs alike).
  if (IsHost(backend_)) return tensor;
  // Received into host memory by the I/O thread; moved to the caller's
  // backend here, on the thread that drives it.
  absl::StatusOr<engine::Tensor> device =
      backend_->Empty(tensor.shape(), tensor.dtype());
  if (!device.ok()) return device.status();
  absl::Status s =
      backend_->CopyFromHost(tensor.raw(), tensor.bytes(), *device);
  if (!s.ok()) return s;
  return device;
}

// Counts a failure this channel observed itself; the connections that
// close after an abort (its own or a peer's) are consequences, not news.
void TcpChannel::Impl::Observe(DataPlaneObserver::Error error) {
  if (config_.observer == nullptr) return;
  if (error == DataPlaneObserver::Error::kPeerLost) {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return;
  }
  config_.observer->OnError(error);
}

void TcpChannel::Impl::Fail(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  SetAbortStatus(status);
}

int64_t TcpChannel::Impl::rejected_connections() const {
  return reader_.rejected();
}

absl::Status TcpChannel::Impl::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void TcpChannel::Impl::SetAbortStatus(const absl::Status& status) {
  if (!status_.ok()) return;
  status_ =
      status.ok() ? absl::AbortedError("aborted with an OK status") : status;
  // Tensors that arrived are of no use to an aborted job; free them now.
  mailbox_.Clear();
  SPDLOG_WARN("transport: rank {} aborts: {}", config_.rank,
              std::string(status_.message()));
  asio::post(io_, [this, s = status_] {
    inbox_.Fail(s);
    inbox_.Flush();
    OnAbort(s);
  });
}

absl::Status TcpChannel::Impl::Deliver(const Tag& tag, engine::Tensor tensor,
                                       int from) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  return mailbox_.File(tag, std::move(tensor), from);
}

std::string TcpChannel::Impl::Peer(int rank,
                                   absl::string_view fallback_address) const {
  const std::string& address = peer_addresses_[rank].empty()
                                   ? std::string(fallback_address)
                                   : peer_addresses_[rank];
  return absl::StrCat("rank ", rank, " (", address, ")");
}

void TcpChannel::Impl::OnConnected(OutLink* /*l*/) {
  absl::MutexLock lock(&mu_);
  --connects_pending_;
}

void TcpChannel::Impl::OnLinkLost(OutLink* l, const asio::error_code& ec) {
  {
    absl::MutexLock lock(&l->direct_mu);
    writer_.TakeRest(l);
  }
  // Message frames to a peer that closed may go unread (see OutFrame).
  const bool undelivered = std::any_of(
      l->queue.begin(), l->queue.end(),
      [](const std::shared_ptr<OutFrame>& f) { return !f->droppable; });
  writer_.Close(l);
  if (closing_) return;
  std::string reason =
      absl::StrCat("rank ", config_.rank, " lost the connection to ",
                   Peer(l->rank, ""), ": ", ec.message());
  // The peer's abort may sit behind as much as its linger lets it flush.
  ReportLossAfterGrace(l, undelivered, std::move(reason),
                       Clock::now() + kPeerLossGrace + config_.linger);
}

void TcpChannel::Impl::ReportLossAfterGrace(OutLink* l, bool undelivered,
                                            std::string reason,
                                            Clock::time_point give_up) {
  l->timer.expires_after(kPeerLossGrace);
  l->timer.async_wait([this, l, undelivered, reason = std::move(reason),
                       give_up](const asio::error_code& timer_ec) mutable {
    if (timer_ec) return;  // Closing: nothing to report.
    if (said_goodbye_[l->rank] && !undelivered) return;
    if (reader_.OpenFrom(l->rank) && Clock::now() < give_up) {
      ReportLossAfterGrace(l, undelivered, std::move(reason), give_up);
      return;
    }
    Observe(DataPlaneObserver::Error::kPeerLost);
    Fail(absl::UnavailableError(reason));
  });
}

void TcpChannel::Impl::OnMessage(int from, std::string message) {
  inbox_.Add(from, std::move(message));
  inbox_.Flush();
}

void TcpChannel::Impl::OnGoodbye(int rank) {
  said_goodbye_[rank] = true;
  writer_.MaybeWrite(out_[rank].get());  // No more direct writes to it.
}

void TcpChannel::Impl::OnAbort(const absl::Status& status) {
  if (abort_handled_) return;
  abort_handled_ = true;
  ArmLinger();
  for (auto& l : out_) {
    if (l->state != OutLink::State::kReady) {
      writer_.Close(l.get());
      continue;
    }
    if (l->final_queued) continue;  // Closing already says goodbye.
    {
      absl::MutexLock lock(&l->direct_mu);
      writer_.TakeRest(l.get());
      l->direct = false;
    }
    // A frame partly on the wire is finished; the rest are dropped.
    const bool keep_front =
        l->writing || (!l->queue.empty() && l->queue.front()->offset > 0);
    l->queue.erase(keep_front ? l->queue.begin() + 1 : l->queue.begin(),
                   l->queue.end());
    auto frame = std::make_shared<OutFrame>();
    EncodeFrameHeader(AbortFrameHeader(config_.job, status), &frame->header);
    frame->message = AbortPayload(status);
    frame->final = true;
    writer_.Enqueue(l.get(), std::move(frame));
  }
  CloseInbound();
  MaybeFinishClose();
}

void TcpChannel::Impl::BeginClose() {
  closing_ = true;
  ArmLinger();
  for (auto& l : out_) {
    if (l->state == OutLink::State::kReady) {
      if (l->final_queued) continue;
      auto frame = std::make_shared<OutFrame>();
      EncodeFrameHeader(GoodbyeFrameHeader(config_.job), &frame->header);
      frame->final = true;
      writer_.Enqueue(l.get(), std::move(frame));
    } else {
      writer_.Close(l.get());
    }
  }
  MaybeFinishClose();
}

void TcpChannel::Impl::ArmLinger() {
  if (linger_armed_) return;
  linger_armed_ = true;
  linger_timer_.expires_after(config_.linger);
  linger_timer_.async_wait([this](const asio::error_code& ec) {
    if (ec) return;
    for (auto& l : out_) writer_.Close(l.get());
    MaybeFinishClose();
  });
}

void TcpChannel::Impl::CloseInbound() { reader_.CloseAll(); }

void TcpChannel::Impl::MaybeFinishClose() {
  if (!closing_ || finished_) return;
  for (auto& l : out_) {
    if (l->state != OutLink::State::kClosed) return;
  }
  finished_ = true;
  CloseInbound();
  linger_timer_.cancel();
  for (auto& l : out_) l->timer.cancel();
  work_.reset();
}

absl::StatusOr<std::unique_ptr<TcpChannel>> TcpChannel::Create(
    const TcpChannelConfig& config, engine::Backend* backend) {
  if (config.world_size < 1 || config.rank < 0 ||
      config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", config.rank, " outside a job of ",
                     config.world_size, " ranks"));
  }
  if (config.secret.empty() || config.secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job secret must have 1 to ", kMaxSecretBytes,
                     " bytes, not ", config.secret.size()));
  }
  if (backend == nullptr) {
    return absl::InvalidArgumentError("TcpChannel needs a backend");
  }
  auto impl = std::make_unique<Impl>(config, backend);
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<TcpChannel>(new TcpChannel(std::move(impl)));
}

TcpChannel::TcpChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpChannel::~TcpChannel() = default;

uint16_t TcpChannel::port() const { return impl_->port(); }

absl::Status TcpChannel::Connect(const std::vector<std::string>& peers) {
  return impl_->Connect(peers);
}

absl::Status TcpChannel::Send(int to, const Tag& tag,
                              const engine::Tensor& tensor) {
  return impl_->Send(to, tag, tensor);
}

absl::StatusOr<engine::Tensor> TcpChannel::Recv(
    const Tag& tag, std::chrono::milliseconds timeout) {
  return impl_->Recv(tag, timeout);
}

void TcpChannel::Abort(const absl::Status& status) { impl_->Fail(status); }

absl::Status TcpChannel::SendMessage(int to, std::string message) {
  return impl_->SendMessage(to, std::move(message));
}

absl::StatusOr<std::string> TcpChannel::TakeMessage(
    int from, std::chrono::milliseconds timeout) {
  return impl_->TakeMessage(from, timeout);
}

void TcpChannel::SetMessageHandler(MessageHandler* handler) {
  impl_->SetMessageHandler(handler);
}

int64_t TcpChannel::rejected_connections() const {
  return impl_->rejected_connections();
}

absl::Status TcpChannel::status() const { return impl_->status(); }

}  // namespace conveyor::transport
