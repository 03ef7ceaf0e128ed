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
#include "tokenizer/document_files.h"
#include "tokenizer/parallel_encoder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::cli {
namespace {

using Clock = std::chrono::steady_clock;

// --- A Megatron indexed dataset writer. -------------------------------
// A stand-in with the interface of engine/megatron_writer.h (another
// branch), which replaces it at merge. The format, as Megatron-LM's
// megatron/core/datasets/indexed_dataset.py writes it: PREFIX.bin holds
// the ids, little-endian; PREFIX.idx holds "MMIDIDX\0\0", uint64 version 1,
// uint8 dtype code, uint64 sequence count, uint64 document-index count
// (documents + 1), int32 sizes[], int64 byte pointers[], int64 document
// indices [0, 1, ..., n] (one sequence per document).
enum class MegatronDType : uint8_t { kUInt16 = 8, kInt32 = 4 };

class MegatronWriter {
 public:
  static absl::StatusOr<std::unique_ptr<MegatronWriter>> Create(
      const std::string& prefix, MegatronDType dtype) {
    const std::string partial = prefix + ".bin.partial";
    const int fd =
        ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(errno, partial, "open");
    return std::unique_ptr<MegatronWriter>(
        new MegatronWriter(prefix, dtype, fd));
  }

  // Unfinished: the partial file goes.
  ~MegatronWriter() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink((prefix_ + ".bin.partial").c_str());
    }
  }

  absl::Status AddDocument(absl::Span<const int64_t> ids) {
    const int64_t max_id = dtype_ == MegatronDType::kUInt16
                               ? std::numeric_limits<uint16_t>::max()
                               : std::numeric_limits<int32_t>::max();
    if (ids.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a document of ", ids.size(), " tokens: at most 2^31 - 1"));
    }
    const size_t item = dtype_ == MegatronDType::kUInt16 ? 2 : 4;
    size_t at = buffer_.size();
    buffer_.resize(at + ids.size() * item);
    for (int64_t id : ids) {
      if (id < 0 || id > max_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("id ", id, " does not fit the dataset's dtype"));
      }
      if (item == 2) {
        PutU16(buffer_.data() + at, static_cast<uint16_t>(id));
      } else {
        PutU32(buffer_.data() + at, static_cast<uint32_t>(id));
      }
      at += item;
    }
    sizes_.push_back(static_cast<int32_t>(ids.size()));
    if (buffer_.size() >= kBufferBytes) return Flush();
    return absl::OkStatus();
  }

  absl::Status Finish() {
    RETURN_IF_ERROR(Flush());
    const std::string partial = prefix_ + ".bin.partial";
    if (::fsync(fd_) != 0) return ErrnoError(errno, partial, "fsync");
    ::close(fd_);
    fd_ = -1;
    if (::rename(partial.c_str(), (prefix_ + ".bin").c_str()) != 0) {
      return ErrnoError(errno, partial, "rename");
    }
    const size_t item = dtype_ == MegatronDType::kUInt16 ? 2 : 4;
    const uint64_t n = sizes_.size();
    std::string index = std::string("MMIDIDX\0\0", 9);
    index.resize(9 + 8 + 1 + 8 + 8 + n * 4 + n * 8 + (n + 1) * 8);
    char* p = index.data() + 9;
    PutU64(p, 1);
    p[8] = static_cast<char>(dtype_);
    PutU64(p + 9, n);
    PutU64(p + 17, n + 1);
    p += 25;
    for (int32_t size : sizes_) {
      PutU32(p, static_cast<uint32_t>(size));
      p += 4;
    }
    uint64_t pointer = 0;
    for (int32_t size : sizes_) {
      PutU64(p, pointer);
      pointer += static_cast<uint64_t>(size) * item;
      p += 8;
    }
    for (uint64_t i = 0; i <= n; ++i) {
      PutU64(p, i);
      p += 8;
    }
    // The index last: with it in place, the data is whole.
    return WriteFileAtomically(prefix_ + ".idx", index);
  }

 private:
  static constexpr size_t kBufferBytes = size_t{4} << 20;

  MegatronWriter(std::string prefix, MegatronDType dtype, int fd)
      : prefix_(std::move(prefix)), dtype_(dtype), fd_(fd) {}

  absl::Status Flush() {
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n =
          ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(errno, prefix_ + ".bin.partial", "write");
      done += static_cast<size_t>(n);
    }
    buffer_.clear();
    return absl::OkStatus();
  }

  const std::string prefix_;
  const MegatronDType dtype_;
  int fd_;
  std::string buffer_;
  std::vector<int32_t> sizes_;
};
// --- End of the stand-in. ----------------------------------------------

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
                                  ? MegatronDType::kUInt16
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
      o.output, o.output, dtype == MegatronDType::kUInt16 ? "uint16" : "int32",
      *tokenizer->eos_id());
  return absl::OkStatus();
}

}  // namespace conveyor::cli
