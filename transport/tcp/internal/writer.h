// Writer: writes a TcpChannel's frames to its peers, in order, one
// connection (OutLink) at a time. A small frame to an idle connection is
// written by the sender itself, without blocking (TryDirect); everything
// else is queued for the I/O thread, which writes header and payload in one
// gather write. A frame the kernel took only part of is finished by the I/O
// thread before anything else on that connection, so frames never
// interleave or reorder.
//
// Threads: TryDirect and Post run on the threads that Send; every other
// method on the channel's I/O thread. The two sides meet only under each
// OutLink's direct_mu. The Owner's methods are called on the I/O thread.
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_WRITER_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_WRITER_H_

#include <asio.hpp>  // io_context, error_code
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "transport/tcp/internal/channel_owner.h"
#include "transport/tcp/internal/out_link.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport::tcp_internal {

class Writer {
 public:
  // What the writer needs from the channel that owns it.
  class Owner : public ChannelOwner {
   public:
    // Whether `rank` closed its channel (sent a goodbye).
    virtual bool SaidGoodbye(int rank) const = 0;
    // Whether the channel is aborting or closing.
    virtual bool Ending() const = 0;
    // A write to `l`'s peer failed with `ec`.
    virtual void OnLinkLost(OutLink* l, const asio::error_code& ec) = 0;
    // `l` was closed; the channel may be done closing.
    virtual void OnLinkClosed() = 0;
  };

  // `config` and `owner` outlive the writer.
  Writer(asio::io_context& io, const TcpChannelConfig& config, Owner* owner);

  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  enum class Direct {
    kBusy,     // Not idle: nothing written; post the frame.
    kWritten,  // The kernel took all of it.
    kPartly,   // The I/O thread writes the rest, before anything else.
  };

  // Caller's thread: writes `frame` now if `l` is idle, without blocking.
  Direct TryDirect(OutLink* l, const std::shared_ptr<OutFrame>& frame);

  // Caller's thread: hands `frame` to the I/O thread, in order with the
  // caller's other frames to `l`.
  void Post(OutLink* l, std::shared_ptr<OutFrame> frame);

  // Queues `frame` on `l`: dropped once `l` is closed or its final frame is
  // queued; a tensor to a peer that closed its channel aborts the channel.
  void Enqueue(OutLink* l, std::shared_ptr<OutFrame> frame);

  // Puts a direct write's remainder at the front of the queue: its first
  // bytes are on the wire already.
  void TakeRest(OutLink* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->direct_mu);

  // Writes the next queued frame if `l` is ready and idle; otherwise decides
  // whether senders may write to it directly.
  void MaybeWrite(OutLink* l);

  // Closes `l`'s socket; a frame being written stays until its handler runs,
  // queued ones are dropped.
  void Close(OutLink* l);

 private:
  asio::io_context& io_;
  const TcpChannelConfig& config_;
  Owner* const owner_;
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_WRITER_H_
