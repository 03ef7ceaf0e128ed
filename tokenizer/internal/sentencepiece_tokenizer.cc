#include "tokenizer/internal/sentencepiece_tokenizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/internal/utf8.h"

namespace conveyor::tokenizer::tokenizer_internal {

SentencePieceTokenizer::SentencePieceTokenizer(
    std::unique_ptr<SentencePieceBackend> backend)
    : backend_(std::move(backend)) {}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>>
SentencePieceTokenizer::Create(absl::string_view model) {
  std::string error;
  std::unique_ptr<SentencePieceBackend> backend = SentencePieceBackend::Load(
      std::string_view(model.data(), model.size()), &error);
  if (backend == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a SentencePiece model: ", error));
  }
  auto tokenizer = std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(backend)));
  SentencePieceBackend& sp = *tokenizer->backend_;
  for (int id = 0; id < sp.piece_size(); ++id) {
    if (!sp.IsControlOrUnknown(id)) continue;
    AddedToken token;
    token.content = sp.IdToPiece(id);
    token.id = id;
    token.special = true;
    if (!token.content.empty()) {
      tokenizer->special_pieces_.push_back(std::move(token));
    }
  }
  std::vector<AddedTokenMatcher::Pattern> patterns;
  for (const AddedToken& token : tokenizer->special_pieces_) {
    patterns.push_back({token.content, &token});
  }
  tokenizer->matcher_ = AddedTokenMatcher(std::move(patterns));
  return tokenizer;
}

std::optional<int64_t> SentencePieceTokenizer::Find(
    absl::string_view piece) const {
  const int id =
      backend_->PieceToId(std::string_view(piece.data(), piece.size()));
  return id < 0 ? std::nullopt : std::optional<int64_t>(id);
}

std::optional<int64_t> SentencePieceTokenizer::model_bos() const {
  const int id = backend_->bos_id();
  return id < 0 ? std::nullopt : std::optional<int64_t>(id);
}

std::optional<int64_t> SentencePieceTokenizer::model_eos() const {
  const int id = backend_->eos_id();
  return id < 0 ? std::nullopt : std::optional<int64_t>(id);
}

absl::StatusOr<std::vector<int64_t>> SentencePieceTokenizer::Encode(
    absl::string_view text, bool add_bos) const {
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError(
        "the text is not valid UTF-8, which a SentencePiece model needs");
  }
  std::vector<int64_t> ids;
  if (add_bos) {
    if (!bos_.has_value()) {
      return absl::FailedPreconditionError("this tokenizer has no BOS token");
    }
    ids.push_back(*bos_);
  }
  std::vector<TextPiece> pieces;
  matcher_.Split(text, &pieces);
  std::vector<int> piece_ids;
  std::string error;
  for (const TextPiece& piece : pieces) {
    if (piece.id != TextPiece::kText) {
      ids.push_back(piece.id);
      continue;
    }
    const absl::string_view segment =
        text.substr(piece.start, piece.end - piece.start);
    if (!backend_->Encode(std::string_view(segment.data(), segment.size()),
                          &piece_ids, &error)) {
      return absl::InternalError(absl::StrCat("SentencePiece: ", error));
    }
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  return ids;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(
    absl::Span<const int64_t> ids) const {
  std::string text;
  std::vector<int> run;
  std::string decoded;
  std::string error;
  // A run of ordinary pieces decodes as one (its first piece's leading
  // space is the dummy prefix the encoder added to the stretch).
  const auto flush = [&]() -> absl::Status {
    if (run.empty()) return absl::OkStatus();
    if (!backend_->Decode(run, &decoded, &error)) {
      return absl::InternalError(absl::StrCat("SentencePiece: ", error));
    }
    text += decoded;
    run.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("id ", id, " (position ", i,
                       ") is not in the vocabulary of ", vocab_size(), " ids"));
    }
    if (backend_->IsControlOrUnknown(static_cast<int>(id))) {
      if (absl::Status status = flush(); !status.ok()) return status;
      text += backend_->IdToPiece(static_cast<int>(id));
    } else {
      run.push_back(static_cast<int>(id));
    }
  }
  if (absl::Status status = flush(); !status.ok()) return status;
  return text;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
