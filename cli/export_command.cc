#include "cli/export_command.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "checkpoint/stage_file.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

struct LoadedStep {
  std::string job;
  std::vector<checkpoint::StageFile> stages;  // By stage.
};

// Every stage file of `m`'s step, checked against the manifest and against
// stage 0's job, so that a worker that wrote the wrong thing (another step,
// another job) under the right name is caught.
absl::StatusOr<LoadedStep> LoadStep(const std::string& dir,
                                    const checkpoint::CheckpointManifest& m) {
  const std::string step_dir = checkpoint::StepDirPath(dir, m.step);
  LoadedStep loaded;
  checkpoint::StageFileExpectation expect{.step = m.step,
                                          .num_stages = m.num_stages};
  for (const checkpoint::StageFileDigest& digest : m.stages) {  // By stage.
    ASSIGN_OR_RETURN(checkpoint::StageFile file,
                     checkpoint::ReadStageFile(step_dir, digest, expect));
    if (!expect.job.has_value()) expect.job = file.info.job;
    loaded.stages.push_back(std::move(file));
  }
  loaded.job = expect.job.value_or("");
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
                   checkpoint::ListCheckpointSteps(dir));
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
  checkpoint::CheckpointManifest manifest;
  // Checksums are verified: an export is read once and then trusted
  // elsewhere, so a damaged file must stop it here.
  if (step.has_value()) {
    if (!std::binary_search(steps.begin(), steps.end(), *step)) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": no step-", *step, "; steps: ", absl::StrJoin(steps, ", ")));
    }
    ASSIGN_OR_RETURN(manifest, checkpoint::LoadCompleteCheckpoint(
                                   dir, *step, /*verify_checksums=*/true));
  } else {
    // A job that stopped while saving leaves an incomplete newest step; the
    // one before it is still a consistent export.
    absl::StatusOr<checkpoint::LatestCheckpoint> latest =
        checkpoint::FindLatestCompleteCheckpoint(dir,
                                                 /*verify_checksums=*/true);
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
    const engine::SafetensorsReader& file = loaded.stages[s].tensors;
    for (const engine::TensorInfo& info : file.tensors()) {
      // Optimizer state is for resuming a run, not part of the model.
      if (checkpoint::IsOptimizerTensor(info.name)) continue;
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
      {"exported_from", checkpoint::kStageFileFormat}};
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
