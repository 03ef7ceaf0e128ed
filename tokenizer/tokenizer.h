// A text tokenizer: text to token ids and back, loaded from what HF
// checkpoints ship: a `tokenizer.json` (byte-level BPE as in GPT-2, Llama-3
// and Qwen2) or a SentencePiece `tokenizer.model` (Llama-2, Mistral).
// docs/tokenizers.md says what is supported and what is refused.
//
// The special tokens: bos_id() and eos_id() come from tokenizer_config.json
// (its "bos_token" / "eos_token"), else special_tokens_map.json, next to the
// tokenizer file when present; otherwise from the first of the known names
// found in the vocabulary (EOS: <|end_of_text|>, <|endoftext|>, </s>; BOS:
// <|begin_of_text|>, <s>); a SentencePiece model's own bos/eos ids come
// before the names.
//
// Thread-safety: a loaded Tokenizer is immutable; Encode and Decode may be
// called from any number of threads at once.
#ifndef CONVEYOR_TOKENIZER_TOKENIZER_H_
#define CONVEYOR_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace conveyor::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `path`: a tokenizer.json, a SentencePiece tokenizer.model, or a
  // directory holding one (tokenizer.json preferred). Errors name the file
  // and what is wrong with it: NotFound / PermissionDenied (errno) when it
  // cannot be read, InvalidArgument for a malformed or inconsistent file
  // (a merge whose parts are not in the vocabulary, ids out of range, ...),
  // Unimplemented for a well-formed file that asks for what is not
  // supported (a WordPiece or Unigram model, an unknown normalizer).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(
      const std::string& path);

  // Text to ids. Special and added tokens written in the text are recognised
  // as HF does (split out before the pre-tokenizer). No BOS is added unless
  // `add_bos` (FailedPrecondition when the tokenizer has none).
  // InvalidArgument when a pre-tokenizer pattern exhausts its match limit
  // (a pathological regex) or, for SentencePiece, the text is not UTF-8.
  virtual absl::StatusOr<std::vector<int64_t>> Encode(
      absl::string_view text, bool add_bos = false) const = 0;

  // Ids to text, exact: Decode(Encode(s)) == s for any valid UTF-8 s (and
  // for a byte-level BPE, for any byte string). InvalidArgument for an id
  // outside the vocabulary.
  virtual absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const = 0;

  // The number of ids, added tokens included (one past the largest id).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> bos_id() const = 0;
  // The end-of-text / end-of-document token.
  virtual std::optional<int64_t> eos_id() const = 0;
  // "bpe" or "sentencepiece".
  virtual std::string kind() const = 0;
};

}  // namespace conveyor::tokenizer

#endif  // CONVEYOR_TOKENIZER_TOKENIZER_H_
