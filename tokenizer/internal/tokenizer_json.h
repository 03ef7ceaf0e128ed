// HF's tokenizer.json, as far as a byte-level BPE (GPT-2, Llama-3, Qwen2)
// uses it, read into plain values: what the normalizer, the pre-tokenizer,
// the model, the added tokens and the decoder say. Structure and types are
// checked here; whether the vocabulary and the merges agree is the
// tokenizer's to check (bpe_tokenizer.h). What a byte-level BPE never has
// is refused as Unimplemented, naming it: other models (WordPiece, Unigram,
// WordLevel), normalizers other than NFC, pre-tokenizers other than Split
// and ByteLevel, decoders other than ByteLevel, BPE dropout and subword
// prefixes. The post-processor (which adds BOS in HF's encode) is not read:
// Tokenizer::Encode adds BOS only when asked.
//
// Thread-safety: stateless function.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_
#define CONVEYOR_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/internal/added_tokens.h"
#include "tokenizer/internal/pre_tokenizer.h"

namespace conveyor::tokenizer::tokenizer_internal {

// The largest id accepted: 16 M, far above any vocabulary in use (Gemma's
// 256 K is the largest), and small enough that a hostile id cannot make a
// table of absurd size.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct TokenizerJson {
  bool nfc = false;  // The normalizer is NFC (else there is none).
  std::vector<PreTokenizerStep> pre_tokenizer;
  // model.vocab in file order: tokens in the byte-level alphabet.
  std::vector<std::pair<std::string, int64_t>> vocab;
  // model.merges in rank order.
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
  std::vector<AddedToken> added_tokens;
};

// Errors: InvalidArgument "<json path>: <what is wrong>" for a file that is
// not JSON, or not tokenizer.json's structure (a missing key, a wrong type,
// an id outside [0, kMaxTokenId], a merge that is not two tokens, a bad
// pattern); Unimplemented for what is not supported (above), and for a
// pre-tokenizer without a ByteLevel step ("not a byte-level BPE").
absl::StatusOr<TokenizerJson> ParseTokenizerJson(absl::string_view text);

// A token as an error message shows it: in quotes, C-escaped, its first 80
// bytes and "..." after a longer one.
std::string Quoted(absl::string_view text);

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_TOKENIZER_JSON_H_
