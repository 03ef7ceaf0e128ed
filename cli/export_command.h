// `conveyorctl export CHECKPOINT_DIR [--step N] --output FILE.safetensors`:
// gathers the parameters of one step of a pipelined job's checkpoint into a
// single safetensors file with the global (PyTorch) parameter names,
// loadable by the equivalent PyTorch module or as a job's model.init.from.
// With `--format hf [--job JOB.yaml] [--set K=V] [--dtype bf16|fp32]
// [--tokenizer PATH] [--overwrite] --output DIR` a Llama-layout model
// becomes a HuggingFace checkpoint directory that transformers'
// LlamaForCausalLM.from_pretrained loads (and a job's model.from_hf), with
// the tokenizer files the model was imported with.
//
// Workers write <dir>/step-<N>/stage-<s>.safetensors for every stage, with
// the metadata
//   format: conveyor-stage-v1, job: <id>, stage: <s>, num_stages: <S>,
//   step: <N>
// and the coordinator commits the step by writing its manifest last
// (checkpoint/manifest.h). Export reads complete steps only: one
// whose manifest parses and whose files all have the recorded size and
// CRC-32C. Without --step it takes the newest such step (newer incomplete
// or corrupt steps are skipped with a note); --step N must name a complete
// step. It then checks that every file agrees with the manifest and the
// others (format, job, step, num_stages, its own stage number) and that no
// tensor name appears twice, and writes the parameters, bytes unchanged,
// atomically to the output. The optimizer state the stage files carry for
// resume ("optimizer/<slot>/<parameter>") is left out.
//
// --format hf needs the model: the job the manifest records, or --job, which
// must describe the same model (cli/checkpoint_job.h: keys outside the model,
// such as training.steps, never block). The directory is written beside its
// place and moved there whole (cli/staged_directory.h): a directory that
// already holds an HF checkpoint is refused, or replaced with --overwrite; a
// non-empty directory without one, a file, the checkpoint itself and the
// model's import are never replaced.
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_EXPORT_COMMAND_H_
#define CONVEYOR_CLI_EXPORT_COMMAND_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hf/config.h"

namespace conveyor::cli {

struct ExportCommandOptions {
  std::string checkpoint_dir = {};
  int64_t step = -1;  // -1: the latest complete step.
  std::string output = {};
  // "safetensors" (one file, Conveyor's names) or "hf" (a HuggingFace
  // checkpoint directory: config.json + model.safetensors).
  std::string format = "safetensors";
  // --format hf: the job file that wrote the checkpoint (empty: the job its
  // manifest records), --set overrides of it, the stored dtype ("bf16" or
  // "fp32"), whether an earlier export in the output is replaced, and
  // tokenizer files or directories to copy instead of the import's.
  std::string job = {};
  std::vector<std::string> overrides = {};
  std::string dtype = "bf16";
  bool overwrite = false;
  std::vector<std::string> tokenizer = {};
  // --json: the summary as one JSON object (docs/cli-json.md) instead of a
  // line; -o is the output file here.
  bool json = false;
};

CLI::App* AddExportCommand(CLI::App& app, ExportCommandOptions& options);

struct ExportResult {
  int64_t step = 0;
  int num_stages = 0;
  std::string job;
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
  uint64_t bytes = 0;
  // Why newer steps were passed over when choosing the latest one.
  std::vector<std::string> skipped;
  // --format hf: "note: ..." lines about the job, "warning: ..." lines
  // (tokenizer files that could not be copied), the tokenizer files copied
  // and where from, and whether an earlier export was replaced.
  std::vector<std::string> notes;
  std::vector<std::string> warnings;
  std::vector<std::string> tokenizer_files;
  std::string tokenizer_source;
  bool replaced = false;
};

struct HfExportOptions {
  std::string job_file = {};  // Empty: the job the manifest records.
  std::vector<std::string> overrides = {};
  hf::HfDType dtype = hf::HfDType::kBF16;
  bool overwrite = false;
  // Files or directories (cli/export_tokenizer.h); empty: the files of the
  // directory the model was imported from, if any.
  std::vector<std::string> tokenizer = {};
};

// Writes the parameters of step `step` (nullopt: the newest complete one)
// of the checkpoint in `dir` to `output`. Errors:
//   NotFound            a missing directory, no step-<N> directories, or no
//                       step `step`;
//   FailedPrecondition  `step` has no manifest (incomplete), no step is
//                       complete, or the stage files disagree (metadata
//                       against the manifest or each other, a duplicate
//                       tensor name, a file that is not valid safetensors);
//   DataLoss            `step`'s manifest is unreadable or a stage file is
//                       missing or differs from the manifest's size or
//                       CRC-32C;
//   the errno-derived code when a file cannot be read or the output cannot
//   be written.
absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& dir,
                                              std::optional<int64_t> step,
                                              const std::string& output);

// `conveyorctl export --format hf`: the parameters of step `step` as a
// HuggingFace checkpoint in `output_dir` (hf::WriteHfCheckpoint: HF names,
// config.json for LlamaForCausalLM, or Qwen2ForCausalLM when the blocks
// have q/k/v biases; a model imported from_hf keeps its architecture and
// max_position_embeddings, and its tokenizer files are copied), stored as
// options.dtype. The model is the job's (ResolveCheckpointJob). Errors:
// CheckTokenizerPaths's, LoadCheckpointParams's, ResolveCheckpointJob's;
// InvalidArgument for a job whose model is not of the Llama layout (naming
// the layer); StagedDirectory's for the output (AlreadyExists for an
// earlier export without options.overwrite; FailedPrecondition for what is
// never replaced); WriteHfCheckpoint's.
absl::StatusOr<ExportResult> ExportCheckpointToHf(
    const std::string& dir, std::optional<int64_t> step,
    const std::string& output_dir, const HfExportOptions& options);

// InvalidArgument for a negative --step, or --job, --set, --overwrite or
// --tokenizer without --format hf; otherwise the export's errors.
absl::Status RunExportCommand(const ExportCommandOptions& options,
                              std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_EXPORT_COMMAND_H_
