// A SentencePiece model (tokenizer.model: Llama-2, Mistral) through
// Debian's libsentencepiece. As HF's Llama tokenizers do, the control and
// unknown pieces (<s>, </s>, <unk>) written in a text are split out first,
// each encoding to its id, and each stretch between them is encoded on its
// own (with the model's dummy-prefix space); decoding inverts this, so the
// round trip is exact for any UTF-8 text when the model's normalizer
// leaves text as it is (Llama-2's "identity") and it has byte fallback
// (characters outside the vocabulary become <0xNN> pieces). A model that
// normalizes (nmt_nfkc, collapsing white space) round-trips normalized
// text only.
//
// Thread-safety: immutable after Create (SetSpecialTokens is part of
// loading); Encode and Decode may run on many threads at once.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_TOKENIZER_H_
#define CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tokenizer/internal/added_tokens.h"
#include "tokenizer/internal/sentencepiece_backend.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer::tokenizer_internal {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // From the bytes of a tokenizer.model. InvalidArgument with the
  // library's message when they are not a model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Create(
      absl::string_view model);

  std::optional<int64_t> Find(absl::string_view piece) const;
  // The ids the model itself records, if any.
  std::optional<int64_t> model_bos() const;
  std::optional<int64_t> model_eos() const;

  void SetSpecialTokens(std::optional<int64_t> bos,
                        std::optional<int64_t> eos) {
    bos_ = bos;
    eos_ = eos;
  }

  absl::StatusOr<std::vector<int64_t>> Encode(
      absl::string_view text, bool add_bos = false) const override;
  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override;
  int64_t vocab_size() const override { return backend_->piece_size(); }
  std::optional<int64_t> bos_id() const override { return bos_; }
  std::optional<int64_t> eos_id() const override { return eos_; }
  std::string kind() const override { return "sentencepiece"; }

 private:
  explicit SentencePieceTokenizer(
      std::unique_ptr<SentencePieceBackend> backend);

  std::unique_ptr<SentencePieceBackend> backend_;
  // The control and unknown pieces, as added tokens to split out.
  std::vector<AddedToken> special_pieces_;
  AddedTokenMatcher matcher_{{}};
  std::optional<int64_t> bos_;
  std::optional<int64_t> eos_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_TOKENIZER_H_
