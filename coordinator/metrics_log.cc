#include "coordinator/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace conveyor::coordinator {

std::string MetricsLogLine(const v1::StepSummary& step, int64_t unix_ms,
                           int restarts) {
  nlohmann::ordered_json j = {
      {"step", step.step()}, {"time_unix_ms", unix_ms}, {"restarts", restarts}};
  if (step.has_loss()) j["loss"] = step.loss();
  j["learning_rate"] = step.learning_rate();
  j["step_seconds"] = step.seconds();
  j["samples_per_second"] = step.samples_per_second();
  j["tokens_per_second"] = step.tokens_per_second();
  j["bubble_fraction"] = step.bubble_fraction();
  j["receive_wait_fraction"] = step.receive_wait_fraction();
  j["grad_norm"] = step.grad_norm();
  // Absent, not 0, where a device's peak is unknown: 0 would read as idle.
  if (step.mfu() > 0) j["mfu"] = step.mfu();
  if (step.tflops_per_device() > 0) {
    j["tflops_per_device"] = step.tflops_per_device();
  }
  if (step.peak_memory_reserved_bytes() > 0) {
    j["peak_memory_allocated_bytes"] = step.peak_memory_allocated_bytes();
    j["peak_memory_reserved_bytes"] = step.peak_memory_reserved_bytes();
    if (step.memory_capacity_bytes() > 0) {
      j["memory_capacity_bytes"] = step.memory_capacity_bytes();
    }
  }
  if (step.has_eval()) {
    j["eval_loss"] = step.eval_loss();
    j["eval_perplexity"] = step.eval_perplexity();
  }
  return j.dump() + "\n";
}

absl::Status AppendMetricsLog(const std::string& checkpoint_dir,
                              const std::string& line, bool start_over) {
  const std::string path =
      (std::filesystem::path(checkpoint_dir) / kMetricsLogFileName).string();
  // O_APPEND: one write() per line lands whole at the end, even if a
  // second coordinator (a mistake) appended too. O_NONBLOCK: a FIFO put
  // there must not hang the coordinator.
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK |
                            (start_over ? O_TRUNC : 0),
                        0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  const ssize_t written = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError(
        absl::StrCat("cannot append to ", path, ": ",
                     written < 0 ? std::strerror(write_errno) : "short write"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::coordinator
