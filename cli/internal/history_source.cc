#include "cli/internal/history_source.h"

#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/coordinator_flags.h"
#include "cli/metrics_history.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::cli::plot_internal {

absl::StatusOr<HistorySource> LocateHistory(const PlotCommandOptions& o,
                                            std::ostream& err) {
  const std::string& arg = o.source;
  struct stat st;
  if (::stat(arg.c_str(), &st) == 0) {
    // A directory named like a file is taken as the file, which then fails
    // as "not a regular file" rather than reading something unexpected.
    if (S_ISDIR(st.st_mode) && !absl::EndsWith(arg, ".jsonl")) {
      return HistorySource{
          .path =
              (std::filesystem::path(arg) / kMetricsHistoryFileName).string(),
          .title = arg,
          .job = std::nullopt,
          .directory = true};
    }
    return HistorySource{
        .path = arg, .title = arg, .job = std::nullopt, .directory = false};
  }
  if (errno != ENOENT && errno != ENOTDIR)
    return ErrnoError(errno, arg, "stat");
  if (arg.find('/') != std::string::npos || absl::EndsWith(arg, ".jsonl")) {
    return absl::NotFoundError(
        absl::StrCat(arg, ": no such file or directory"));
  }

  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                   ConnectToCoordinator(o, err));
  absl::StatusOr<v1::Job> job = client->GetJob(arg);
  if (!job.ok()) {
    // The argument may as well be a mistyped path: say both.
    return absl::Status(
        job.status().code(),
        absl::StrCat(arg,
                     " is not a file or directory here, nor a job the "
                     "coordinator at ",
                     client->address(),
                     " can tell about: ", job.status().message()));
  }
  std::string title = job->id();
  if (!job->name().empty()) absl::StrAppend(&title, " (", job->name(), ")");
  if (job->checkpoint_dir().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(title,
                     " has no checkpoint.dir, and the coordinator keeps a "
                     "job's metrics.jsonl only there; set checkpoint.dir in "
                     "the job to record its history"));
  }
  return HistorySource{.path = (std::filesystem::path(job->checkpoint_dir()) /
                                kMetricsHistoryFileName)
                                   .string(),
                       .title = std::move(title),
                       .job = *std::move(job),
                       .directory = false};
}

absl::Status ExplainReadError(const HistorySource& source,
                              const absl::Status& status) {
  if (source.job.has_value()) {
    const v1::Job& job = *source.job;
    std::string where = "the coordinator's checkpoint.dir for it";
    if (std::filesystem::path(job.checkpoint_dir()).is_relative()) {
      absl::StrAppend(&where,
                      ", relative to the coordinator's working directory");
    }
    std::string hint = job.steps_done() == 0
                           ? " The job has not completed a step yet."
                           : " Run plot where that directory is (or on a "
                             "copy of the file: conveyorctl plot "
                             "FILE.jsonl).";
    return absl::Status(
        status.code(),
        absl::StrCat(source.title, "'s history is ", source.path, " (", where,
                     "), which cannot be read on this machine: ",
                     status.message(), ".", hint));
  }
  if (source.directory && absl::IsNotFound(status)) {
    return absl::NotFoundError(absl::StrCat(
        status.message(), " (the coordinator writes ", kMetricsHistoryFileName,
        " in a job's checkpoint.dir as its steps complete; is this a "
        "checkpoint directory?)"));
  }
  return status;
}

}  // namespace conveyor::cli::plot_internal
