// Debian's libsentencepiece behind an interface of standard types only.
// sentencepiece_processor.h declares `namespace absl { using
// std::string_view; }`, which clashes with Debian's abseil (whose
// absl::string_view is a class of its own), so the library's header is
// included by sentencepiece_backend.cc alone, and this header includes
// nothing of abseil.
//
// Thread-safety: immutable once loaded; the processor's Encode and Decode
// are const and may run on many threads at once.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_BACKEND_H_
#define CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_BACKEND_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace conveyor::tokenizer::tokenizer_internal {

class SentencePieceBackend {
 public:
  // A model from the bytes of a tokenizer.model; nullptr and *error set
  // when they are not one.
  static std::unique_ptr<SentencePieceBackend> Load(std::string_view model,
                                                    std::string* error);
  ~SentencePieceBackend();

  // False and *error set when the library fails.
  bool Encode(std::string_view text, std::vector<int>* ids,
              std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text,
              std::string* error) const;

  int piece_size() const;
  int bos_id() const;  // -1 when the model has none.
  int eos_id() const;
  // Control pieces (<s>, </s>) and the unknown piece (<unk>): what the
  // library never matches in a text, and decodes to nothing.
  bool IsControlOrUnknown(int id) const;
  std::string IdToPiece(int id) const;
  int PieceToId(std::string_view piece) const;  // -1 when none has it.

 private:
  SentencePieceBackend();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_SENTENCEPIECE_BACKEND_H_
