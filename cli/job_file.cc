#include "cli/job_file.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/overrides.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"

namespace conveyor::cli {
namespace {

// "file:3:7: path: message" -> "path: message".
absl::string_view WithoutLocation(absl::string_view message,
                                  absl::string_view file) {
  if (!absl::ConsumePrefix(&message, file)) return message;
  while (!message.empty() &&
         (message[0] == ':' ||
          absl::ascii_isdigit(static_cast<unsigned char>(message[0])))) {
    message.remove_prefix(1);
  }
  absl::ConsumePrefix(&message, " ");
  return message;
}

}  // namespace

absl::StatusOr<JobSource> ReadJobSource(
    const std::string& path, absl::Span<const std::string> overrides) {
  JobSource source;
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, engine::kMaxJobFileBytes));
  // Checked here too: `submit` sends the text unparsed.
  RETURN_IF_ERROR(CheckUtf8Text(text, path));
  source.file_name = path;
  if (!overrides.empty()) {
    ASSIGN_OR_RETURN(source.yaml, ApplyOverrides(text, path, overrides,
                                                 engine::kMaxJobFileBytes));
    absl::StrAppend(&source.file_name, " (with --set)");
    source.original_yaml = std::move(text);
    source.original_file_name = path;
  } else {
    source.yaml = std::move(text);
  }
  // The coordinator and workers may run in other directories: relative
  // paths in the job must resolve against the file, wherever it was named
  // from.
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot make the path absolute: ", ec.message()));
  }
  source.base_dir = absolute.lexically_normal().parent_path().string();
  return source;
}

absl::StatusOr<engine::JobSpec> ParseJobSource(const JobSource& source) {
  absl::StatusOr<engine::JobSpec> job =
      engine::ParseJobSpec(source.yaml, source.file_name, source.base_dir);
  if (job.ok() || source.original_yaml.empty()) return job;
  // Positions in the emitted text mean nothing to someone reading the file;
  // an error the overrides did not cause is better shown where it is.
  absl::StatusOr<engine::JobSpec> file = engine::ParseJobSpec(
      source.original_yaml, source.original_file_name, source.base_dir);
  if (!file.ok() &&
      WithoutLocation(file.status().message(), source.original_file_name) ==
          WithoutLocation(job.status().message(), source.file_name)) {
    return file.status();
  }
  return job.status();
}

std::vector<std::string> StepsOverrides(const std::string& path,
                                        absl::Span<const std::string> overrides,
                                        int64_t steps, std::string* note) {
  std::vector<std::string> out(overrides.begin(), overrides.end());
  out.push_back(absl::StrCat("training.steps=", steps));
  absl::StatusOr<JobSource> source = ReadJobSource(path, overrides);
  if (!source.ok()) return out;
  absl::StatusOr<engine::JobSpec> job = ParseJobSource(*source);
  if (!job.ok()) return out;
  const engine::LrSchedule& schedule = job->optimizer.schedule;
  const int64_t total = job->training.steps;
  if (schedule.kind != engine::LrSchedule::Kind::kCosine ||
      schedule.total_steps != 0 || schedule.warmup_steps < steps ||
      total <= 0) {
    return out;
  }
  const int64_t warmup =
      std::min<int64_t>(steps - 1, schedule.warmup_steps * steps / total);
  out.push_back(absl::StrCat("optimizer.schedule.warmup_steps=", warmup));
  *note = absl::StrCat("note: --steps ", steps,
                       ": optimizer.schedule.warmup_steps scaled from ",
                       schedule.warmup_steps, " (of ", total, " steps) to ",
                       warmup, ", so that the cosine schedule still fits\n");
  return out;
}

}  // namespace conveyor::cli
