// Reader: the receive side of a TcpChannel. It accepts the connections
// peers open to send to this rank, judges their handshake (the secret
// first, before anything that would tell a stranger about the job), and
// reads their frames: tensors go to the channel's mailbox, message frames
// to its inbox, an abort frame fails the channel with the peer's reason, a
// goodbye marks the peer as closed. A connection that fails the handshake
// is logged and counted, never an abort (strangers must not be able to
// stop a job); a malformed frame or a lost connection from a connected
// peer aborts the channel.
//
// Threads: the channel's I/O thread only, and so are the Owner's methods
// it calls (Fail, Observe and Deliver may be called from anywhere), except
// rejected(), which any thread may call.
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_READER_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_READER_H_

#include <asio.hpp>  // io_context, ip::tcp, steady_timer
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"
#include "transport/channel.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/internal/channel_owner.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport::tcp_internal {

class Reader {
 public:
  // What the reader needs from the channel that owns it.
  class Owner : public ChannelOwner {
   public:
    // Counts a failure the channel observed itself.
    virtual void Observe(DataPlaneObserver::Error error) = 0;
    // Files a received tensor: the channel's status once it failed, Internal
    // for a duplicate tag.
    virtual absl::Status Deliver(const Tag& tag, engine::Tensor tensor,
                                 int from) = 0;
    // A message frame from `from`.
    virtual void OnMessage(int from, std::string message) = 0;
    // `rank` closed its channel (sent a goodbye).
    virtual void OnGoodbye(int rank) = 0;
    // Whether the channel is closing (its destructor runs).
    virtual bool Closing() const = 0;
  };

  // `config`, `backend` (which receives the tensors) and `owner` outlive the
  // reader.
  Reader(asio::io_context& io, const TcpChannelConfig& config,
         engine::Backend* backend, Owner* owner);

  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Before the I/O thread starts: binds and listens on `endpoint`, and sets
  // `*port` to the port it listens on. The error of the step that failed.
  asio::error_code Listen(const asio::ip::tcp::endpoint& endpoint,
                          uint16_t* port);

  // Accepts connections until CloseAll.
  void StartAccept();

  // True while a connection from `rank` is open.
  bool OpenFrom(int rank) const;

  // Stops accepting and closes every connection.
  void CloseAll();

  // Connections refused at the handshake since the reader was made. Any
  // thread.
  int64_t rejected() const { return rejected_.load(); }

 private:
  // A connection a peer opened to send to this rank. Shared by its pending
  // handlers, so it can be dropped from in_ while one is outstanding.
  struct InLink {
    InLink(asio::ip::tcp::socket s, asio::io_context& io, uint64_t id)
        : socket(std::move(s)), timer(io), id(id) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer timer;  // Handshake deadline.
    const uint64_t id;
    std::string remote;
    int rank = -1;  // Set once the handshake is accepted.
    bool closed = false;
    bool said_goodbye = false;
    HelloBytes hello{};
    HelloAckBytes ack{};
    FrameHeaderBytes header_bytes{};
    FrameHeader header;
    engine::Tensor tensor;
    std::string message;
  };

  // Accept errors such as EMFILE are transient; retry after this.
  static constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

  // Rejected connections logged per process: 5 lines per 10 s at most.
  static constexpr int kRejectionLogBurst = 5;
  static constexpr std::chrono::seconds kRejectionLogPeriod{10};

  // The kernel zero-fills a fresh receive buffer one page fault at a time as
  // the payload is read into it; for a big tensor that costs about as much as
  // the copy itself (64 MiB: 16k faults). Asking for transparent huge pages
  // cuts that to one fault per 2 MiB, which took 64 MiB transfers from ~45% to
  // ~75% of raw socket speed. Only for buffers large enough that malloc gives
  // them a mapping of their own (glibc: over 32 MiB), so the hint never
  // touches memory shared with other allocations. Best effort: errors (THP
  // disabled, old kernel) are ignored.
  static constexpr uint64_t kHugePageHintBytes = uint64_t{32} << 20;
  static void HintHugePages(void* data, uint64_t bytes);

  void StartHandshake(const std::shared_ptr<InLink>& link);

  // The secret is checked before anything that would tell a stranger about
  // the job.
  HelloResult Judge(const Hello& hello) const;

  // A connection that failed the handshake: logged and counted, never an
  // abort (strangers must not be able to stop a job).
  void Reject(const std::shared_ptr<InLink>& link, absl::string_view why,
              bool close = true);

  void ReadHeader(const std::shared_ptr<InLink>& link);

  void OnHeader(const std::shared_ptr<InLink>& link);

  void OnTensor(const std::shared_ptr<InLink>& link);

  void BadFrame(const std::shared_ptr<InLink>& link,
                const absl::Status& status);

  void InLinkEnded(const std::shared_ptr<InLink>& link,
                   const asio::error_code& ec);

  void CloseInLink(const std::shared_ptr<InLink>& link);

  asio::io_context& io_;
  const TcpChannelConfig& config_;
  engine::Backend* const backend_;
  Owner* const owner_;
  std::atomic<int64_t> rejected_{0};

  // I/O thread only (set up before the thread starts).
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::map<uint64_t, std::shared_ptr<InLink>> in_;
  uint64_t next_id_ = 0;
  std::vector<bool> in_connected_;  // By rank: accepted a connection from it.
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_READER_H_
