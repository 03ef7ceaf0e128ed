#include "cli/generate_command.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/checkpoint_job.h"
#include "cli/checkpoint_params.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/generate.h"
#include "engine/model_spec.h"
#include "hf/checkpoint.h"
#include "hf/model.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kByteVocab = 256;

absl::Status CheckFlags(const GenerateCommandOptions& o) {
  if (o.prompt.has_value() == o.prompt_ids.has_value()) {
    return absl::InvalidArgumentError(
        "give exactly one of --prompt TEXT (a byte-level model) and "
        "--prompt-ids 5,17,42");
  }
  if (o.prompt.has_value() && o.prompt->empty()) {
    return absl::InvalidArgumentError(
        "--prompt is empty: generation starts from at least one token");
  }
  if (o.tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens must be >= 0; got ", o.tokens));
  }
  if (!std::isfinite(o.temperature) || o.temperature < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature must be a finite number >= 0 (0: "
                     "greedy); got ",
                     o.temperature));
  }
  if (o.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--top-k must be >= 0 (0: all tokens, 1: greedy); got ", o.top_k));
  }
  if (o.step < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step must be >= 0; got ", o.step));
  }
  return absl::OkStatus();
}

// Whether `dir` holds a tokenizer Tokenizer::Load reads.
bool HasTokenizer(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() &&
         (fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec) ||
          fs::is_regular_file(fs::path(dir) / "tokenizer.model", ec));
}

// The tokenizer --prompt and the printed tokens go through: --tokenizer,
// else, for a model of `vocab` tokens other than a byte-level one (whose
// bytes are its ids), the one beside the model's HF weights (`hf_dir`: the
// HF source, or the model.from_hf of a checkpoint's job), else none.
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> FindTokenizer(
    const GenerateCommandOptions& o, const std::string& hf_dir, int64_t vocab,
    std::ostream& err) {
  if (!o.tokenizer.empty()) return tokenizer::Tokenizer::Load(o.tokenizer);
  if (o.prompt_ids.has_value() || vocab == kByteVocab ||
      !HasTokenizer(hf_dir)) {
    return std::unique_ptr<tokenizer::Tokenizer>();
  }
  err << "note: tokenizer from " << hf_dir << "\n";
  return tokenizer::Tokenizer::Load(hf_dir);
}

// The prompt's ids: --prompt-ids as given, --prompt through the tokenizer
// (with its BOS first when it has one, as HF's Llama tokenizers add it), or
// as bytes without one. Whether the model takes them is checked once the
// model is known (CheckPromptFitsModel).
absl::StatusOr<std::vector<int64_t>> PromptIds(
    const GenerateCommandOptions& o, const tokenizer::Tokenizer* tokenizer) {
  if (o.prompt_ids.has_value()) return ParsePromptIds(*o.prompt_ids);
  if (tokenizer != nullptr) {
    return tokenizer->Encode(*o.prompt,
                             /*add_bos=*/tokenizer->bos_id().has_value());
  }
  std::vector<int64_t> ids;
  ids.reserve(o.prompt->size());
  for (unsigned char byte : *o.prompt) ids.push_back(byte);
  return ids;
}

// Refuses, before any weight is read, a prompt the model cannot take. A
// model without an embedding first is left to the generator to refuse.
absl::Status CheckPromptFitsModel(const GenerateCommandOptions& o,
                                  const engine::ModelSpec& model,
                                  const tokenizer::Tokenizer* tokenizer,
                                  const std::vector<int64_t>& ids) {
  if (model.layers.empty() ||
      model.layers.front().kind != engine::LayerKind::kEmbedding) {
    return absl::OkStatus();
  }
  const int64_t vocab = model.layers.front().vocab_size;
  if (o.prompt.has_value() && tokenizer == nullptr && vocab != kByteVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt TEXT needs a tokenizer for a vocabulary of ", vocab,
        " tokens (only a byte-level model, vocab_size ", kByteVocab,
        ", takes text without one): give --tokenizer tokenizer.json or "
        "tokenizer.model, or token ids with --prompt-ids"));
  }
  if (tokenizer != nullptr && tokenizer->vocab_size() > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer has ", tokenizer->vocab_size(),
                     " tokens, more than the model's vocabulary of ", vocab,
                     ": it is not this model's tokenizer"));
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.prompt_ids.has_value() ? "--prompt-ids" : "--prompt", ": id ", id,
          " is outside the model's vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// Positions the cache needs: the last token drawn is printed, never fed.
