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
#include "checkpoint/layout.h"
#include "cli/checkpoint_params.h"
#include "cli/job_file.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "job/job_spec.h"
#include "nlohmann/json.hpp"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

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
  cmd->add_option("-o,--output", o.output,
                  "Output .safetensors file (--format hf: a directory)")
      ->required();
  cmd->add_option("--format", o.format,
                  "safetensors (one file, Conveyor's names) or hf (a "
                  "HuggingFace checkpoint directory)");
  cmd->add_option("--job", o.job,
                  "--format hf: the job file that wrote the checkpoint");
  cmd->add_option("--dtype", o.dtype, "--format hf: bf16 (default) or fp32");
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

absl::StatusOr<ExportResult> ExportCheckpointToHf(const std::string& dir,
                                                  std::optional<int64_t> step,
                                                  const std::string& job_file,
                                                  const std::string& output_dir,
                                                  hf::HfDType dtype) {
  ASSIGN_OR_RETURN(const JobSource source, ReadJobSource(job_file, {}));
  ASSIGN_OR_RETURN(const job::ParsedJob parsed, ParseJobSource(source));
  const job::JobSpec& job = parsed.spec;
  ASSIGN_OR_RETURN(const CheckpointParams params,
                   LoadCheckpointParams(dir, step));
  RETURN_IF_ERROR(CheckJobWroteCheckpoint(params, dir, job_file, source.yaml));
  ASSIGN_OR_RETURN(hf::HfLlamaConfig config, hf::HfConfigOfModel(job.model));
  if (!job.model.from_hf.empty()) {
    // Imported: give back what came in where the model does not say.
    absl::StatusOr<hf::HfLlamaConfig> original =
        hf::ReadHfLlamaConfig(job.model.from_hf);
    if (original.ok()) {
      config.architecture = original->architecture;
      config.model_type = original->model_type;
      config.max_position_embeddings = original->max_position_embeddings;
    }
  }
  std::map<std::string, engine::Shape> shapes;
  for (const engine::ParamSpec* p : job.model.Params()) {
    shapes[p->name] = p->shape;
  }
  const CheckpointParamsSource tensors(params);
  RETURN_IF_ERROR(hf::WriteHfCheckpoint(
      output_dir, config,
      [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
        auto it = shapes.find(name);
        if (it == shapes.end()) {
          return absl::InternalError(
              absl::StrCat("the model has no parameter ", name));
        }
        return tensors.Read(name, it->second);
      },
      {.dtype = dtype}));
  ExportResult result;
  result.step = params.manifest.step;
  result.num_stages = params.manifest.num_stages;
  result.job = params.job;
  result.skipped = params.skipped;
  result.num_tensors = static_cast<int64_t>(shapes.size());
  for (const auto& [name, shape] : shapes) {
    result.num_elements += engine::NumElements(shape);
  }
  result.bytes = static_cast<uint64_t>(result.num_elements) *
                 (dtype == hf::HfDType::kBF16 ? 2 : 4);
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
  if (hf_format && o.job.empty()) {
    return absl::InvalidArgumentError(
        "--format hf needs --job JOB.yaml, the job that wrote the checkpoint "
        "(a checkpoint does not record its model)");
  }
  if (!hf_format && !o.job.empty()) {
    return absl::InvalidArgumentError("--job is for --format hf only");
  }
  if (o.dtype != "bf16" && o.dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be bf16 or fp32; got '", o.dtype, "'"));
  }
  absl::StatusOr<ExportResult> exported =
      hf_format ? ExportCheckpointToHf(o.checkpoint_dir, step, o.job, o.output,
                                       o.dtype == "bf16" ? hf::HfDType::kBF16
                                                         : hf::HfDType::kF32)
                : ExportCheckpoint(o.checkpoint_dir, step, o.output);
  ASSIGN_OR_RETURN(ExportResult r, std::move(exported));
  if (o.json) {
    out << nlohmann::json({{"step", r.step},
                           {"job", r.job},
                           {"num_stages", r.num_stages},
                           {"tensors", r.num_tensors},
                           {"parameters", r.num_elements},
                           {"bytes", r.bytes},
                           {"output", o.output},
                           {"skipped", r.skipped}})
               .dump(2)
        << "\n";
    return absl::OkStatus();
  }
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
