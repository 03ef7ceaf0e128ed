// MegatronWriter: writes a Megatron indexed data set (PREFIX.bin and
// PREFIX.idx, engine/megatron_format.h) that Megatron-LM, Megatron-Core and
// this project's `megatron` data source all read: one sequence per document,
// pointers back to back from 0, the document index 0, 1, ..., S.
//
//   ASSIGN_OR_RETURN(auto writer,
//                    MegatronWriter::Create("out/corpus",
//                    MegatronDType::kUint16));
//   for (...) RETURN_IF_ERROR(writer->AddDocument(ids));
//   RETURN_IF_ERROR(writer->Finish());
//
// Atomic: the tokens and the index go to temporary files beside PREFIX and
// are renamed into place by Finish, .bin first and .idx last, so a reader
// never finds an .idx without its whole .bin. A writer destroyed before
// Finish returns (an error, a cancelled run) removes its temporary files
// and leaves any existing PREFIX.bin/.idx as they were.
//
// Memory: 4 bytes per document (the lengths, written into the index at
// Finish) plus a fixed write buffer; the tokens stream to disk.
//
// Thread-compatible: one thread at a time (a multi-threaded tokenizer hands
// finished documents to one writing thread, in order).
#ifndef CONVEYOR_ENGINE_MEGATRON_WRITER_H_
#define CONVEYOR_ENGINE_MEGATRON_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/file.h"
#include "engine/megatron_format.h"

namespace conveyor::engine {

class MegatronWriter {
 public:
  // Opens the temporary files beside `prefix` (whose directory must exist).
  // InvalidArgument for a float dtype or an empty prefix; the errno-derived
  // code (NotFound, PermissionDenied, ...) when the files cannot be created.
  static absl::StatusOr<std::unique_ptr<MegatronWriter>> Create(
      const std::string& prefix, MegatronDType dtype);

  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;
  // Removes the temporary files unless Finish succeeded.
  ~MegatronWriter();

  // Appends one document (it may be empty). InvalidArgument naming the
  // document and the position when an id is negative or does not fit the
  // dtype, or the document has more than 2^31 - 1 tokens (the index stores
  // lengths as int32); nothing of the document is written then. The
  // errno-derived code on a failed write; FailedPrecondition after Finish or
  // a failed write.
  absl::Status AddDocument(absl::Span<const int64_t> ids);

  // Writes the index, syncs both files and renames them to PREFIX.bin and
  // PREFIX.idx. FailedPrecondition when called twice or after a failed
  // write; the errno-derived code when a write, sync or rename fails.
  absl::Status Finish();

  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  MegatronWriter(std::string prefix, MegatronDType dtype, std::string bin_tmp,
                 ScopedFd bin_fd)
      : prefix_(std::move(prefix)),
        dtype_(dtype),
        bin_tmp_(std::move(bin_tmp)),
        bin_fd_(std::move(bin_fd)) {}

  // Writes buffer_ to the temporary .bin and empties it.
  absl::Status Flush();
  absl::Status WriteIndex(const std::string& path, int fd) const;

  const std::string prefix_;
  const MegatronDType dtype_;
  const std::string bin_tmp_;
  ScopedFd bin_fd_;
  std::string idx_tmp_;  // Set once Finish creates it.
  std::vector<uint8_t> buffer_;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
  bool failed_ = false;
  bool finished_ = false;
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MEGATRON_WRITER_H_
