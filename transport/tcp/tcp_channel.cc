#include <sys/mman.h>  // madvise
#include <unistd.h>    // sysconf

#include "transport/tcp/tcp_channel_impl.h"

namespace conveyor::transport {

void TcpChannel::Impl::HintHugePages(void* data, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < kHugePageHintBytes) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) {
    madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

absl::Status TcpChannel::Impl::SplitHostPort(absl::string_view address,
                                             std::string* host,
                                             std::string* port) {
  const size_t colon = address.rfind(':');
  uint32_t port_number = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port_number) ||
      port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", address, "' is not host:port"));
  }
  absl::string_view h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  }
  *host = std::string(h);
  *port = std::to_string(port_number);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<asio::ip::tcp::endpoint>> TcpChannel::Impl::Resolve(
    absl::string_view address, bool passive) {
  std::string host, port;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  asio::io_context io;
  tcp::resolver resolver(io);
  asio::error_code ec;
  auto flags = tcp::resolver::numeric_service;
  if (passive) flags |= tcp::resolver::passive;
  const auto results = resolver.resolve(host, port, flags, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve '", address, "': ", ec ? ec.message() : "no address"));
  }
  std::vector<tcp::endpoint> endpoints;
  for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  return endpoints;
}

std::string TcpChannel::Impl::EndpointString(const tcp::socket& socket) {
  asio::error_code ec;
  const tcp::endpoint ep = socket.remote_endpoint(ec);
  if (ec) return "unknown address";
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

bool TcpChannel::Impl::IsHost(engine::Backend* backend) {
  return backend->host_resident();
}

absl::Status TcpChannel::Impl::HelloRejection(HelloResult result,
                                              std::string message) {
  switch (result) {
    case HelloResult::kBadSecret:
      // With auth tokens the secret is derived from the token
      // (common/auth_token.h: DataPlaneSecret), so a token mismatch between
      // workers ends here: say so, since nothing else will.
      return absl::PermissionDeniedError(absl::StrCat(
          message,
          " (not this job's secret, or the workers were started with "
          "different --auth-token-file tokens)"));
    default:
      return absl::FailedPreconditionError(std::move(message));
  }
}

absl::Status TcpChannel::Impl::Listen() {
  ASSIGN_OR_RETURN(std::vector<tcp::endpoint> endpoints,
                   Resolve(config_.listen_address, /*passive=*/true));
  asio::error_code ec;
  const tcp::endpoint& ep = endpoints.front();
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) port_ = acceptor_.local_endpoint(ec).port();
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("rank ", config_.rank, " cannot listen on ",
                     config_.listen_address, ": ", ec.message()));
  }
  work_.emplace(io_.get_executor());
  StartAccept();
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
        StartConnect(out_[r].get(), endpoints[r], deadline);
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
  OutLink* l = out_[to].get();
  const Direct direct = frame->size() <= config_.direct_write_max_bytes
                            ? TryDirect(l, frame)
                            : Direct::kBusy;
  if (direct == Direct::kWritten && config_.observer != nullptr) {
    config_.observer->OnSent(to, frame->tensor.bytes(),
                             std::chrono::steady_clock::now() - frame->queued);
  }
  if (direct == Direct::kBusy) Post(l, std::move(frame));
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
  Post(out_[to].get(), std::move(frame));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpChannel::Impl::TakeMessage(
    int from, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&handler_mu_);
  if (handler_ != nullptr) {
    return absl::FailedPreconditionError(
        "TakeMessage while a message handler is set");
  }
  auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(handler_mu_) {
    return std::find_if(
        pending_messages_.begin(), pending_messages_.end(),
        [&](const std::pair<int, std::string>& m) { return m.first == from; });
  };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(handler_mu_) {
    return !handler_failure_.ok() || find() != pending_messages_.end();
  };
  handler_mu_.AwaitWithTimeout(absl::Condition(&ready),
                               absl::FromChrono(timeout));
  if (auto it = find(); it != pending_messages_.end()) {
    std::string message = std::move(it->second);
    pending_messages_.erase(it);
    return message;
  }
  if (!handler_failure_.ok()) return handler_failure_;
  return absl::DeadlineExceededError(
      absl::StrCat("rank ", config_.rank, " waited ", timeout.count(),
                   " ms for a message from rank ", from));
}

void TcpChannel::Impl::SetMessageHandler(MessageHandler* handler) {
  absl::MutexLock lock(&handler_mu_);
  handler_ = handler;
  if (handler == nullptr) return;
  // Deliver on the I/O thread, like everything after, so callbacks never
  // run concurrently.
  asio::post(io_, [this] { FlushMessages(); });
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
  return rejected_.load();
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
    {
      absl::MutexLock lock(&handler_mu_);
      handler_failure_ = s;
    }
    FlushMessages();
    OnAbort(s);
  });
}

// I/O thread: hands what is pending to the message handler, if any.
void TcpChannel::Impl::FlushMessages() {
  absl::MutexLock lock(&handler_mu_);
  if (handler_ == nullptr) return;
  while (!pending_messages_.empty()) {
    auto [from, message] = std::move(pending_messages_.front());
    pending_messages_.pop_front();
    handler_->OnMessage(from, std::move(message));
  }
  if (!handler_failure_.ok() && !failure_delivered_) {
    failure_delivered_ = true;
    handler_->OnChannelFailed(handler_failure_);
  }
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
