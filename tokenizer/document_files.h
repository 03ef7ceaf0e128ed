// The documents of the files `conveyorctl tokenize` reads, in batches for
// the ParallelEncoder: a text file is one document; a JSON-lines file has
// one document per line, the string in a field of its object (blank lines
// are skipped). The format is named, or guessed from the file name: .jsonl
// and .json are JSON lines, anything else text.
//
// Thread-safety: a reader is for one thread; TextOfJsonLine is stateless.
#ifndef CONVEYOR_TOKENIZER_DOCUMENT_FILES_H_
#define CONVEYOR_TOKENIZER_DOCUMENT_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file.h"
#include "tokenizer/parallel_encoder.h"

namespace conveyor::tokenizer {

enum class DocumentFormat { kText, kJsonLines };

// "text", "jsonl", or "auto" (by the name of `path`). InvalidArgument for
// another name, listing the three.
absl::StatusOr<DocumentFormat> DocumentFormatFor(absl::string_view name,
                                                 absl::string_view path);

class DocumentFileReader {
 public:
  // Opens `path`: the errno-derived code naming it when it cannot be
  // opened, InvalidArgument when it is not a regular file (a directory, a
  // FIFO). A JSON-lines file is cut into batches of about `batch_bytes`.
  static absl::StatusOr<std::unique_ptr<DocumentFileReader>> Open(
      const std::string& path, DocumentFormat format,
      size_t batch_bytes = size_t{1} << 20);

  // The next batch, or nullopt after the last. Read errors name the file.
  absl::StatusOr<std::optional<DocumentBatch>> Next();

  uint64_t size() const { return file_.size; }

 private:
  DocumentFileReader(std::string path, DocumentFormat format,
                     size_t batch_bytes, RegularFile file);
  // Reads up to `bytes` more into buffer_; false at the end of the file.
  absl::StatusOr<bool> Fill(size_t bytes);

  const std::string path_;
  const DocumentFormat format_;
  const size_t batch_bytes_;
  RegularFile file_;
  std::string buffer_;  // Read and not yet handed out.
  bool at_end_ = false;
  int64_t next_line_ = 1;
};

// A ParallelEncoder::Prepare for JSON lines: replaces *line with the
// string in its `field`; false for a blank line. InvalidArgument
// "<source>:<line>: ..." for a line that is not JSON, not an object, has no
// such field, or a field that is not a string.
absl::StatusOr<bool> TextOfJsonLine(std::string* line, absl::string_view field,
                                    const std::string& source,
                                    int64_t line_number);

}  // namespace conveyor::tokenizer

#endif  // CONVEYOR_TOKENIZER_DOCUMENT_FILES_H_
