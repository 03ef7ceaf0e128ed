#include "transport/tcp/internal/message_inbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace conveyor::transport::tcp_internal {

MessageInbox::MessageInbox(int rank, std::function<void()> schedule_flush)
    : rank_(rank), schedule_flush_(std::move(schedule_flush)) {}

void MessageInbox::Add(int from, std::string message) {
  absl::MutexLock lock(&handler_mu_);
  if (handler_failure_.ok()) {
    pending_messages_.emplace_back(from, std::move(message));
  }
}

void MessageInbox::Fail(const absl::Status& status) {
  absl::MutexLock lock(&handler_mu_);
  handler_failure_ = status;
}

absl::StatusOr<std::string> MessageInbox::Take(
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
      absl::StrCat("rank ", rank_, " waited ", timeout.count(),
                   " ms for a message from rank ", from));
}

void MessageInbox::SetHandler(TcpChannel::MessageHandler* handler) {
  absl::MutexLock lock(&handler_mu_);
  handler_ = handler;
  if (handler == nullptr) return;
  // Deliver on the I/O thread, like everything after, so callbacks never
  // run concurrently.
  schedule_flush_();
}

void MessageInbox::Flush() {
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

}  // namespace conveyor::transport::tcp_internal