int64_t PositionsNeeded(const std::vector<int64_t>& prompt, int64_t tokens) {
  return static_cast<int64_t>(prompt.size()) + std::max<int64_t>(tokens - 1, 0);
}

absl::Status Generate(const engine::ModelSpec& model,
                      const engine::ParameterSource& weights,
                      const tokenizer::Tokenizer* tokenizer,
                      const std::vector<int64_t>& prompt,
                      const GenerateCommandOptions& o, std::ostream& out) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<engine::Generator> generator,
      engine::Generator::Create(engine::CpuBackend::Get(), model, weights,
                                PositionsNeeded(prompt, o.tokens)));
  ASSIGN_OR_RETURN(
      const std::vector<int64_t> ids,
      generator->Generate(
          prompt, o.tokens,
          {.temperature = o.temperature, .top_k = o.top_k, .seed = o.seed}));
  if (o.prompt.has_value() && tokenizer != nullptr) {
    // A model's vocabulary may be padded past its tokenizer's.
    absl::StatusOr<std::string> text = tokenizer->Decode(ids);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat("the generated tokens do not decode (",
                                       absl::StrJoin(ids, ","),
                                       "): ", text.status().message()));
    }
    out << *text << "\n";
  } else if (o.prompt.has_value()) {
    out << BytesAsText(ids) << "\n";
  } else {
    out << absl::StrJoin(ids, ",") << "\n";
  }
  return absl::OkStatus();
}

absl::Status GenerateFromHf(const GenerateCommandOptions& o, std::ostream& out,
                            std::ostream& err) {
  if (!o.job.empty() || !o.overrides.empty() || o.step != -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job, --set and --step are for a Conveyor checkpoint; ", o.source,
        " is a HuggingFace checkpoint (it holds ", hf::kHfConfigFile, ")"));
  }
  ASSIGN_OR_RETURN(const hf::HfLlamaConfig config,
                   hf::ReadHfLlamaConfig(o.source));
  ASSIGN_OR_RETURN(const std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   FindTokenizer(o, o.source, config.vocab_size, err));
  ASSIGN_OR_RETURN(const std::vector<int64_t> prompt,
                   PromptIds(o, tokenizer.get()));
  const int64_t needed = PositionsNeeded(prompt, o.tokens);
  if (needed > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("a prompt of ", prompt.size(), " tokens and ", o.tokens,
                     " new tokens need ", needed,
                     " positions, more than the checkpoint's "
                     "max_position_embeddings (",
                     config.max_position_embeddings, ")"));
  }
  engine::ModelSpec model;
  model.from_hf = o.source;
  model.from_hf_where.file = (fs::path(o.source) / hf::kHfConfigFile).string();
  model.input_shape = {std::max<int64_t>(needed, 1)};
  RETURN_IF_ERROR(hf::ExpandHfModel(config, &model));
  RETURN_IF_ERROR(CheckPromptFitsModel(o, model, tokenizer.get(), prompt));
  ASSIGN_OR_RETURN(const hf::HfCheckpoint checkpoint,
                   hf::HfCheckpoint::Open(o.source));
  // What validate and the workers refuse (a tensor the config does not
  // explain: another model's file, or a half-converted one), so is this.
  RETURN_IF_ERROR(checkpoint.CheckComplete());
  const hf::HfParameterSource weights(checkpoint);
  return Generate(model, weights, tokenizer.get(), prompt, o, out);
}

absl::Status GenerateFromCheckpoint(const GenerateCommandOptions& o,
                                    std::ostream& out, std::ostream& err) {
  std::optional<int64_t> step;
  if (o.step >= 0) step = o.step;
  ASSIGN_OR_RETURN(const CheckpointParams params,
                   LoadCheckpointParams(o.source, step));
  for (const std::string& reason : params.skipped) {
    err << "note: skipped " << reason << "\n";
  }
  ASSIGN_OR_RETURN(
      const CheckpointJob job,
      ResolveCheckpointJob(params, o.source,
                           {.job_file = o.job, .overrides = o.overrides}));
  for (const std::string& note : job.notes) err << note << "\n";
  const engine::ModelSpec& model = job.parsed.spec.model;
  const int64_t vocab =
      !model.layers.empty() &&
              model.layers.front().kind == engine::LayerKind::kEmbedding
          ? model.layers.front().vocab_size
          : 0;
  ASSIGN_OR_RETURN(const std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   FindTokenizer(o, model.from_hf, vocab, err));
  ASSIGN_OR_RETURN(const std::vector<int64_t> prompt,
                   PromptIds(o, tokenizer.get()));
  RETURN_IF_ERROR(CheckPromptFitsModel(o, model, tokenizer.get(), prompt));
  const CheckpointParamsSource weights(params);
  return Generate(model, weights, tokenizer.get(), prompt, o, out);
}

}  // namespace

