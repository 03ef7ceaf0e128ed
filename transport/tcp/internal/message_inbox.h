// MessageInbox: the control messages a TcpChannel received and has not yet
// handed out, and the one place they leave from: TakeMessage takes them
// one at a time (by sender), or a MessageHandler gets them as they come,
// followed by the channel's failure, once. Messages that arrive after the
// failure are dropped: nothing more comes after OnChannelFailed.
//
// Thread-safe. Flush (and so every handler callback) runs on one thread,
// the channel's I/O thread, so callbacks never run concurrently; the lock is
// held while a callback runs, so SetHandler(nullptr) returns only once none
// runs any more.
#ifndef CONVEYOR_TRANSPORT_TCP_INTERNAL_MESSAGE_INBOX_H_
#define CONVEYOR_TRANSPORT_TCP_INTERNAL_MESSAGE_INBOX_H_

#include <chrono>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/tcp/tcp_channel.h"

namespace conveyor::transport::tcp_internal {

class MessageInbox {
 public:
  // `rank` is the own rank, for error messages. `schedule_flush` arranges
  // for Flush to run on the delivering thread; SetHandler calls it when a
  // handler is set.
  MessageInbox(int rank, std::function<void()> schedule_flush);

  MessageInbox(const MessageInbox&) = delete;
  MessageInbox& operator=(const MessageInbox&) = delete;

  // Files a message from `from`, unless the channel failed already.
  void Add(int from, std::string message) ABSL_LOCKS_EXCLUDED(handler_mu_);

  // Records the channel's failure: Take returns it once nothing from the
  // rank waits, and the handler hears it after every earlier message.
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(handler_mu_);

  // Takes the first message from `from` not yet handed out, waiting at most
  // `timeout`. FailedPrecondition while a handler is set; DeadlineExceeded
  // after `timeout`; the failure once the channel failed.
  absl::StatusOr<std::string> Take(int from, std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(handler_mu_);

  // Starts delivering to `handler` (first what arrived before, then a
  // failure that happened before) by scheduling a Flush; nullptr stops, and
  // returns only once no callback runs any more.
  void SetHandler(TcpChannel::MessageHandler* handler)
      ABSL_LOCKS_EXCLUDED(handler_mu_);

  // On the delivering thread: hands what is pending to the handler, if any.
  void Flush() ABSL_LOCKS_EXCLUDED(handler_mu_);

 private:
  const int rank_;
  const std::function<void()> schedule_flush_;

  // Held while a message callback runs, so SetHandler(nullptr) waits for
  // it. Never taken together with the channel's mu_.
  absl::Mutex handler_mu_;
  TcpChannel::MessageHandler* handler_ ABSL_GUARDED_BY(handler_mu_) = nullptr;
  std::deque<std::pair<int, std::string>> pending_messages_
      ABSL_GUARDED_BY(handler_mu_);
  absl::Status handler_failure_ ABSL_GUARDED_BY(handler_mu_);
  bool failure_delivered_ ABSL_GUARDED_BY(handler_mu_) = false;
};

}  // namespace conveyor::transport::tcp_internal

#endif  // CONVEYOR_TRANSPORT_TCP_INTERNAL_MESSAGE_INBOX_H_
