// Added tokens (HF's added_tokens: special tokens such as <|end_of_text|>,
// and tokens added after training) and how they are found in a text before
// the pre-tokenizer sees it, as HF's AddedVocabulary does: the leftmost
// match, the longest one where several start there; single_word drops a
// match that touches a word character on either side; lstrip and rstrip
// take the white space next to the match into the token.
//
// Thread-safety: immutable after construction.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_ADDED_TOKENS_H_
#define CONVEYOR_TOKENIZER_INTERNAL_ADDED_TOKENS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  // Matched in the normalized text (after the normalizer) rather than in
  // the text as given.
  bool normalized = false;
  bool special = false;
};

// A stretch of text: an added token (id >= 0) or text for the model
// (id == kText).
struct TextPiece {
  static constexpr int64_t kText = -1;
  size_t start = 0;
  size_t end = 0;
  int64_t id = kText;
};

class AddedTokenMatcher {
 public:
  // Looks for each token's `text` (its content, or the content normalized
  // for a matcher over normalized text). The tokens must outlive this; no
  // two texts may be equal, and none empty.
  struct Pattern {
    std::string text;
    const AddedToken* token = nullptr;
  };
  explicit AddedTokenMatcher(std::vector<Pattern> patterns);

  bool empty() const { return patterns_.empty(); }

  // Replaces *pieces with the pieces of `text`, in order, covering it
  // without gaps or overlaps (an empty text gives no pieces).
  void Split(absl::string_view text, std::vector<TextPiece>* pieces) const;

 private:
  // The next position >= from whose byte starts some pattern, or npos.
  size_t NextCandidate(absl::string_view text, size_t from) const;

  std::vector<Pattern> patterns_;
  // For each first byte, the patterns starting with it, longest first.
  std::array<std::vector<int>, 256> by_first_byte_;
  int distinct_first_bytes_ = 0;
  unsigned char only_first_byte_ = 0;  // When there is exactly one.
};

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_ADDED_TOKENS_H_
