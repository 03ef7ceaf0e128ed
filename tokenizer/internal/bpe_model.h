// The BPE model of a byte-level tokenizer: a pre-token's bytes to ids by
// merging adjacent pairs, lowest merge rank first and leftmost among equal
// ranks, exactly as HF's BPE (models/bpe/word.rs) does; with ignore_merges
// (Llama-3), a pre-token that is itself in the vocabulary is one token.
// Every one of the 256 bytes has a token, so any bytes encode.
//
// Short pre-tokens recur (most of a text is common words), so their ids are
// cached per thread.
//
// Thread-safety: immutable after construction; Encode may run on many
// threads at once (the cache is thread-local).
#ifndef CONVEYOR_TOKENIZER_INTERNAL_BPE_MODEL_H_
#define CONVEYOR_TOKENIZER_INTERNAL_BPE_MODEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

class BpeModel {
 public:
  // A merge of two adjacent tokens into `result`; its rank is its index.
  struct Merge {
    int32_t left = 0;
    int32_t right = 0;
    int32_t result = 0;
  };

  // `byte_vocab`: every token that is a byte string (the tokens written in
  // the byte-level alphabet), bytes -> id; `byte_ids`: the token of each
  // byte; `merges` in rank order, each pair at most once (the caller has
  // checked all of this against the vocabulary).
  BpeModel(absl::flat_hash_map<std::string, int32_t> byte_vocab,
           const std::array<int32_t, 256>& byte_ids,
           const std::vector<Merge>& merges, bool ignore_merges);

  // Appends the ids of `word` (not empty) to *ids.
  void Encode(absl::string_view word, std::vector<int64_t>* ids) const;

  // The id of the token whose bytes are `bytes`, or -1.
  int32_t Find(absl::string_view bytes) const;

  // Above this many bytes a word is merged with a heap (n log n) rather
  // than by scanning its pairs for each merge (n^2, faster when short).
  static constexpr size_t kScanLimit = 64;

  // The merge itself, uncached: the scan for short words, the heap for
  // long ones. Tests compare both against each other.
  void TEST_MergeWithScan(absl::string_view word,
                          std::vector<int64_t>* ids) const;
  void TEST_MergeWithHeap(absl::string_view word,
                          std::vector<int64_t>* ids) const;

 private:
  struct Rank {
    uint32_t rank = 0;
    int32_t result = 0;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  // The merge of (left, right), or nullptr.
  const Rank* FindMerge(int32_t left, int32_t right) const;

  void MergeWithScan(absl::string_view word, std::vector<int64_t>* ids) const;
  void MergeWithHeap(absl::string_view word, std::vector<int64_t>* ids) const;

  absl::flat_hash_map<std::string, int32_t> byte_vocab_;
  std::array<int32_t, 256> byte_ids_;
  absl::flat_hash_map<uint64_t, Rank> merges_;
  bool ignore_merges_;
  // Tells this model's cache entries from another's in a thread's cache.
  uint64_t cache_owner_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_BPE_MODEL_H_
