#include "cli/export_command.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "engine/stage_file.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

// Far above any pipeline we run, low enough that a corrupt num_stages cannot
// make us probe millions of file names.
constexpr int64_t kMaxStages = 1 << 16;
// How many skipped steps an error about "no complete step" lists.
constexpr size_t kMaxReasons = 5;

struct StepDir {
  int64_t step = 0;
  fs::path path;
};

struct LoadedStep {
  std::string job;
  int num_stages = 0;
  std::vector<engine::SafetensorsReader> stages;  // By stage.
};

// A decimal number of at most 18 digits (so it fits int64), nothing else.
bool ParseIndex(absl::string_view text, int64_t* out) {
  if (text.empty() || text.size() > 18) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// The reader reports a corrupt file as InvalidArgument, which conveyorctl
// would turn into "bad arguments" (exit 2); a bad checkpoint is a state to
// fix, not a flag to change.
absl::Status AsPrecondition(absl::Status status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return status;
  return absl::FailedPreconditionError(status.message());
}

absl::StatusOr<std::vector<StepDir>> ListSteps(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no such checkpoint directory",
                     ec && ec != std::errc::no_such_file_or_directory
                         ? absl::StrCat(" (", ec.message(), ")")
                         : ""));
  }
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": not a directory"));
  }
  std::vector<StepDir> steps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") ||
        !ParseIndex(absl::string_view(name).substr(5), &step)) {
      continue;
    }
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;
    steps.push_back({step, it->path()});
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list: ", ec.message()));
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return steps;
}

// The stage numbers of the stage-<s>.safetensors files in `dir`.
absl::StatusOr<std::set<int64_t>> ListStageFiles(const fs::path& dir) {
  std::set<int64_t> stages;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    constexpr absl::string_view kPrefix = "stage-";
    constexpr absl::string_view kSuffix = ".safetensors";
    if (!absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, kSuffix)) {
      continue;  // Includes the writer's temporaries (".safetensors.tmp-N").
    }
    int64_t stage = 0;
    if (ParseIndex(
            absl::string_view(name).substr(
                kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()),
            &stage)) {
      stages.insert(stage);
    }
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), ": cannot list: ", ec.message()));
  }
  return stages;
}

absl::StatusOr<std::string> Metadata(const engine::SafetensorsReader& file,
                                     absl::string_view key) {
  auto it = file.metadata().find(std::string(key));
  if (it == file.metadata().end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        file.source_name(), ": no '", key,
        "' in the metadata (not a stage file written by a conveyor worker)"));
  }
  return it->second;
}

absl::StatusOr<int64_t> MetadataInt(const engine::SafetensorsReader& file,
                                    absl::string_view key) {
  ASSIGN_OR_RETURN(std::string text, Metadata(file, key));
  int64_t value = 0;
  if (!ParseIndex(text, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat(file.source_name(), ": metadata '", key, "' is '", text,
                     "', not a non-negative integer"));
  }
  return value;
}

// Opens stage `stage` of `step` and checks that its metadata describe it.
// `num_stages` and `job` are those of stage 0, or unset when this is stage 0.
absl::StatusOr<engine::SafetensorsReader> OpenStage(
    const StepDir& step, int64_t stage, std::optional<int64_t> num_stages,
    const std::optional<std::string>& job) {
  const std::string path =
      (step.path / absl::StrCat("stage-", stage, ".safetensors")).string();
  absl::StatusOr<engine::SafetensorsReader> opened =
      engine::SafetensorsReader::Open(path);
  if (!opened.ok()) return AsPrecondition(opened.status());
  engine::SafetensorsReader file = *std::move(opened);
  const std::string& name = file.source_name();
  ASSIGN_OR_RETURN(std::string format, Metadata(file, "format"));
  if (format != engine::kStageFileFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": metadata 'format' is '", format, "', expected '",
                     engine::kStageFileFormat, "'"));
  }
  ASSIGN_OR_RETURN(int64_t file_stage, MetadataInt(file, "stage"));
  if (file_stage != stage) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": metadata says stage ", file_stage, ", the file name ", stage));
  }
  ASSIGN_OR_RETURN(int64_t file_step, MetadataInt(file, "step"));
  if (file_step != step.step) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": metadata says step ", file_step,
                     ", the directory step ", step.step));
  }
  ASSIGN_OR_RETURN(int64_t file_stages, MetadataInt(file, "num_stages"));
  if (file_stages < 1 || file_stages > kMaxStages) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": metadata 'num_stages' is ", file_stages,
                     ", not in [1, ", kMaxStages, "]"));
  }
  if (num_stages.has_value() && file_stages != *num_stages) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": num_stages ", file_stages, " disagrees with ",
                     "stage-0.safetensors (", *num_stages, ")"));
  }
  ASSIGN_OR_RETURN(std::string file_job, Metadata(file, "job"));
  if (job.has_value() && file_job != *job) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": job '", file_job, "' disagrees with ",
                     "stage-0.safetensors (job '", *job, "')"));
  }
  return file;
}

