#include "cli/tokenize_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/file.h"
#include "common/little_endian.h"
#include "common/status_macros.h"
#include "engine/megatron_writer.h"
#include "tokenizer/document_files.h"
#include "tokenizer/parallel_encoder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::cli {
namespace {

using Clock = std::chrono::steady_clock;

using engine::MegatronDType;
using engine::MegatronWriter;

std::string Megabytes(uint64_t bytes) {
  return absl::StrFormat("%.1f MB", static_cast<double>(bytes) / 1e6);
}

std::string ClockTime(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600
             ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
             : absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// The progress bar: redrawn in place at most ten times a second.
class Progress {
 public:
  Progress(bool enabled, uint64_t total_bytes, std::ostream& err)
      : enabled_(enabled), total_(total_bytes), err_(err) {}

  void Update(uint64_t bytes, int64_t documents, int64_t tokens) {
    if (!enabled_) return;
    const Clock::time_point now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double fraction =
        total_ == 0 ? 1.0 : static_cast<double>(bytes) / total_;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    const double rate = seconds > 0 ? bytes / seconds : 0;
    err_ << absl::StrFormat(
                "\r%3d%% [%s%s] %s / %s  %d docs  %.2f M tokens/s  ETA %s",
                static_cast<int>(fraction * 100), std::string(filled, '#'),
                std::string(kWidth - filled, ' '), Megabytes(bytes),
                Megabytes(total_), documents,
                seconds > 0 ? tokens / seconds / 1e6 : 0.0,
                rate > 0 ? ClockTime((total_ - bytes) / rate)
                         : std::string("?"))
         << "\033[K" << std::flush;
  }

  void Clear() {
    if (enabled_ && last_ != Clock::time_point())
      err_ << "\r\033[K" << std::flush;
  }

 private:
  const bool enabled_;
  const uint64_t total_;
  std::ostream& err_;
  const Clock::time_point start_ = Clock::now();
  Clock::time_point last_;
};

absl::Status CheckOptions(const TokenizeCommandOptions& o) {
  if (o.tokenizer.empty()) {
    return absl::InvalidArgumentError(
        "--tokenizer is required: a tokenizer.json, a tokenizer.model, or "
        "an HF directory holding one");
  }
  if (o.inputs.empty()) {
    return absl::InvalidArgumentError("no INPUT files to tokenize");
  }
  if (o.output.empty()) {
    return absl::InvalidArgumentError(
        "-o PREFIX is required (writes PREFIX.bin and PREFIX.idx)");
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads is ", o.threads, "; 0 (every core) or more"));
  }
  if (o.field.empty()) return absl::InvalidArgumentError("--field is empty");
  return absl::OkStatus();
}

// The directory PREFIX goes in exists and is writable, and PREFIX.bin and
// PREFIX.idx are not there unless they may be replaced.
absl::Status CheckOutput(const std::string& prefix, bool overwrite) {
  const size_t slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : prefix.substr(0, slash);
  RETURN_IF_ERROR(CheckDirectory(dir, "output directory"));
  if (::access(dir.c_str(), W_OK) != 0) {
    return ErrnoError(errno, dir, "output directory not writable");
  }
  for (const char* suffix : {".bin", ".idx"}) {
    const std::string path = prefix + suffix;
    if (!overwrite && ::access(path.c_str(), F_OK) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(path, " exists; --overwrite replaces it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize text or JSON-lines files into a Megatron dataset "
      "(PREFIX.bin, PREFIX.idx), one document per file or line, each ended "
      "by the tokenizer's EOD");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "A tokenizer.json, a tokenizer.model, or an HF directory "
                  "holding one")
      ->required();
  cmd->add_option("inputs", o.inputs,
                  "Text files (one document each) or JSON-lines files (one "
                  "document per line)")
      ->required();
  cmd->add_option("-o,--output", o.output,
                  "PREFIX of the dataset: writes PREFIX.bin and PREFIX.idx")
      ->required();
  cmd->add_option("--format", o.format,
                  "auto (JSON lines for .jsonl and .json, else text), text, "
                  "or jsonl")
      ->check(CLI::IsMember({"auto", "text", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--field", o.field, "The JSON field that holds the text")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads,
                  "Threads that tokenize (0: every core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--overwrite", o.overwrite,
                "Replace PREFIX.bin and PREFIX.idx if they exist");
  return cmd;
}

absl::Status RunTokenizeCommand(const TokenizeCommandOptions& o, bool progress,
                                std::ostream& out, std::ostream& err) {
  RETURN_IF_ERROR(CheckOptions(o));
  // Every input is checked before anything is tokenized: a typo in the
  // last of a hundred files fails now, not after an hour. (Each is opened
  // again when its turn comes: thousands of inputs must not hold as many
  // descriptors.)
  std::vector<tokenizer::DocumentFormat> formats;
  uint64_t total_bytes = 0;
  for (const std::string& input : o.inputs) {
    ASSIGN_OR_RETURN(const tokenizer::DocumentFormat format,
                     tokenizer::DocumentFormatFor(o.format, input));
    ASSIGN_OR_RETURN(const RegularFile file, OpenRegularFile(input));
    total_bytes += file.size;
    formats.push_back(format);
  }
  RETURN_IF_ERROR(CheckOutput(o.output, o.overwrite));
  ASSIGN_OR_RETURN(const std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                   tokenizer::Tokenizer::Load(o.tokenizer));
  const MegatronDType dtype = tokenizer->vocab_size() <= 65536
                                  ? MegatronDType::kUint16
                                  : MegatronDType::kInt32;
  ASSIGN_OR_RETURN(std::unique_ptr<MegatronWriter> writer,
                   MegatronWriter::Create(o.output, dtype));

  tokenizer::ParallelEncoder::Options options;
  options.threads = o.threads > 0
                        ? o.threads
                        : std::max(1u, std::thread::hardware_concurrency());
  Progress bar(progress, total_bytes, err);
  uint64_t bytes = 0;
  int64_t documents = 0;
  int64_t empty = 0;
  int64_t tokens = 0;
  const Clock::time_point start = Clock::now();
  const auto sink = [&](tokenizer::EncodedBatch& batch) -> absl::Status {
    size_t offset = 0;
    for (int64_t length : batch.lengths) {
      RETURN_IF_ERROR(writer->AddDocument(
          absl::MakeConstSpan(batch.ids).subspan(offset, length)));
      offset += length;
    }
    bytes += batch.bytes;
    documents += static_cast<int64_t>(batch.lengths.size());
    empty += batch.empty_documents;
    tokens += static_cast<int64_t>(batch.ids.size());
    bar.Update(bytes, documents, tokens);
    return absl::OkStatus();
  };
  // Records with line numbers are JSON lines; a text file's record is the
  // text itself.
  const std::string field = o.field;
  const auto prepare = [field](std::string* record, const std::string& source,
                               int64_t line) -> absl::StatusOr<bool> {
    if (line == 0) return true;
    return tokenizer::TextOfJsonLine(record, field, source, line);
  };
  ASSIGN_OR_RETURN(auto encoder, tokenizer::ParallelEncoder::Create(
                                     *tokenizer, options, prepare, sink));
  absl::Status status;
  for (size_t i = 0; i < o.inputs.size() && status.ok(); ++i) {
    absl::StatusOr<std::unique_ptr<tokenizer::DocumentFileReader>> reader =
        tokenizer::DocumentFileReader::Open(o.inputs[i], formats[i]);
    if (!reader.ok()) status = reader.status();
    while (status.ok()) {
      absl::StatusOr<std::optional<tokenizer::DocumentBatch>> batch =
          (*reader)->Next();
      if (!batch.ok()) {
        status = batch.status();
      } else if (!batch->has_value()) {
        break;
      } else {
        status = encoder->Submit(**std::move(batch));
      }
    }
  }
  if (status.ok()) status = encoder->Finish();
  encoder.reset();
  if (status.ok()) status = writer->Finish();
  bar.Clear();
  RETURN_IF_ERROR(status);
  const double seconds = std::max(
      1e-9, std::chrono::duration<double>(Clock::now() - start).count());
  out << absl::StrFormat(
      "tokenized %d documents (%s%s) into %d tokens in %.1f s: %.1f MB/s, "
      "%.2f M tokens/s on %d threads; wrote %s.bin and %s.idx (%s, EOD %d)\n",
      documents, Megabytes(bytes),
      empty > 0 ? absl::StrCat(", ", empty, " empty left out") : "", tokens,
      seconds, bytes / seconds / 1e6, tokens / seconds / 1e6, options.threads,
      o.output, o.output, dtype == MegatronDType::kUint16 ? "uint16" : "int32",
      *tokenizer->eos_id());
  return absl::OkStatus();
}

}  // namespace conveyor::cli