CLI::App* AddGenerateCommand(CLI::App& app, GenerateCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a Llama-layout model (a HuggingFace checkpoint "
      "or a Conveyor checkpoint), in process on the CPU");
  cmd->add_option("source", o.source,
                  "A HuggingFace checkpoint directory (with config.json) or "
                  "a job's checkpoint.dir (with step-<N>/ directories)")
      ->required();
  cmd->add_option("--job", o.job,
                  "The job file of a Conveyor checkpoint (default: the job "
                  "its manifest records; only its model must match)");
  cmd->add_option("--set", o.overrides,
                  "Override a value of a Conveyor checkpoint's job: "
                  "key.path=value (the value is YAML; repeatable)");
  cmd->add_option("--step", o.step,
                  "Step of a Conveyor checkpoint (default: the latest "
                  "complete one)");
  cmd->add_option_function<std::string>(
      "--prompt", [&o](const std::string& v) { o.prompt = v; },
      "Prompt text: through the tokenizer (--tokenizer, or the one beside "
      "the model's HF weights), or as bytes for a byte-level model");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "A tokenizer.json, tokenizer.model or a directory holding "
                  "one (default: the one beside the model's HF weights)");
  cmd->add_option_function<std::string>(
      "--prompt-ids", [&o](const std::string& v) { o.prompt_ids = v; },
      "Prompt token ids, comma-separated: 5,17,42");
  cmd->add_option("--tokens", o.tokens, "How many tokens to generate")
      ->required();
  cmd->add_option("--temperature", o.temperature,
                  "Softmax temperature; 0 is greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", o.top_k,
                  "Sample among the k most likely tokens (0: all; 1: greedy)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the sampling")
      ->capture_default_str();
  return cmd;
}

absl::StatusOr<std::vector<int64_t>> ParsePromptIds(absl::string_view text) {
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(
        "--prompt-ids is empty: give comma-separated token ids (5,17,42)");
  }
  std::vector<int64_t> ids;
  int index = 0;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    ++index;
    entry = absl::StripAsciiWhitespace(entry);
    int64_t id = 0;
    if (!absl::SimpleAtoi(entry, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: entry ", index, " ('", entry,
                       "') is not an integer; give comma-separated token ids "
                       "(5,17,42)"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::string BytesAsText(std::span<const int64_t> bytes) {
  std::string text;
  for (int64_t b : bytes) {
    CONVEYOR_CHECK(b >= 0 && b < kByteVocab, "a byte id outside [0, 256)");
    if (b == '\\') {
      text += "\\\\";
    } else if ((b >= 0x20 && b < 0x7f) || b == '\n' || b == '\t') {
      text += static_cast<char>(b);
    } else {
      absl::StrAppendFormat(&text, "\\x%02x", b);
    }
  }
  return text;
}

absl::Status RunGenerateCommand(const GenerateCommandOptions& o,
                                std::ostream& out, std::ostream& err) {
  RETURN_IF_ERROR(CheckFlags(o));
  // --prompt-ids are checked before anything is read.
  if (o.prompt_ids.has_value()) {
    RETURN_IF_ERROR(ParsePromptIds(*o.prompt_ids).status());
  }
  std::error_code ec;
  if (!fs::is_directory(o.source, ec)) {
    return absl::NotFoundError(
        absl::StrCat(o.source, ": no such checkpoint directory"));
  }
  if (fs::exists(fs::path(o.source) / hf::kHfConfigFile, ec)) {
    return GenerateFromHf(o, out, err);
  }
  return GenerateFromCheckpoint(o, out, err);
}

}  // namespace conveyor::cli
