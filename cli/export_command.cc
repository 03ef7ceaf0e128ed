#include "cli/export_command.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/checkpoint_manifest.h"
#include "engine/safetensors.h"
#include "engine/stage_file.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

struct LoadedStep {
  std::string job;
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

// Opens the stage file `digest` of `manifest`'s step and checks that its
// metadata describe it. `job` is stage 0's, or unset when this is stage 0.
// The manifest vouches for the bytes; this catches a worker that wrote the
// wrong thing (another step, another job) under the right name.
absl::StatusOr<engine::SafetensorsReader> OpenStage(
    const std::string& step_dir, const engine::CheckpointManifest& manifest,
    const engine::StageFileDigest& digest,
    const std::optional<std::string>& job) {
  const std::string path = (fs::path(step_dir) / digest.file).string();
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
  if (file_stage != digest.stage) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": metadata says stage ", file_stage,
                     ", the file name ", digest.stage));
  }
  ASSIGN_OR_RETURN(int64_t file_step, MetadataInt(file, "step"));
  if (file_step != manifest.step) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": metadata says step ", file_step,
                     ", the directory step ", manifest.step));
  }
  ASSIGN_OR_RETURN(int64_t file_stages, MetadataInt(file, "num_stages"));
  if (file_stages != manifest.num_stages) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": num_stages ", file_stages, " disagrees with the manifest (",
        manifest.num_stages, ")"));
  }
  ASSIGN_OR_RETURN(std::string file_job, Metadata(file, "job"));
  if (job.has_value() && file_job != *job) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": job '", file_job, "' disagrees with ",
                     "stage-0.safetensors (job '", *job, "')"));
  }
  return file;
}

absl::StatusOr<LoadedStep> LoadStep(const std::string& dir,
                                    const engine::CheckpointManifest& m) {
  const std::string step_dir = engine::StepDirPath(dir, m.step);
  LoadedStep loaded;
  std::optional<std::string> job;
  for (const engine::StageFileDigest& digest : m.stages) {  // By stage.
    ASSIGN_OR_RETURN(engine::SafetensorsReader file,
                     OpenStage(step_dir, m, digest, job));
    if (!job.has_value()) {
      ASSIGN_OR_RETURN(job, Metadata(file, "job"));
    }
    loaded.stages.push_back(std::move(file));
  }
  loaded.job = job.value_or("");
  return loaded;
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
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   engine::ListCheckpointSteps(dir));
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
  engine::CheckpointManifest manifest;
  // Checksums are verified: an export is read once and then trusted
  // elsewhere, so a damaged file must stop it here.
  if (step.has_value()) {
    if (!std::binary_search(steps.begin(), steps.end(), *step)) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": no step-", *step, "; steps: ", absl::StrJoin(steps, ", ")));
    }
    ASSIGN_OR_RETURN(manifest, engine::LoadCompleteCheckpoint(
                                   dir, *step, /*verify_checksums=*/true));
  } else {
    // A job that stopped while saving leaves an incomplete newest step; the
    // one before it is still a consistent export.
    absl::StatusOr<engine::LatestCheckpoint> latest =
        engine::FindLatestCompleteCheckpoint(dir, /*verify_checksums=*/true);
    if (absl::IsDataLoss(latest.status())) {
      return absl::DataLossError(absl::StrCat(
          latest.status().message(), "; export an older step with --step N"));
    }
    RETURN_IF_ERROR(latest.status());
    manifest = std::move(latest->manifest);
    result.skipped = std::move(latest->skipped);
  }
  result.step = manifest.step;
  ASSIGN_OR_RETURN(LoadedStep loaded, LoadStep(dir, manifest));

  std::vector<engine::TensorToWrite> tensors;
  std::map<std::string, int> owner;  // Tensor name -> stage.
  for (int s = 0; s < manifest.num_stages; ++s) {
    const engine::SafetensorsReader& file = loaded.stages[s];
    for (const engine::TensorInfo& info : file.tensors()) {
      // Optimizer state is for resuming a run, not part of the model.
      if (absl::StartsWith(info.name, engine::kOptimizerTensorPrefix)) {
        continue;
      }
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
  result.job = loaded.job;
  result.num_stages = manifest.num_stages;
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
