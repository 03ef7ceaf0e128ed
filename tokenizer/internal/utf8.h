// UTF-8 decoding for the tokenizers: the text they take is bytes, and only
// mostly UTF-8 (a byte-level BPE must accept any bytes), so every decode
// says how many bytes it used and whether they formed a character.
// Also NFC and the Unicode properties the HF rules name (White_Space, word
// characters), from ICU. Thread-safe: stateless functions.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_UTF8_H_
#define CONVEYOR_TOKENIZER_INTERNAL_UTF8_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

// The character starting at text[pos] (pos < text.size()): its code point
// in *code_point and its length in bytes, or 0 when the bytes there are not
// a well-formed UTF-8 sequence (overlong forms, surrogates and code points
// past U+10FFFF included).
size_t DecodeUtf8(absl::string_view text, size_t pos, char32_t* code_point);

// The character that ends just before text[end] (0 < end <= text.size()):
// its length, or 0 when the bytes there are not one well-formed character.
size_t DecodeUtf8Before(absl::string_view text, size_t end,
                        char32_t* code_point);

// Whether every byte of `text` belongs to a well-formed UTF-8 character.
bool IsValidUtf8(absl::string_view text);

// `code_point` as UTF-8 (1 to 4 bytes), appended to *out.
void AppendUtf8(char32_t code_point, std::string* out);

// Whether `text` is in Unicode Normalization Form C (NFC); invalid UTF-8
// bytes, which NFC leaves alone, do not count against it.
bool IsNfc(absl::string_view text);

// `text` in NFC, what HF's NFC normalizer does, with invalid UTF-8 bytes
// passed through unchanged. ResourceExhausted or Internal from ICU.
absl::StatusOr<std::string> ToNfc(absl::string_view text);

// Unicode's White_Space property: what HF's added tokens strip for lstrip
// and rstrip (Rust's \s).
bool IsUnicodeWhiteSpace(char32_t code_point);

// A word character as Rust's regex \w has it (Alphabetic, marks, decimal
// digits, connector punctuation, Join_Control): what an added token's
// single_word option looks at.
bool IsUnicodeWordCharacter(char32_t code_point);

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_UTF8_H_
