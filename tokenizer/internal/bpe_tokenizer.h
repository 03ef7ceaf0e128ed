// The byte-level BPE tokenizer of an HF tokenizer.json (GPT-2, Llama-3,
// Qwen2): added tokens split out of the text, the normalizer (NFC or none),
// the pre-tokenizer, the BPE model; decoding maps each id back to its bytes,
// so Decode(Encode(s)) == s for any bytes s (for an NFC tokenizer: NFC(s)
// for valid UTF-8 s, as the normalizer changes the text; for an added
// token with lstrip or rstrip: less the white space it took in).
//
// Thread-safety: immutable after Create (SetSpecialTokens is part of
// loading); Encode and Decode may run on many threads at once.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_BPE_TOKENIZER_H_
#define CONVEYOR_TOKENIZER_INTERNAL_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokenizer/internal/added_tokens.h"
#include "tokenizer/internal/bpe_model.h"
#include "tokenizer/internal/pre_tokenizer.h"
#include "tokenizer/internal/tokenizer_json.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer::tokenizer_internal {

class BpeTokenizer final : public Tokenizer {
 public:
  // Checks that the parts agree, InvalidArgument "<json path>: ..." when
  // not: two tokens with one id; a vocabulary without a token for each of
  // the 256 bytes; a merge whose parts or result are not in the
  // vocabulary, that repeats an earlier merge, or that is cyclic (an empty
  // part: its result is its other part); ids far sparser than the tokens
  // (the largest past twice their number plus 1024); an added token whose id or
  // content the vocabulary gives to another, or two added tokens with one
  // id or one content.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(
      TokenizerJson json);

  // The id of a token as tokenizer.json writes it (an added token's
  // content, or a vocabulary entry in the byte-level alphabet).
  std::optional<int64_t> Find(absl::string_view token) const;

  void SetSpecialTokens(std::optional<int64_t> bos,
                        std::optional<int64_t> eos) {
    bos_ = bos;
    eos_ = eos;
  }

  absl::StatusOr<std::vector<int64_t>> Encode(
      absl::string_view text, bool add_bos = false) const override;
  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override;
  int64_t vocab_size() const override {
    return static_cast<int64_t>(decoded_.size());
  }
  std::optional<int64_t> bos_id() const override { return bos_; }
  std::optional<int64_t> eos_id() const override { return eos_; }
  std::string kind() const override { return "bpe"; }

 private:
  BpeTokenizer(bool nfc, std::vector<PreTokenizerStep> steps, BpeModel model);

  // Encodes text without added tokens in it (after the normalizer).
  absl::Status EncodePlain(absl::string_view text,
                           std::vector<int64_t>* ids) const;

  bool nfc_;
  PreTokenizer pre_tokenizer_;
  BpeModel model_;
  std::vector<AddedToken> added_tokens_;
  // Added tokens matched in the text as given, and in the normalized text.
  AddedTokenMatcher raw_matcher_{{}};
  AddedTokenMatcher normalized_matcher_{{}};
  absl::flat_hash_map<std::string, int64_t> added_ids_;
  // Vocabulary entries not in the byte-level alphabet (never produced by
  // merging bytes, but decodable and findable by name).
  absl::flat_hash_map<std::string, int64_t> other_ids_;
  // Each id's bytes; has_token_[id] is false for ids no token has.
  std::vector<std::string> decoded_;
  std::vector<bool> has_token_;
  std::optional<int64_t> bos_;
  std::optional<int64_t> eos_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_BPE_TOKENIZER_H_
