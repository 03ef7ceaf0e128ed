#include "transport/mailbox.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace conveyor::transport {

absl::Status WithContext(const absl::Status& status,
                         absl::string_view context) {
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

absl::Status Mailbox::File(const Tag& tag, engine::Tensor tensor, int from) {
  if (!tensors_.emplace(tag, std::move(tensor)).second) {
    return absl::InternalError(
        absl::StrCat("rank ", rank_, " received the ", ToString(tag),
                     " twice (again from rank ", from, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<engine::Tensor>> Mailbox::Await(
    absl::Mutex& mu, const absl::Status& failure, const Tag& tag,
    std::chrono::milliseconds timeout) {
  auto ready = [&] { return !failure.ok() || tensors_.contains(tag); };
  mu.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(timeout));
  if (!failure.ok()) {
    return WithContext(
        failure,
        absl::StrCat("rank ", rank_, " waiting for the ", ToString(tag)));
  }
  auto node = tensors_.extract(tag);
  if (node.empty()) return std::nullopt;
  return std::optional<engine::Tensor>(std::move(node.mapped()));
}

absl::Status Mailbox::TimeoutError(const Tag& tag,
                                   std::chrono::milliseconds timeout,
                                   absl::string_view detail) const {
  return absl::DeadlineExceededError(
      absl::StrCat("rank ", rank_, " waited ", timeout.count(), " ms for the ",
                   ToString(tag), detail.empty() ? "" : " (", detail,
                   detail.empty() ? "" : ")"));
}

}  // namespace conveyor::transport
