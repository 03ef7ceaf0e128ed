#include "transport/tcp/tcp_channel_impl.h"

namespace conveyor::transport {

// Caller's thread: writes `frame` now if `l` is idle, without blocking.
TcpChannel::Impl::Direct TcpChannel::Impl::TryDirect(
    OutLink* l, const std::shared_ptr<OutFrame>& frame) {
  {
    absl::MutexLock lock(&l->direct_mu);
    if (!l->direct || l->posted > 0) return Direct::kBusy;
    const std::array<asio::const_buffer, 2> buffers = frame->Remaining();
    iovec iov[2];
    for (int i = 0; i < 2; ++i) {
      iov[i].iov_base = const_cast<void*>(buffers[i].data());
      iov[i].iov_len = buffers[i].size();
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    const ssize_t n =
        ::sendmsg(l->socket.native_handle(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0 && static_cast<uint64_t>(n) == frame->size()) {
      return Direct::kWritten;
    }
    // Full socket buffer or an error: the I/O thread writes the rest, and
    // meets the error (if any) on its own write.
    frame->offset = n > 0 ? static_cast<uint64_t>(n) : 0;
    l->rest = frame;
    l->direct = false;
  }
  asio::post(io_, [this, l] { MaybeWrite(l); });
  return Direct::kPartly;
}

// Caller's thread: hands `frame` to the I/O thread, in order with the
// caller's other frames to `l`.
void TcpChannel::Impl::Post(OutLink* l, std::shared_ptr<OutFrame> frame) {
  {
    absl::MutexLock lock(&l->direct_mu);
    ++l->posted;
  }
  asio::post(io_, [this, l, frame = std::move(frame)]() mutable {
    {
      // No direct write until MaybeWrite has seen this frame queued: a
      // small frame sent after it must not overtake it.
      absl::MutexLock lock(&l->direct_mu);
      --l->posted;
      l->direct = false;
    }
    Enqueue(l, std::move(frame));
  });
}

void TcpChannel::Impl::Enqueue(OutLink* l, std::shared_ptr<OutFrame> frame) {
  if (said_goodbye_[l->rank] && frame->droppable) return;
  if (said_goodbye_[l->rank] && !abort_handled_ && !closing_) {
    // The peer closed its channel: nobody would read this tensor.
    Fail(absl::FailedPreconditionError(
        absl::StrCat("rank ", config_.rank, " sends to ", Peer(l->rank, ""),
                     ", which has closed its channel")));
    return;
  }
  if (l->state == OutLink::State::kClosed || l->final_queued) return;
  l->final_queued = frame->final;
  l->queue.push_back(std::move(frame));
  MaybeWrite(l);
}

// Puts a direct write's remainder at the front of the queue: its first
// bytes are on the wire already.
void TcpChannel::Impl::TakeRest(OutLink* l) {
  if (l->rest == nullptr) return;
  l->queue.push_front(std::move(l->rest));
  l->rest = nullptr;
}

void TcpChannel::Impl::MaybeWrite(OutLink* l) {
  absl::MutexLock lock(&l->direct_mu);
  TakeRest(l);
  const bool idle = l->state == OutLink::State::kReady && !l->writing;
  if (!idle || l->queue.empty()) {
    l->direct = idle && l->queue.empty() && !l->final_queued &&
                !said_goodbye_[l->rank] && !abort_handled_ && !closing_;
    return;
  }
  l->direct = false;
  l->writing = true;
  // Header and payload in one gather write: no staging copy of the tensor.
  asio::async_write(
      l->socket, l->queue.front()->Remaining(), TransferAllUnbounded(),
      [this, l](const asio::error_code& ec, size_t) {
        l->writing = false;
        if (l->state == OutLink::State::kClosed) {
          l->queue.clear();
          return;
        }
        if (ec) return OutLinkLost(l, ec);
        const OutFrame& sent = *l->queue.front();
        if (config_.observer != nullptr && sent.tensor.defined()) {
          config_.observer->OnSent(
              l->rank, sent.tensor.bytes(),
              std::chrono::steady_clock::now() - sent.queued);
        }
        const bool final = sent.final;
        l->queue.pop_front();
        if (final) {
          // FIN after the last frame, so the peer reads it
          // before EOF.
          asio::error_code ignored;
          l->socket.shutdown(tcp::socket::shutdown_send, ignored);
          CloseOutLink(l);
          return;
        }
        MaybeWrite(l);
      });
}

void TcpChannel::Impl::CloseOutLink(OutLink* l) {
  {
    // No direct write may be using the socket as it closes.
    absl::MutexLock lock(&l->direct_mu);
    l->direct = false;
    l->rest = nullptr;
  }
  l->state = OutLink::State::kClosed;
  asio::error_code ignored;
  l->socket.close(ignored);
  l->deadline.cancel();
  // Frames being written stay until their handler runs.
  if (!l->writing) l->queue.clear();
  MaybeFinishClose();
}

// Tells every connected peer why, then closes. A frame being written is
// finished first (the stream would be garbage otherwise); queued ones are
// dropped.
void TcpChannel::Impl::OnAbort(const absl::Status& status) {
  if (abort_handled_) return;
  abort_handled_ = true;
  ArmLinger();
  for (auto& l : out_) {
    if (l->state != OutLink::State::kReady) {
      CloseOutLink(l.get());
      continue;
    }
    if (l->final_queued) continue;  // Closing already says goodbye.
    {
      absl::MutexLock lock(&l->direct_mu);
      TakeRest(l.get());
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
    Enqueue(l.get(), std::move(frame));
  }
  CloseInbound();
  MaybeFinishClose();
}

// Destructor: flush what was sent, then a goodbye on each connection.
void TcpChannel::Impl::BeginClose() {
  closing_ = true;
  ArmLinger();
  for (auto& l : out_) {
    if (l->state == OutLink::State::kReady) {
      if (l->final_queued) continue;
      auto frame = std::make_shared<OutFrame>();
      EncodeFrameHeader(GoodbyeFrameHeader(config_.job), &frame->header);
      frame->final = true;
      Enqueue(l.get(), std::move(frame));
    } else {
      CloseOutLink(l.get());
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
    for (auto& l : out_) CloseOutLink(l.get());
    MaybeFinishClose();
  });
}

void TcpChannel::Impl::CloseInbound() {
  asio::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  auto links = std::move(in_);
  in_.clear();
  for (auto& [id, link] : links) CloseInLink(link);
}

// Once every send-side connection is closed, closes the rest and lets the
// I/O thread's run() return.
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

}  // namespace conveyor::transport
