#include "checkpoint/directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;

// How many reasons "no complete checkpoint" lists.
constexpr size_t kMaxReasons = 5;

}  // namespace

absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(
    const std::string& checkpoint_dir) {
  RETURN_IF_ERROR(CheckDirectory(checkpoint_dir, "checkpoint directory"));
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoint_dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::optional<int64_t> step =
        StepOfDirName(it->path().filename().string());
    if (!step.has_value()) continue;
    std::error_code dir_ec;
    if (it->is_directory(dir_ec)) steps.push_back(*step);
  }
  if (ec) return ErrnoError(ec.value(), checkpoint_dir, "list");
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<LatestCheckpoint> FindLatestCompleteCheckpoint(
    const std::string& checkpoint_dir, bool verify_checksums) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   ListCheckpointSteps(checkpoint_dir));
  LatestCheckpoint latest;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<CheckpointManifest> manifest =
        LoadCompleteCheckpoint(checkpoint_dir, *it, verify_checksums);
    if (manifest.ok()) {
      latest.manifest = *std::move(manifest);
      return latest;
    }
    if (absl::IsDataLoss(manifest.status())) {
      // Committed (the manifest is written last, once every file is
      // durable) and damaged since. Falling back to an older step would
      // silently redo the steps after it and then overwrite this one: the
      // caller must choose, so say which older step is intact.
      std::string older = "no older step is intact";
      for (auto o = std::next(it); o != steps.rend(); ++o) {
        if (LoadCompleteCheckpoint(checkpoint_dir, *o, verify_checksums).ok()) {
          older = absl::StrCat("the newest intact step before it is ",
                               StepDirPath(checkpoint_dir, *o));
          break;
        }
      }
      return absl::DataLossError(
          absl::StrCat(StepDirPath(checkpoint_dir, *it),
                       " is a committed checkpoint that fails its checks (",
                       manifest.status().message(), "); ", older));
    }
    if (!absl::IsFailedPrecondition(manifest.status())) {
      return manifest.status();  // Cannot tell (e.g. PermissionDenied).
    }
    // No manifest: a job that stopped while saving leaves an incomplete
    // newest step, never committed; the one before it is consistent.
    latest.skipped.push_back(std::string(manifest.status().message()));
  }
  if (steps.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        checkpoint_dir, ": no complete checkpoint (no step-<N> directories)"));
  }
  std::vector<std::string> reasons = latest.skipped;
  if (reasons.size() > kMaxReasons) {
    const size_t more = reasons.size() - kMaxReasons;
    reasons.resize(kMaxReasons);
    reasons.push_back(absl::StrCat("and ", more, " more"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(checkpoint_dir,
                   ": no complete checkpoint: ", absl::StrJoin(reasons, "; ")));
}

absl::StatusOr<std::vector<int64_t>> PruneCheckpoints(
    const std::string& checkpoint_dir, int keep_latest) {
  if (keep_latest <= 0) return std::vector<int64_t>{};
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   ListCheckpointSteps(checkpoint_dir));
  // Newest first. Steps newer than the newest complete one are passed over
  // unexamined for removal: a worker may be writing them right now.
  std::vector<int64_t> remove;
  int complete_kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<CheckpointManifest> manifest =
        LoadCompleteCheckpoint(checkpoint_dir, *it, /*verify_checksums=*/false);
    if (manifest.ok()) {
      if (complete_kept < keep_latest) {
        ++complete_kept;
      } else {
        remove.push_back(*it);
      }
      continue;
    }
    if (complete_kept == 0) continue;  // Newer than any complete step.
    const absl::StatusCode code = manifest.status().code();
    if (code == absl::StatusCode::kFailedPrecondition ||
        code == absl::StatusCode::kDataLoss) {
      remove.push_back(*it);  // Left by a crash: never to be completed.
    } else if (code != absl::StatusCode::kNotFound) {  // NotFound: gone.
      return manifest.status();
    }
  }
  // Oldest first, so a failure part way leaves the newer steps.
  std::sort(remove.begin(), remove.end());
  std::vector<int64_t> removed;
  for (int64_t step : remove) {
    const std::string dir = StepDirPath(checkpoint_dir, step);
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) return ErrnoError(ec.value(), dir, "remove");
    removed.push_back(step);
  }
  return removed;
}

absl::Status CheckCheckpointDirWritable(const std::string& checkpoint_dir) {
  auto refuse = [&](const absl::Status& cause) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint.dir ", checkpoint_dir, " cannot be written (",
        cause.message(), "): the job would fail at its first checkpoint"));
  };
  std::error_code ec;
  fs::create_directories(checkpoint_dir, ec);
  if (ec) return refuse(ErrnoError(ec.value(), checkpoint_dir, "mkdir"));
  // Unique per process and call, so concurrent checks never collide.
  static std::atomic<uint64_t> counter{0};
  const std::string probe =
      (fs::path(checkpoint_dir) /
       absl::StrCat(".conveyor-write-probe-", ::getpid(), "-", counter++))
          .string();
  const int fd =
      ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return refuse(ErrnoError(errno, checkpoint_dir, "create a file"));
  const bool written = ::write(fd, "x", 1) == 1 && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!written) return refuse(ErrnoError(err, checkpoint_dir, "write"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> RemoveAllCheckpoints(
    const std::string& checkpoint_dir) {
  absl::StatusOr<std::vector<int64_t>> steps =
      ListCheckpointSteps(checkpoint_dir);
  if (!steps.ok()) {
    if (steps.status().code() == absl::StatusCode::kNotFound) {
      return std::vector<int64_t>{};
    }
    return steps.status();
  }
  std::vector<int64_t> removed;
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    const std::string dir = StepDirPath(checkpoint_dir, *it);
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) return ErrnoError(ec.value(), dir, "remove");
    removed.insert(removed.begin(), *it);
  }
  return removed;
}

}  // namespace conveyor::checkpoint
