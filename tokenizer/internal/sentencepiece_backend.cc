// No abseil header may be included here (see the header).
#include "tokenizer/internal/sentencepiece_backend.h"

#include <sentencepiece_processor.h>

namespace conveyor::tokenizer::tokenizer_internal {

SentencePieceBackend::SentencePieceBackend()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

SentencePieceBackend::~SentencePieceBackend() = default;

std::unique_ptr<SentencePieceBackend> SentencePieceBackend::Load(
    std::string_view model, std::string* error) {
  std::unique_ptr<SentencePieceBackend> backend(new SentencePieceBackend());
  const sentencepiece::util::Status status =
      backend->processor_->LoadFromSerializedProto(model);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return backend;
}

bool SentencePieceBackend::Encode(std::string_view text, std::vector<int>* ids,
                                  std::string* error) const {
  const sentencepiece::util::Status status = processor_->Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceBackend::Decode(const std::vector<int>& ids,
                                  std::string* text, std::string* error) const {
  const sentencepiece::util::Status status = processor_->Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int SentencePieceBackend::piece_size() const {
  return processor_->GetPieceSize();
}

int SentencePieceBackend::bos_id() const { return processor_->bos_id(); }

int SentencePieceBackend::eos_id() const { return processor_->eos_id(); }

bool SentencePieceBackend::IsControlOrUnknown(int id) const {
  return processor_->IsControl(id) || processor_->IsUnknown(id);
}

std::string SentencePieceBackend::IdToPiece(int id) const {
  return processor_->IdToPiece(id);
}

int SentencePieceBackend::PieceToId(std::string_view piece) const {
  const int id = processor_->PieceToId(piece);
  // The library answers the unknown piece's id for a piece it lacks.
  return id == processor_->unk_id() && processor_->IdToPiece(id) != piece ? -1
                                                                          : id;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
