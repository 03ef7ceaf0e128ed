// Mailbox: the tensors that reached a rank, filed by tag until a Recv takes
// them. Every channel (in-memory, TCP, NCCL) receives through one, so the
// rules are the same whatever carries the bytes: a tag is filed once (a
// second copy is a broken peer), a Recv waits for its tag or the channel's
// failure, whichever comes first, and a failed channel drops what it holds.
//
// Not thread-safe by itself: the owning channel guards it with the mutex that
// also guards the channel's failure status, so filing a tensor, failing the
// channel and waking a waiting Recv are each one atomic step under that lock:
//
//   absl::MutexLock lock(&mu_);
//   ASSIGN_OR_RETURN(std::optional<engine::Tensor> t,
//                    mailbox_.Await(mu_, status_, tag, timeout));
//   if (!t.has_value()) return TimeoutError(...);
#ifndef CONVEYOR_TRANSPORT_MAILBOX_H_
#define CONVEYOR_TRANSPORT_MAILBOX_H_

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/tensor.h"
#include "transport/channel.h"

namespace conveyor::transport {

// `status` with `context` put in front of its message, same code: a
// transport error says which rank saw it and what it was doing.
absl::Status WithContext(const absl::Status& status, absl::string_view context);

class Mailbox {
 public:
  // `rank` is the owning channel's, for messages.
  explicit Mailbox(int rank) : rank_(rank) {}

  // Files `tensor`, which arrived from rank `from` (the owner's own rank for
  // a send to itself). InternalError naming both when `tag` is already filed.
  absl::Status File(const Tag& tag, engine::Tensor tensor, int from);

  // Waits, with `mu` held, until `tag` is filed or `failure` (the channel's
  // status, guarded by `mu`) is not OK, at most `timeout`. Returns the
  // failure with "rank R waiting for the <tag>" in front; the tensor,
  // removing it; or nullopt when the time ran out, for the channel to say
  // what it knows about the missing tensor (TimeoutError).
  absl::StatusOr<std::optional<engine::Tensor>> Await(
      absl::Mutex& mu, const absl::Status& failure, const Tag& tag,
      std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // DeadlineExceeded "rank R waited N ms for the <tag>", then " (detail)"
  // when `detail` is not empty.
  absl::Status TimeoutError(const Tag& tag, std::chrono::milliseconds timeout,
                            absl::string_view detail = "") const;

  // Drops every tensor: a failed job has no use for them.
  void Clear() { tensors_.clear(); }
  size_t size() const { return tensors_.size(); }

 private:
  const int rank_;
  std::map<Tag, engine::Tensor> tensors_;
};

}  // namespace conveyor::transport

#endif  // CONVEYOR_TRANSPORT_MAILBOX_H_
