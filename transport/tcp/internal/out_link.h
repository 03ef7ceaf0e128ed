// The send side of a TcpChannel: OutFrame, a frame waiting to be written,
// and OutLink, the connection this rank opens to send to one peer. Plain
// state; the Dialer opens and watches an OutLink, the Writer writes its
// frames, and the channel (TcpChannel::Impl) owns one per peer rank.
//
// Threads: an OutLink belongs to the channel's I/O thread, except the
// direct-write fields under `direct_mu`, which the threads that Send share
// with it (see Writer).
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_OUT_LINK_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_OUT_LINK_H_

#include <array>
#include <asio.hpp>  // ip::tcp, steady_timer, const_buffer
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "transport/tcp/frame.h"

namespace conveyor::transport::tcp_internal {

// A frame waiting to be written. Shared with the write handler, which
// keeps the header bytes and the tensor alive until the kernel has them.
struct OutFrame {
  FrameHeaderBytes header;
  engine::Tensor tensor;  // Tensor frames.
  std::string message;    // Abort and message frames.
  // Message frames: dropped, not an error, once the peer closed its
  // channel (HeaderLink's contract: a peer that stopped its end hears
  // nothing more; two ranks closing together must not fail each other).
  bool droppable = false;
  bool final = false;  // Abort or goodbye: close the link after it.
  std::chrono::steady_clock::time_point queued;  // Tensor frames.
  // Bytes already written (by a direct write the kernel took in part).
  uint64_t offset = 0;

  uint64_t size() const {
    return kFrameHeaderSize +
           (tensor.defined() ? tensor.bytes() : message.size());
  }
  // What is left to write: the header and the payload from `offset` on.
  std::array<asio::const_buffer, 2> Remaining() const {
    const asio::const_buffer payload =
        tensor.defined() ? asio::const_buffer(tensor.raw(), tensor.bytes())
                         : asio::buffer(message);
    if (offset < kFrameHeaderSize) {
      return {asio::buffer(header) + offset, payload};
    }
    return {payload + (offset - kFrameHeaderSize), asio::const_buffer()};
  }
};

// The connection this rank opened to send to one peer. I/O thread only.
struct OutLink {
  OutLink(asio::io_context& io, int rank)
      : socket(io), deadline(io), timer(io), rank(rank) {}
  enum class State { kIdle, kConnecting, kReady, kClosed };
  asio::ip::tcp::socket socket;
  asio::steady_timer deadline;  // Connect deadline.
  asio::steady_timer timer;     // Redial delay, then loss grace.
  const int rank;
  State state = State::kIdle;

  // Dialing (Dialer).
  std::vector<asio::ip::tcp::endpoint> endpoints;
  size_t attempts = 0;
  bool timed_out = false;
  std::string last_error = "no attempt";
  HelloBytes hello{};
  HelloAckBytes ack{};
  uint8_t probe = 0;

  // Writing (Writer).
  std::deque<std::shared_ptr<OutFrame>> queue;
  bool writing = false;       // queue.front() is being written.
  bool final_queued = false;  // Abort or goodbye queued: no more frames.

  // Shared with the threads that Send: the direct-write fast path. A
  // sender writes itself only while `direct` is set and nothing is posted;
  // the I/O thread clears `direct` (holding the lock) before it writes or
  // closes the socket, so the two never write at once.
  absl::Mutex direct_mu;
  // Ready, idle, nothing queued: the I/O thread's verdict (MaybeWrite).
  bool direct ABSL_GUARDED_BY(direct_mu) = false;
  // Frames posted to the I/O thread and not yet queued.
  int posted ABSL_GUARDED_BY(direct_mu) = 0;
  // A frame a direct write left part of: written next, before any other.
  std::shared_ptr<OutFrame> rest ABSL_GUARDED_BY(direct_mu);
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_OUT_LINK_H_
