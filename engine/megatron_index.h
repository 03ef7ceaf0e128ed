// MegatronIndex: a Megatron `.idx` (engine/megatron_format.h), memory-mapped
// and checked against its `.bin` before anything trusts it, so that a hostile
// or mismatched pair is refused when a job starts rather than read out of
// bounds later.
//
// Open checks, in one pass over the index (20 bytes per sequence, never the
// .bin's tokens): the magic, version 1, a known integer dtype code (float32
// and float64 are refused: they cannot hold token ids), counts that fit the
// file, which must end where the document index ends; non-negative lengths;
// pointers back to back from 0 (each sequence starts where the one before
// ends, as every Megatron builder writes them), the last ending exactly at
// the .bin's size; a document index that starts at 0, never decreases and
// ends at the sequence count. Every error names the file and the byte
// offset of the field.
//
// The token stream is the sequences in index order; with back-to-back
// pointers token t of it sits at byte t x dtype size of the .bin.
//
// Thread-safe: immutable after Open.
#ifndef CONVEYOR_ENGINE_MEGATRON_INDEX_H_
#define CONVEYOR_ENGINE_MEGATRON_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mapped_file.h"
#include "engine/megatron_format.h"

namespace conveyor::engine {

class MegatronIndex {
 public:
  // Maps and checks `idx_path` against a .bin of `bin_bytes` bytes
  // (`bin_path` names it in errors). InvalidArgument for a malformed index or
  // one that disagrees with the .bin; the errno-derived code when it cannot
  // be read.
  static absl::StatusOr<std::unique_ptr<MegatronIndex>> Open(
      const std::string& idx_path, const std::string& bin_path,
      uint64_t bin_bytes);

  MegatronDType dtype() const { return dtype_; }
  int64_t sequence_count() const { return sequences_; }
  // Documents, one fewer than the document index's entries.
  int64_t document_count() const { return entries_ - 1; }
  // Tokens of all sequences together.
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  // Entry j of the document index, j in [0, document_count()].
  int64_t document_index(int64_t j) const;

  // MappedFile::CheckNotShrunk of the .idx.
  absl::Status CheckNotShrunk() const { return file_->CheckNotShrunk(); }

  // The stream offset of document d's first token, d in [0,
  // document_count()]; document_count() gives num_tokens().
  int64_t DocumentStart(int64_t d) const;
  // The document holding stream token t, t in [0, num_tokens()): the last d
  // whose DocumentStart is <= t (so empty documents are skipped). O(log D).
  int64_t DocumentAt(int64_t t) const;

 private:
  MegatronIndex(std::unique_ptr<MappedFile> file, MegatronDType dtype,
                int64_t sequences, int64_t entries)
      : file_(std::move(file)),
        dtype_(dtype),
        sequences_(sequences),
        entries_(entries) {}

  // The checks of Open after the header.
  absl::Status CheckBody(const std::string& bin_path, uint64_t bin_bytes);

  const std::unique_ptr<MappedFile> file_;
  const MegatronDType dtype_;
  const int64_t sequences_;
  const int64_t entries_;
  int64_t num_tokens_ = 0;  // Set by CheckBody.
};

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_MEGATRON_INDEX_H_
