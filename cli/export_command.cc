#include "cli/export_command.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "cli/checkpoint_job.h"
#include "cli/checkpoint_params.h"
#include "cli/export_tokenizer.h"
#include "cli/staged_directory.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "nlohmann/json.hpp"

namespace conveyor::cli {

CLI::App* AddExportCommand(CLI::App& app, ExportCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "export",
      "Gather one step of a pipelined job's checkpoint (a stage file per "
      "stage) into one safetensors file with the global parameter names, or "
      "(--format hf) a HuggingFace checkpoint directory with its tokenizer");
  cmd->add_option("checkpoint_dir", o.checkpoint_dir,
                  "The job's checkpoint.dir (holding step-<N>/ directories)")
      ->required();
  cmd->add_option("--step", o.step,
                  "Step to export (default: the latest complete one)");
  cmd->add_option("-o,--output", o.output,
                  "Output .safetensors file (--format hf: a directory)")
      ->required();
  cmd->add_option("--format", o.format,
                  "safetensors (one file, Conveyor's names) or hf (a "
                  "HuggingFace checkpoint directory)");
  cmd->add_option("--job", o.job,
                  "--format hf: the job file that wrote the checkpoint "
                  "(default: the job its manifest records; only its model "
                  "must match)");
  cmd->add_option("--set", o.overrides,
                  "--format hf: override a value of the job: key.path=value "
                  "(the value is YAML; repeatable)");
  cmd->add_option("--dtype", o.dtype, "--format hf: bf16 (default) or fp32");
  cmd->add_flag("--overwrite", o.overwrite,
                "--format hf: replace an earlier HF checkpoint in the output "
                "directory (whole, never half-written)");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "--format hf: a tokenizer file or a directory of them to "
                  "copy into the export (repeatable; default: those of the "
                  "directory the model was imported from)");
  cmd->add_flag("--json", o.json,
                "Print the summary as JSON (step, job, num_stages, tensors, "
                "parameters, bytes, output, skipped); -o is the output file");
  return cmd;
}

absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step,
                                              const std::string& output) {
  ASSIGN_OR_RETURN(const CheckpointParams params,
                   LoadCheckpointParams(dir, step));
  ExportResult result;
  result.step = params.manifest.step;
  result.skipped = params.skipped;
  std::vector<engine::TensorToWrite> tensors;
  for (const auto& [name, stage] : params.owner) {
    const engine::SafetensorsReader& file = params.stages[stage].tensors;
    const engine::TensorInfo& info = *file.Find(name);
    const std::span<const uint8_t> bytes = file.RawBytes(info);
    tensors.push_back({.name = info.name,
                       .dtype = info.dtype,
                       .shape = info.shape,
                       .data = bytes.data(),
                       .bytes = bytes.size()});
    result.num_elements += info.numel();
    result.bytes += bytes.size();
  }
  result.job = params.job;
  result.num_stages = params.manifest.num_stages;
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

absl::StatusOr<ExportResult> ExportCheckpointToHf(
    const std::string& dir, std::optional<int64_t> step,
    const std::string& output_dir, const HfExportOptions& options) {
  // What the user named is checked before the checkpoint is read (and its
  // checksums verified, which takes a while for a large model).
  RETURN_IF_ERROR(CheckTokenizerPaths(options.tokenizer));
  ASSIGN_OR_RETURN(
      StagedDirectory out,
      StagedDirectory::Create(
          output_dir,
          {.overwrite = options.overwrite,
           .markers = {hf::kHfConfigFile, hf::kHfWeightsFile, hf::kHfIndexFile},
           .keep = {{dir, "the checkpoint being exported"}},
           .what = "an HF checkpoint"}));
  ASSIGN_OR_RETURN(const CheckpointParams params,
                   LoadCheckpointParams(dir, step));
  ASSIGN_OR_RETURN(const CheckpointJob job,
                   ResolveCheckpointJob(params, dir,
                                        {.job_file = options.job_file,
                                         .overrides = options.overrides}));
  const engine::ModelSpec& model = job.parsed.spec.model;
  ASSIGN_OR_RETURN(hf::HfLlamaConfig config, hf::HfConfigOfModel(model));
  if (!model.from_hf.empty()) {
    // The original is never replaced by its own export.
    RETURN_IF_ERROR(
        out.Keep(model.from_hf, "the checkpoint the model was imported from"));
    // Imported: give back what came in where the model does not say.
    absl::StatusOr<hf::HfLlamaConfig> original =
        hf::ReadHfLlamaConfig(model.from_hf);
    if (original.ok()) {
      config.architecture = original->architecture;
      config.model_type = original->model_type;
      config.max_position_embeddings = original->max_position_embeddings;
    }
  }
  std::map<std::string, engine::Shape> shapes;
  for (const engine::ParamSpec* p : model.Params()) {
    shapes[p->name] = p->shape;
  }
  const CheckpointParamsSource tensors(params);
  ASSIGN_OR_RETURN(const std::string staging, out.Stage());
  RETURN_IF_ERROR(hf::WriteHfCheckpoint(
      staging, config,
      [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
        auto it = shapes.find(name);
        if (it == shapes.end()) {
          return absl::InternalError(
              absl::StrCat("the model has no parameter ", name));
        }
        return tensors.Read(name, it->second);
      },
      {.dtype = options.dtype}));
  ExportResult result;
  if (!options.tokenizer.empty()) {
    ASSIGN_OR_RETURN(result.tokenizer_files,
                     CopyTokenizerPaths(options.tokenizer, staging));
    result.tokenizer_source = absl::StrJoin(options.tokenizer, ", ");
  } else if (!model.from_hf.empty()) {
    CopiedFiles copied = CopyImportedTokenizerFiles(model.from_hf, staging);
    result.tokenizer_files = std::move(copied.names);
    result.warnings = std::move(copied.warnings);
    result.tokenizer_source = model.from_hf;
  }
  ASSIGN_OR_RETURN(const StagedDirectory::Committed done, out.Commit());
  if (!done.leftover.empty()) {
    result.warnings.push_back(absl::StrCat("warning: ", done.leftover));
  }
  result.replaced = done.replaced;
  result.step = params.manifest.step;
  result.num_stages = params.manifest.num_stages;
  result.job = params.job;
  result.skipped = params.skipped;
  result.notes = job.notes;
  result.num_tensors = static_cast<int64_t>(shapes.size());
  for (const auto& [name, shape] : shapes) {
    result.num_elements += engine::NumElements(shape);
  }
  result.bytes = static_cast<uint64_t>(result.num_elements) *
                 (options.dtype == hf::HfDType::kBF16 ? 2 : 4);
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
  const bool hf_format = o.format == "hf";
  if (!hf_format && o.format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format must be safetensors or hf; got '", o.format, "'"));
  }
  if (!hf_format) {
    for (const auto& [given, flag] : {std::pair{!o.job.empty(), "--job"},
                                      {!o.overrides.empty(), "--set"},
                                      {o.overwrite, "--overwrite"},
                                      {!o.tokenizer.empty(), "--tokenizer"}}) {
      if (given) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag,
            " is for --format hf only (a .safetensors output is one "
            "file, replaced atomically)"));
      }
    }
  }
  if (o.dtype != "bf16" && o.dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be bf16 or fp32; got '", o.dtype, "'"));
  }
  absl::StatusOr<ExportResult> exported =
      hf_format ? ExportCheckpointToHf(
                      o.checkpoint_dir, step, o.output,
                      {.job_file = o.job,
                       .overrides = o.overrides,
                       .dtype = o.dtype == "bf16" ? hf::HfDType::kBF16
                                                  : hf::HfDType::kF32,
                       .overwrite = o.overwrite,
                       .tokenizer = o.tokenizer})
                : ExportCheckpoint(o.checkpoint_dir, step, o.output);
  ASSIGN_OR_RETURN(ExportResult r, std::move(exported));
  if (o.json) {
    nlohmann::json summary = {{"step", r.step},
                              {"job", r.job},
                              {"num_stages", r.num_stages},
                              {"tensors", r.num_tensors},
                              {"parameters", r.num_elements},
                              {"bytes", r.bytes},
                              {"output", o.output},
                              {"skipped", r.skipped}};
    if (hf_format) {
      summary["notes"] = r.notes;
      summary["warnings"] = r.warnings;
      summary["tokenizer_files"] = r.tokenizer_files;
      summary["replaced"] = r.replaced;
    }
    out << summary.dump(2) << "\n";
    return absl::OkStatus();
  }
  for (const std::string& reason : r.skipped) {
    out << "note: skipped " << reason << "\n";
  }
  for (const std::string& line : r.notes) out << line << "\n";
  for (const std::string& line : r.warnings) out << line << "\n";
  out << absl::StrFormat(
      "exported step %d of job %s: %d stage(s), %d tensors, %d parameters "
      "(%.1f MiB) to %s%s\n",
      r.step, r.job, r.num_stages, r.num_tensors, r.num_elements,
      static_cast<double>(r.bytes) / (1 << 20), o.output,
      r.replaced ? " (replacing the export there)" : "");
  if (!r.tokenizer_files.empty()) {
    out << "copied " << absl::StrJoin(r.tokenizer_files, ", ") << " from "
        << r.tokenizer_source << "\n";
  }
  return absl::OkStatus();
}

}  // namespace conveyor::cli
