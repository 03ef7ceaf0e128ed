#include "tokenizer/internal/added_tokens.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tokenizer/internal/utf8.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

// Whether the character just before `end` is a word character (HF: \w$).
bool EndsWithWord(absl::string_view text, size_t end) {
  char32_t code_point;
  return end > 0 && DecodeUtf8Before(text, end, &code_point) > 0 &&
         IsUnicodeWordCharacter(code_point);
}

// Whether the character at `start` is a word character (HF: ^\w).
bool StartsWithWord(absl::string_view text, size_t start) {
  char32_t code_point;
  return start < text.size() && DecodeUtf8(text, start, &code_point) > 0 &&
         IsUnicodeWordCharacter(code_point);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Pattern> patterns)
    : patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i) {
    const auto first = static_cast<unsigned char>(patterns_[i].text[0]);
    if (by_first_byte_[first].empty()) {
      ++distinct_first_bytes_;
      only_first_byte_ = first;
    }
    by_first_byte_[first].push_back(static_cast<int>(i));
  }
  for (std::vector<int>& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
      return patterns_[a].text.size() > patterns_[b].text.size();
    });
  }
}

size_t AddedTokenMatcher::NextCandidate(absl::string_view text,
                                        size_t from) const {
  if (from >= text.size()) return absl::string_view::npos;
  if (distinct_first_bytes_ == 1) {
    // The usual case (every special token of Llama-3 and Qwen2 starts with
    // '<'): memchr runs at memory speed.
    const void* found =
        std::memchr(text.data() + from, only_first_byte_, text.size() - from);
    return found == nullptr ? absl::string_view::npos
                            : static_cast<const char*>(found) - text.data();
  }
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!by_first_byte_[static_cast<unsigned char>(text[pos])].empty()) {
      return pos;
    }
  }
  return absl::string_view::npos;
}

void AddedTokenMatcher::Split(absl::string_view text,
                              std::vector<TextPiece>* pieces) const {
  pieces->clear();
  size_t text_start = 0;  // Where the text not yet in a piece starts.
  size_t pos = 0;
  while (!patterns_.empty()) {
    pos = NextCandidate(text, pos);
    if (pos == absl::string_view::npos) break;
    const Pattern* match = nullptr;
    for (int index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const std::string& candidate = patterns_[index].text;
      if (text.substr(pos, candidate.size()) == candidate) {
        match = &patterns_[index];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t end = pos + match->text.size();
    pos = end;
    const AddedToken& token = *match->token;
    if (token.single_word &&
        (EndsWithWord(text, start) || StartsWithWord(text, end))) {
      // Not a word of its own: left in the text, and the search goes on
      // after it (as HF's matcher, which never revisits a match's bytes).
      continue;
    }
    char32_t code_point;
    if (token.lstrip) {
      // Never into the previous token's piece.
      while (start > text_start) {
        const size_t length = DecodeUtf8Before(text, start, &code_point);
        if (length == 0 || start - length < text_start ||
            !IsUnicodeWhiteSpace(code_point)) {
          break;
        }
        start -= length;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        const size_t length = DecodeUtf8(text, end, &code_point);
        if (length == 0 || !IsUnicodeWhiteSpace(code_point)) break;
        end += length;
      }
      pos = end;
    }
    if (text_start < start) {
      pieces->push_back({text_start, start, TextPiece::kText});
    }
    pieces->push_back({start, end, token.id});
    text_start = end;
  }
  if (text_start < text.size()) {
    pieces->push_back({text_start, text.size(), TextPiece::kText});
  }
}

}  // namespace conveyor::tokenizer::tokenizer_internal
