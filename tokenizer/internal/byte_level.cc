#include "tokenizer/internal/byte_level.h"

#include <array>

#include "tokenizer/internal/utf8.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

// Whether `byte` is printable as itself in the alphabet.
constexpr bool StandsForItself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> code_point_of_byte{};
  // Every code point of the alphabet is below 0x144 (256 + 68).
  std::array<int, 0x144> byte_of_code_point{};
};

constexpr Tables MakeTables() {
  Tables tables;
  for (int& byte : tables.byte_of_code_point) byte = -1;
  char32_t next = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const char32_t code_point =
        StandsForItself(byte) ? static_cast<char32_t>(byte) : next++;
    tables.code_point_of_byte[byte] = code_point;
    tables.byte_of_code_point[code_point] = byte;
  }
  return tables;
}

constexpr Tables kTables = MakeTables();

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) {
  return kTables.code_point_of_byte[byte];
}

std::string BytesToByteLevel(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(c)), &out);
  }
  return out;
}

std::optional<std::string> ByteLevelToBytes(absl::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t code_point;
    const size_t length = DecodeUtf8(token, pos, &code_point);
    if (length == 0 || code_point >= kTables.byte_of_code_point.size() ||
        kTables.byte_of_code_point[code_point] < 0) {
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(kTables.byte_of_code_point[code_point]));
    pos += length;
  }
  return bytes;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
