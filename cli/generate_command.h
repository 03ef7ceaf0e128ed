// `conveyorctl generate SOURCE [--job JOB.yaml] [--set K=V] [--step N]
//      (--prompt TEXT [--tokenizer PATH] | --prompt-ids 5,17,42) --tokens N
//      [--temperature T] [--top-k K] [--seed S]`:
// continues a prompt with a Llama-layout model, in process on the CPU, with
// a KV cache (engine/generate.h).
//
// SOURCE is either
//   - a HuggingFace checkpoint directory (it holds config.json; hf/model.h):
//     the model and the weights are the checkpoint's; or
//   - a Conveyor checkpoint directory (step-<N>/ directories;
//     cli/checkpoint_params.h): the model is that of the job its manifest
//     records, or of --job, which must describe the same model (keys
//     outside the model, such as training.steps, never block;
//     cli/checkpoint_job.h), either with --set overrides; --step picks a
//     step (default: the newest complete one).
//
// --prompt TEXT goes through a tokenizer (--tokenizer FILE|DIR, else, for a
// model whose vocabulary is not the 256 bytes, the tokenizer.json or
// tokenizer.model beside its HF weights: the HF source, or the job's
// model.from_hf), its BOS first when it has one, and
// the new tokens are decoded to text. Without a tokenizer, --prompt is for
// byte-level models (vocab_size 256): the prompt's bytes are the ids, and
// the new bytes are printed as text, with "\\" for a backslash and "\xNN"
// for every byte outside printable ASCII but newline and tab. --prompt-ids
// takes comma-separated ids and prints the new ids the same way. Only the new
// tokens are printed, then a newline; notes go to the error stream. Sampling:
// softmax(logits / temperature) over the top_k most likely tokens, from a
// seeded, portable random stream; --temperature 0 or
// --top-k 1 is greedy.
// Thread-compatible: the options are the caller's.
#ifndef CONVEYOR_CLI_GENERATE_COMMAND_H_
#define CONVEYOR_CLI_GENERATE_COMMAND_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::cli {

struct GenerateCommandOptions {
  std::string source = {};
  // A Conveyor checkpoint only: the job file (empty: the job the manifest
  // records) and --set overrides of it.
  std::string job = {};
  std::vector<std::string> overrides = {};
  int64_t step = -1;  // -1: the newest complete step.
  std::optional<std::string> prompt = std::nullopt;
  std::optional<std::string> prompt_ids = std::nullopt;
  // The tokenizer of --prompt and of the printed text (tokenizer/tokenizer.h);
  // empty: the one beside the model's HF weights, if any.
  std::string tokenizer = {};
  int64_t tokens = 0;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
};

CLI::App* AddGenerateCommand(CLI::App& app, GenerateCommandOptions& options);

// "5, 17,42" -> {5, 17, 42}. InvalidArgument naming the entry for an empty
// list or an entry that is not a decimal integer.
absl::StatusOr<std::vector<int64_t>> ParsePromptIds(absl::string_view text);

// Byte ids (each in [0, 256)) as text: printable ASCII, newline and tab as
// they are, "\\" for a backslash, "\xNN" (lowercase hex) for the rest.
std::string BytesAsText(std::span<const int64_t> bytes);

// Runs the command, writing the new tokens to `out` and notes to `err`.
// Errors:
//   InvalidArgument     bad flags (not exactly one of --prompt and
//                       --prompt-ids, malformed or out-of-vocabulary ids,
//                       --prompt for a vocabulary other than 256, negative
//                       --tokens or --top-k, a negative or non-finite
//                       --temperature, --step < 0, --job, --set or --step
//                       with an HF checkpoint), a bad job file, a model not
//                       of the Llama layout, or more positions than an HF
//                       checkpoint's max_position_embeddings;
//   the errors of reading the checkpoint (cli/checkpoint_params.h,
//   hf/checkpoint.h), of finding its job (ResolveCheckpointJob,
//   cli/checkpoint_job.h: FailedPrecondition for a job of another model)
//   and of the generator (engine/generate.h).
absl::Status RunGenerateCommand(const GenerateCommandOptions& options,
                                std::ostream& out, std::ostream& err);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_GENERATE_COMMAND_H_
