#include "tokenizer/document_files.h"

#include <unistd.h>

#include <cerrno>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace conveyor::tokenizer {
namespace {

constexpr size_t kReadChunk = size_t{4} << 20;

bool IsBlank(absl::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<DocumentFormat> DocumentFormatFor(absl::string_view name,
                                                 absl::string_view path) {
  if (name == "text") return DocumentFormat::kText;
  if (name == "jsonl") return DocumentFormat::kJsonLines;
  if (name == "auto") {
    return absl::EndsWith(path, ".jsonl") || absl::EndsWith(path, ".json")
               ? DocumentFormat::kJsonLines
               : DocumentFormat::kText;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("format \"", name, "\" is not one of auto, text, jsonl"));
}

DocumentFileReader::DocumentFileReader(std::string path, DocumentFormat format,
                                       size_t batch_bytes, RegularFile file)
    : path_(std::move(path)),
      format_(format),
      batch_bytes_(batch_bytes),
      file_(std::move(file)) {}

absl::StatusOr<std::unique_ptr<DocumentFileReader>> DocumentFileReader::Open(
    const std::string& path, DocumentFormat format, size_t batch_bytes) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<DocumentFileReader>(new DocumentFileReader(
      path, format, batch_bytes == 0 ? 1 : batch_bytes, *std::move(file)));
}

absl::StatusOr<bool> DocumentFileReader::Fill(size_t bytes) {
  const size_t old_size = buffer_.size();
  buffer_.resize(old_size + bytes);
  ssize_t n;
  do {
    n = ::read(file_.fd.get(), buffer_.data() + old_size, bytes);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    const int error = errno;
    buffer_.resize(old_size);
    return ErrnoError(error, path_, "read");
  }
  buffer_.resize(old_size + static_cast<size_t>(n));
  return n > 0;
}

absl::StatusOr<std::optional<DocumentBatch>> DocumentFileReader::Next() {
  if (at_end_) return std::nullopt;
  DocumentBatch batch;
  batch.source = path_;
  if (format_ == DocumentFormat::kText) {
    // The whole file is one document (read to its end, whatever size it
    // had when opened).
    buffer_.reserve(file_.size + 1);
    while (true) {
      absl::StatusOr<bool> more = Fill(kReadChunk);
      if (!more.ok()) return more.status();
      if (!*more) break;
    }
    at_end_ = true;
    batch.bytes = buffer_.size();
    batch.records.push_back(std::move(buffer_));
    buffer_.clear();
    return batch;
  }
  batch.first_line = next_line_;
  size_t start = 0;  // Of the first line not yet in the batch.
  while (true) {
    const size_t newline = buffer_.find('\n', start);
    if (newline != std::string::npos) {
      batch.records.emplace_back(buffer_, start, newline - start);
      batch.bytes += newline + 1 - start;
      start = newline + 1;
      ++next_line_;
      if (batch.bytes >= batch_bytes_) break;
      continue;
    }
    buffer_.erase(0, start);
    start = 0;
    absl::StatusOr<bool> more = Fill(kReadChunk);
    if (!more.ok()) return more.status();
    if (!*more) {
      at_end_ = true;
      if (!buffer_.empty()) {  // A last line without a newline.
        batch.bytes += buffer_.size();
        batch.records.push_back(std::move(buffer_));
        buffer_.clear();
        ++next_line_;
      }
      break;
    }
  }
  buffer_.erase(0, start);
  if (batch.records.empty()) return std::nullopt;
  return batch;
}

absl::StatusOr<bool> TextOfJsonLine(std::string* line, absl::string_view field,
                                    const std::string& source,
                                    int64_t line_number) {
  if (IsBlank(*line)) return false;
  const auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line_number, ": ", what));
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(*line);
  } catch (const nlohmann::json::exception& e) {
    return fail(absl::StrCat("not valid JSON: ", e.what()));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(source, ":", line_number, ": ", e.what()));
  }
  if (!json.is_object()) {
    return fail(absl::StrCat("a JSON ", json.type_name(),
                             ", not an object with a \"", field, "\" field"));
  }
  const auto it = json.find(std::string(field));
  if (it == json.end()) {
    return fail(absl::StrCat("no \"", field,
                             "\" field (--field names the one that holds "
                             "the text)"));
  }
  if (!it->is_string()) {
    return fail(absl::StrCat("\"", field, "\" is a ", it->type_name(),
                             ", not a string"));
  }
  *line = std::move(it->get_ref<std::string&>());
  return true;
}

}  // namespace conveyor::tokenizer