absl::StatusOr<LoadedStep> LoadStep(const StepDir& step) {
  const std::string label = step.path.filename().string();
  ASSIGN_OR_RETURN(std::set<int64_t> present, ListStageFiles(step.path));
  if (!present.contains(0)) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": stage-0.safetensors is missing",
                     present.empty() ? " (no stage files at all)" : ""));
  }
  LoadedStep loaded;
  ASSIGN_OR_RETURN(engine::SafetensorsReader first,
                   OpenStage(step, 0, std::nullopt, std::nullopt));
  ASSIGN_OR_RETURN(loaded.job, Metadata(first, "job"));
  ASSIGN_OR_RETURN(int64_t num_stages, MetadataInt(first, "num_stages"));
  loaded.num_stages = static_cast<int>(num_stages);
  std::vector<std::string> missing;
  for (int64_t s = 1; s < num_stages; ++s) {
    if (!present.contains(s)) missing.push_back(absl::StrCat("stage-", s));
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": missing ", absl::StrJoin(missing, ", "), " of ",
                     num_stages, " stages (a worker did not finish writing?)"));
  }
  if (*present.rbegin() >= num_stages) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": stage-", *present.rbegin(),
                     ".safetensors exists but num_stages is ", num_stages));
  }
  loaded.stages.push_back(std::move(first));
  for (int64_t s = 1; s < num_stages; ++s) {
    ASSIGN_OR_RETURN(engine::SafetensorsReader file,
                     OpenStage(step, s, num_stages, loaded.job));
    loaded.stages.push_back(std::move(file));
  }
  return loaded;
}

std::string StepList(const std::vector<StepDir>& steps) {
  std::vector<int64_t> numbers;
  for (const StepDir& s : steps) numbers.push_back(s.step);
  std::sort(numbers.begin(), numbers.end());
  return absl::StrJoin(numbers, ", ");
}

}  // namespace

CLI::App* AddExportCommand(CLI::App& app, ExportCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Gather one step of a pipelined job's checkpoint (a stage file per "
      "stage) into one safetensors file with the global parameter names");
  cmd->add_option("checkpoint_dir", o.checkpoint_dir,
                  "The job's checkpoint.dir (holding step-<N>/ directories)")
      ->required();
  cmd->add_option("--step", o.step,
                  "Step to export (default: the latest complete one)");
  cmd->add_option("-o,--output", o.output, "Output .safetensors file")
      ->required();
  return cmd;
}

absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step,
                                              const std::string& output) {
  ASSIGN_OR_RETURN(std::vector<StepDir> steps, ListSteps(dir));
  if (steps.empty()) {
    std::string hint;
    std::error_code ec;
    if (fs::exists(fs::path(dir) / "params.safetensors", ec)) {
      hint =
          "; its params.safetensors (from run --in-process) is already one "
          "file";
    }
    return absl::NotFoundError(
        absl::StrCat(dir, ": no step-<N> directories", hint));
  }
  ExportResult result;
  std::optional<LoadedStep> loaded;
  if (step.has_value()) {
    auto it = std::find_if(steps.begin(), steps.end(),
                           [&](const StepDir& s) { return s.step == *step; });
    if (it == steps.end()) {
      return absl::NotFoundError(
          absl::StrCat(dir, ": no step-", *step, "; steps: ", StepList(steps)));
    }
    ASSIGN_OR_RETURN(loaded, LoadStep(*it));
    result.step = it->step;
  } else {
    // A job that stopped while writing leaves an incomplete last step; the
    // one before it is still a consistent export.
    for (const StepDir& s : steps) {
      absl::StatusOr<LoadedStep> attempt = LoadStep(s);
      if (attempt.ok()) {
        loaded = *std::move(attempt);
        result.step = s.step;
        break;
      }
      result.skipped.push_back(std::string(attempt.status().message()));
    }
    if (!loaded.has_value()) {
      std::vector<std::string> reasons = result.skipped;
      if (reasons.size() > kMaxReasons) {
        reasons.resize(kMaxReasons);
        reasons.push_back("...");
      }
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": no complete step: ", absl::StrJoin(reasons, "; ")));
    }
  }

  std::vector<engine::TensorToWrite> tensors;
  std::map<std::string, int> owner;  // Tensor name -> stage.
  for (int s = 0; s < loaded->num_stages; ++s) {
    const engine::SafetensorsReader& file = loaded->stages[s];
    for (const engine::TensorInfo& info : file.tensors()) {
      auto [it, inserted] = owner.emplace(info.name, s);
      if (!inserted) {
        return absl::FailedPreconditionError(
            absl::StrCat(dir, ": step-", result.step, ": tensor '", info.name,
                         "' is in both stage-", it->second, " and stage-", s));
      }
      const std::span<const uint8_t> bytes = file.RawBytes(info);
      tensors.push_back({.name = info.name,
                         .dtype = info.dtype,
                         .shape = info.shape,
                         .data = bytes.data(),
                         .bytes = bytes.size()});
      result.num_elements += info.numel();
      result.bytes += bytes.size();
    }
  }
  result.job = loaded->job;
  result.num_stages = loaded->num_stages;
  result.num_tensors = static_cast<int64_t>(tensors.size());
  // "format: pt" is what Hugging Face's loaders look for in a file of
  // PyTorch tensors; the rest says where the file came from.
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"job", result.job},
      {"step", absl::StrCat(result.step)},
      {"num_stages", absl::StrCat(result.num_stages)},
      {"exported_from", engine::kStageFileFormat}};
  RETURN_IF_ERROR(engine::WriteSafetensors(output, tensors, metadata));
  return result;
}

absl::Status RunExportCommand(const ExportCommandOptions& o,
                              std::ostream& out) {
  if (o.step < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step must be >= 0; got ", o.step));
  }
  std::optional<int64_t> step;
  if (o.step >= 0) step = o.step;
  ASSIGN_OR_RETURN(ExportResult r,
                   ExportCheckpoint(o.checkpoint_dir, step, o.output));
  for (const std::string& reason : r.skipped) {
    out << "note: skipped " << reason << "\n";
  }
  out << absl::StrFormat(
      "exported step %d of job %s: %d stage(s), %d tensors, %d parameters "
      "(%.1f MiB) to %s\n",
      r.step, r.job, r.num_stages, r.num_tensors, r.num_elements,
      static_cast<double>(r.bytes) / (1 << 20), o.output);
  return absl::OkStatus();
}

}  // namespace conveyor::cli
