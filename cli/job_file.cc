#include "cli/job_file.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/overrides.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/yaml_path.h"
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

// The integer at `keys` into `*value`, left as it is when absent. False
// when the value there is not an integer.
bool IntegerAt(const YAML::Node& doc, std::initializer_list<const char*> keys,
               int64_t* value) {
  const std::optional<std::string> text = YamlScalarAt(doc, keys);
  return !text.has_value() || absl::SimpleAtoi(*text, value);
}

}  // namespace

absl::StatusOr<JobSource> ReadJobSource(const std::string& path,
                                        absl::Span<const std::string> overrides,
                                        int64_t steps, std::string* note) {
  JobSource source;
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, job::kMaxJobFileBytes));
  // Checked here too: `submit` sends the text unparsed.
  RETURN_IF_ERROR(CheckUtf8Text(text, path));
  source.file_name = path;
  if (!overrides.empty() || steps > 0) {
    DeriveOverrides derive;
    if (steps > 0) {
      derive = [steps, note](const YAML::Node& doc) {
        std::string line;
        std::vector<std::string> specs = StepsOverrides(doc, steps, &line);
        if (note != nullptr) *note += line;
        return specs;
      };
    }
    ASSIGN_OR_RETURN(
        source.yaml,
        ApplyOverrides(text, path, overrides, job::kMaxJobFileBytes, derive));
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

absl::StatusOr<JobSource> JobSourceFromText(
    std::string text, const std::string& name, const std::string& base_dir,
    absl::Span<const std::string> overrides, const DeriveOverrides& derive) {
  if (text.size() > static_cast<size_t>(job::kMaxJobFileBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", text.size(), " bytes, over the ",
                     job::kMaxJobFileBytes, "-byte limit of a job file"));
  }
  RETURN_IF_ERROR(CheckUtf8Text(text, name));
  JobSource source;
  source.file_name = name;
  source.base_dir = base_dir;
  if (overrides.empty() && derive == nullptr) {
    source.yaml = std::move(text);
    return source;
  }
  ASSIGN_OR_RETURN(source.yaml, ApplyOverrides(text, name, overrides,
                                               job::kMaxJobFileBytes, derive));
  if (!overrides.empty()) absl::StrAppend(&source.file_name, " (with --set)");
  source.original_yaml = std::move(text);
  source.original_file_name = name;
  return source;
}

absl::StatusOr<job::ParsedJob> ParseJobSource(const JobSource& source) {
  absl::StatusOr<job::ParsedJob> job =
      job::ParseJob(source.yaml, source.file_name, source.base_dir);
  if (job.ok() || source.original_yaml.empty()) return job;
  // Positions in the emitted text mean nothing to someone reading the file;
  // an error the overrides did not cause is better shown where it is.
  absl::StatusOr<job::JobSpec> file = job::ParseJobSpec(
      source.original_yaml, source.original_file_name, source.base_dir);
  if (!file.ok() &&
      WithoutLocation(file.status().message(), source.original_file_name) ==
          WithoutLocation(job.status().message(), source.file_name)) {
    return file.status();
  }
  return job.status();
}

std::vector<std::string> StepsOverrides(const YAML::Node& doc, int64_t steps,
                                        std::string* note) {
  std::vector<std::string> out = {absl::StrCat("training.steps=", steps)};
  const std::optional<std::string> kind =
      YamlScalarAt(doc, {"optimizer", "schedule", "kind"});
  int64_t total = 1;  // training.steps' default.
  int64_t warmup = 0, span = 0;
  if (!kind.has_value() || *kind != "cosine" ||
      !IntegerAt(doc, {"training", "steps"}, &total) ||
      !IntegerAt(doc, {"optimizer", "schedule", "warmup_steps"}, &warmup) ||
      !IntegerAt(doc, {"optimizer", "schedule", "total_steps"}, &span) ||
      span != 0 || warmup < steps || total <= 0) {
    return out;
  }
  const int64_t scaled = std::min<int64_t>(steps - 1, warmup * steps / total);
  out.push_back(absl::StrCat("optimizer.schedule.warmup_steps=", scaled));
  *note = absl::StrCat("note: --steps ", steps,
                       ": optimizer.schedule.warmup_steps scaled from ", warmup,
                       " (of ", total, " steps) to ", scaled,
                       ", so that the cosine schedule still fits\n");
  return out;
}

}  // namespace conveyor::cli
