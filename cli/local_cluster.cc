#include "cli/local_cluster.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "proto/protocol.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kReadyPollInterval = absl::Milliseconds(20);
constexpr absl::Duration kWorkersPollInterval = absl::Milliseconds(100);
constexpr int kLogTailLines = 20;

bool IsExecutable(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

BinarySearch BinarySearch::FromEnvironment() {
  BinarySearch search;
  search.bin_dir = Getenv(kBinDirEnv);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) search.self_dir = self.parent_path().string();
  search.path = Getenv("PATH");
  return search;
}

absl::StatusOr<std::string> FindDaemonBinary(absl::string_view name,
                                             const BinarySearch& search) {
  if (!search.bin_dir.empty()) {
    const fs::path candidate = fs::path(search.bin_dir) / std::string(name);
    if (IsExecutable(candidate)) return candidate.string();
    return absl::NotFoundError(absl::StrCat(name, ": no executable at ",
                                            candidate.string(), " ($",
                                            kBinDirEnv, ")"));
  }
  std::vector<std::string> looked;
  if (!search.self_dir.empty()) {
    const fs::path candidate = fs::path(search.self_dir) / std::string(name);
    if (IsExecutable(candidate)) return candidate.string();
    looked.push_back(search.self_dir);
  }
  for (absl::string_view dir :
       absl::StrSplit(search.path, ':', absl::SkipEmpty())) {
    const fs::path candidate = fs::path(std::string(dir)) / std::string(name);
    if (IsExecutable(candidate)) return candidate.string();
  }
  looked.push_back("$PATH");
  return absl::NotFoundError(absl::StrCat(
      "cannot find ", name, " (looked in ", absl::StrJoin(looked, " and "),
      "); build it (it is put next to conveyorctl) or set $", kBinDirEnv,
      " to its directory"));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    LocalClusterOptions options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a local cluster needs at least one worker; got ",
                     options.num_workers));
  }
  std::string tmp = Getenv("TMPDIR");
  if (tmp.empty()) tmp = "/tmp";
  std::string pattern = (fs::path(tmp) / "conveyorctl-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return ErrnoError(errno, pattern, "mkdtemp");
  }
  std::unique_ptr<LocalCluster> cluster(
      new LocalCluster(std::move(options), std::move(pattern)));
  // On error the destructor stops whatever started and keeps the logs.
  RETURN_IF_ERROR(cluster->StartCoordinator());
  RETURN_IF_ERROR(cluster->StartWorkers());
  return cluster;
}

LocalCluster::~LocalCluster() { Stop(); }

absl::Status LocalCluster::StartCoordinator() {
  const std::string ready_file = (fs::path(dir_) / "coordinator.addr").string();
  std::vector<std::string> argv = {
      options_.coordinator_binary,
      "--listen",
      "127.0.0.1:0",
      "--ready-file",
      ready_file,
      "--heartbeat-timeout",
      absl::StrCat(options_.heartbeat_timeout_seconds)};
  if (options_.metrics) {
    argv.insert(argv.end(), {"--metrics-address", "127.0.0.1:0"});
  }
  ASSIGN_OR_RETURN(
      coordinator_,
      Subprocess::Spawn(argv, (fs::path(dir_) / "coordinator.log").string()));
  const absl::Time deadline = absl::Now() + options_.ready_timeout;
  while (true) {
    // The coordinator writes the file whole (a rename), ending in '\n'; a
    // file without it is not ours to trust yet.
    if (absl::StatusOr<std::string> text = ReadFile(ready_file, 4096);
        text.ok() && !text->empty() && text->back() == '\n') {
      // The first line; a second one says where metrics are served.
      std::vector<absl::string_view> lines =
          absl::StrSplit(*text, '\n', absl::SkipEmpty());
      address_ = std::string(absl::StripAsciiWhitespace(lines.front()));
      if (lines.size() > 1 && absl::ConsumePrefix(&lines.back(), "metrics ")) {
        metrics_address_ = std::string(lines.back());
      }
      if (address_.empty() || address_.find(':') == std::string::npos) {
        return absl::FailedPreconditionError(
            absl::StrCat(kCoordinatorBinary, " wrote '", address_, "' to ",
                         ready_file, "; expected host:port"));
      }
      return absl::OkStatus();
    }
    if (std::optional<std::string> how = coordinator_->Poll()) {
      return absl::FailedPreconditionError(DescribeExit(
          *coordinator_,
          absl::StrCat(*how, " before writing its address to ", ready_file)));
    }
    if (Interrupted()) {
      return absl::CancelledError("interrupted while the coordinator started");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          kCoordinatorBinary, " did not write its address to ", ready_file,
          " within ", absl::FormatDuration(options_.ready_timeout),
          "; the end of its log (", coordinator_->log_path(), "):\n",
          TailFile(coordinator_->log_path(), kLogTailLines)));
    }
    absl::SleepFor(kReadyPollInterval);
  }
}

