// GPT-2's byte-level alphabet: each of the 256 byte values written as one
// printable Unicode character, so that a vocabulary of byte strings can be
// stored as JSON text. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
// themselves; the other 68 (controls, space, DEL, 0x80..0xA0, the soft
// hyphen 0xAD) become U+0100, U+0101, ... in byte order, so a space is "Ġ"
// (U+0120) and a newline "Ċ" (U+010A). Tokenizers work on the bytes; only
// tokenizer.json speaks in this alphabet. Thread-safe: constant tables.
#ifndef CONVEYOR_TOKENIZER_INTERNAL_BYTE_LEVEL_H_
#define CONVEYOR_TOKENIZER_INTERNAL_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::tokenizer::tokenizer_internal {

// The character that stands for `byte`.
char32_t ByteToCodePoint(uint8_t byte);

// `bytes` in the alphabet (what tokenizer.json would write).
std::string BytesToByteLevel(absl::string_view bytes);

// A token written in the alphabet back to its bytes; nullopt when it holds
// a character outside the alphabet or is not UTF-8 (such a token can never
// come out of merging bytes: an added token's text, for one).
std::optional<std::string> ByteLevelToBytes(absl::string_view token);

}  // namespace conveyor::tokenizer::tokenizer_internal

#endif  // CONVEYOR_TOKENIZER_INTERNAL_BYTE_LEVEL_H_
