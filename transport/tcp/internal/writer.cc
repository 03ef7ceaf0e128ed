#include "transport/tcp/internal/writer.h"

#include <sys/socket.h>  // sendmsg
#include <sys/uio.h>     // iovec

#include <array>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "transport/tcp/internal/net.h"

namespace conveyor::transport::tcp_internal {

Writer::Writer(asio::io_context& io, const TcpChannelConfig& config,
               Owner* owner)
    : io_(io), config_(config), owner_(owner) {}

Writer::Direct Writer::TryDirect(OutLink* l,
                                 const std::shared_ptr<OutFrame>& frame) {
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

void Writer::Post(OutLink* l, std::shared_ptr<OutFrame> frame) {
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

void Writer::Enqueue(OutLink* l, std::shared_ptr<OutFrame> frame) {
  const bool said_goodbye = owner_->SaidGoodbye(l->rank);
  if (said_goodbye && frame->droppable) return;
  if (said_goodbye && !owner_->Ending()) {
    // The peer closed its channel: nobody would read this tensor.
    owner_->Fail(absl::FailedPreconditionError(absl::StrCat(
        "rank ", config_.rank, " sends to ", owner_->Peer(l->rank, ""),
        ", which has closed its channel")));
    return;
  }
  if (l->state == OutLink::State::kClosed || l->final_queued) return;
  l->final_queued = frame->final;
  l->queue.push_back(std::move(frame));
  MaybeWrite(l);
}

void Writer::TakeRest(OutLink* l) {
  if (l->rest == nullptr) return;
  l->queue.push_front(std::move(l->rest));
  l->rest = nullptr;
}

void Writer::MaybeWrite(OutLink* l) {
  absl::MutexLock lock(&l->direct_mu);
  TakeRest(l);
  const bool idle = l->state == OutLink::State::kReady && !l->writing;
  if (!idle || l->queue.empty()) {
    l->direct = idle && l->queue.empty() && !l->final_queued &&
                !owner_->SaidGoodbye(l->rank) && !owner_->Ending();
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
        if (ec) return owner_->OnLinkLost(l, ec);
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
          l->socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
          Close(l);
          return;
        }
        MaybeWrite(l);
      });
}

void Writer::Close(OutLink* l) {
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
  owner_->OnLinkClosed();
}

}  // namespace conveyor::transport::tcp_internal
