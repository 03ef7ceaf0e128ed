// TokenStream: the token ids of one memory-mapped file region (a tokens
// file, an llm.c shard after its header, a Megatron .bin), decoded on
// demand and checked against the vocabulary as they are read, so that no id
// outside it reaches an embedding and nothing is read into memory up front.
//
// Not API: only engine/data*.cc include this. Thread-safe: immutable.
#ifndef CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_STREAM_H_
#define CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_STREAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/mapped_file.h"
#include "engine/data.h"

namespace conveyor::engine::data_internal {

// After this many bytes read from a file, its pages are handed back to the
// page cache (MappedFile::ReleaseEvery), which bounds what a long run keeps
// resident per file.
inline constexpr uint64_t kReleasePeriodBytes = uint64_t{64} << 20;

// How ids are stored: little-endian integers of `bytes` bytes.
struct TokenEncoding {
  int bytes = 1;
  bool is_signed = false;
  std::string name;  // "uint16", ... for messages.
};

// Ids must lie in [0, limit); `what` names the bound in errors
// ("data.vocab_size", "the model's vocabulary", "what uint16 can hold").
struct VocabBound {
  int64_t limit = 0;
  std::string what;
};

// The tightest of data.vocab_size, the model's vocabulary and `dtype_limit`
// (the ids the encoding can hold at all; 0 for no limit). InvalidArgument
// for a negative data.vocab_size.
absl::StatusOr<VocabBound> MakeVocabBound(const DataConfig& config,
                                          const SampleShapes& shapes,
                                          uint64_t dtype_limit,
                                          absl::string_view dtype_name);

class TokenStream {
 public:
  // The `count` ids at byte `offset` of `file`, which must hold them.
  TokenStream(std::shared_ptr<const MappedFile> file, uint64_t offset,
              int64_t count, TokenEncoding encoding, VocabBound vocab)
      : file_(std::move(file)),
        offset_(offset),
        count_(count),
        encoding_(std::move(encoding)),
        vocab_(std::move(vocab)) {}

  int64_t size() const { return count_; }
  uint64_t bytes() const {
    return static_cast<uint64_t>(count_) * encoding_.bytes;
  }
  const MappedFile& file() const { return *file_; }
  const VocabBound& vocab() const { return vocab_; }

  // Ids [begin, begin + n) into out[0, n). InvalidArgument "<path>: the
  // token at byte offset X is Y, not below <bound> V" (or "is negative")
  // for an id outside [0, vocab.limit); Internal if the range is outside
  // the stream (a bug).
  absl::Status Read(int64_t begin, int64_t n, int64_t* out) const;

  // Reads every id (Create, for small files), then hands the pages back to
  // the page cache. Errors as Read.
  absl::Status CheckAll() const;

 private:
  absl::Status OutOfVocabulary(int64_t index, int64_t id) const;

  const std::shared_ptr<const MappedFile> file_;
  const uint64_t offset_;
  const int64_t count_;
  const TokenEncoding encoding_;
  const VocabBound vocab_;
};

}  // namespace conveyor::engine::data_internal

#endif  // CONVEYOR_ENGINE_INTERNAL_DATA_TOKEN_STREAM_H_
