#include "worker/background_task.h"

#include <chrono>
#include <utility>

namespace conveyor::worker {

BackgroundTask::~BackgroundTask() {
  if (thread_.joinable()) thread_.join();
}

absl::Status BackgroundTask::Wait() {
  if (!thread_.joinable()) return absl::OkStatus();
  thread_.join();
  return std::exchange(status_, absl::OkStatus());
}

absl::StatusOr<double> BackgroundTask::Start(
    std::function<absl::Status()> task) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status previous = Wait(); !previous.ok()) return previous;
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  // The join in Wait orders this thread's reads of status_ after the
  // task's write.
  thread_ = std::thread([this, task = std::move(task)] { status_ = task(); });
  return waited;
}

}  // namespace conveyor::worker