absl::Status LocalCluster::StartWorkers() {
  for (int i = 0; i < options_.num_workers; ++i) {
    std::vector<std::string> argv = {
        options_.worker_binary,   "--coordinator", address_,
        "--data-address",         "127.0.0.1:0",   "--name",
        absl::StrCat("local-", i)};
    if (options_.metrics) {
      argv.insert(argv.end(), {"--metrics-address", "127.0.0.1:0"});
    }
    const std::vector<std::string>& devices = options_.worker_devices;
    if (!devices.empty()) {
      argv.insert(argv.end(),
                  {"--devices", devices.size() == 1 ? devices[0] : devices[i]});
    }
    if (i < static_cast<int>(options_.worker_cpu_cores.size())) {
      argv.insert(argv.end(), {"--cpu-cores", options_.worker_cpu_cores[i]});
    }
    ASSIGN_OR_RETURN(
        std::unique_ptr<Subprocess> worker,
        Subprocess::Spawn(
            argv,
            (fs::path(dir_) / absl::StrCat("worker-", i, ".log")).string()));
    workers_.push_back(std::move(worker));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForWorkers(CoordinatorClient& client) {
  const absl::Time deadline = absl::Now() + options_.workers_timeout;
  std::string seen = "none";
  while (true) {
    RETURN_IF_ERROR(CheckDaemons());
    if (Interrupted()) {
      return absl::CancelledError("interrupted while the workers registered");
    }
    absl::StatusOr<std::vector<v1::Worker>> workers = client.ListWorkers();
    if (workers.ok()) {
      int idle = 0;
      std::vector<std::string> states;
      for (const v1::Worker& w : *workers) {
        if (w.state() == v1::IDLE) ++idle;
        states.push_back(
            absl::StrCat(w.name(), " ", proto::WorkerStateName(w.state())));
      }
      if (idle >= options_.num_workers) return absl::OkStatus();
      if (!states.empty()) seen = absl::StrJoin(states, ", ");
    } else {
      seen = absl::StrCat("ListWorkers failed: ", workers.status().message());
    }
    if (absl::Now() >= deadline) {
      std::string tails;
      for (const auto& w : workers_) {
        absl::StrAppend(&tails, "\nthe end of ", w->log_path(), ":\n",
                        TailFile(w->log_path(), 5));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "fewer than ", options_.num_workers, " workers were IDLE after ",
          absl::FormatDuration(options_.workers_timeout), " (seen: ", seen, ")",
          tails));
    }
    absl::SleepFor(kWorkersPollInterval);
  }
}

absl::Status LocalCluster::CheckDaemons() {
  if (coordinator_ != nullptr) {
    if (std::optional<std::string> how = coordinator_->Poll()) {
      return absl::FailedPreconditionError(DescribeExit(*coordinator_, *how));
    }
  }
  for (const auto& worker : workers_) {
    if (std::optional<std::string> how = worker->Poll()) {
      return absl::FailedPreconditionError(DescribeExit(*worker, *how));
    }
  }
  return absl::OkStatus();
}

void LocalCluster::Stop() {
  std::vector<Subprocess*> all;
  for (const auto& worker : workers_) all.push_back(worker.get());
  if (coordinator_ != nullptr) all.push_back(coordinator_.get());
  for (Subprocess* daemon : all) {
    if (!daemon->Poll().has_value()) daemon->Signal(SIGTERM);
  }
  // One deadline for all: they stop in parallel.
  const absl::Time deadline = absl::Now() + options_.stop_timeout;
  for (Subprocess* daemon : all) {
    if (!daemon->WaitFor(
            std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
      daemon->Signal(SIGKILL);
      daemon->WaitFor(absl::InfiniteDuration());
    }
  }
}

void LocalCluster::RemoveLogs() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<std::string> LocalCluster::LogPaths() const {
  std::vector<std::string> paths;
  if (coordinator_ != nullptr) paths.push_back(coordinator_->log_path());
  for (const auto& worker : workers_) paths.push_back(worker->log_path());
  return paths;
}

std::string LocalCluster::DescribeExit(Subprocess& daemon,
                                       absl::string_view how) {
  return absl::StrCat(daemon.name(), " (pid ", daemon.pid(), ") ", how,
                      "; the end of its log (", daemon.log_path(), "):\n",
                      TailFile(daemon.log_path(), kLogTailLines));
}

}  // namespace conveyor::cli
