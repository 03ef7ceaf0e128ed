#include "tokenizer/internal/utf8.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::tokenizer::tokenizer_internal {

size_t DecodeUtf8(absl::string_view text, size_t pos, char32_t* code_point) {
  const auto byte = [&](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length;
  char32_t value;
  char32_t smallest;  // Below this the form is overlong.
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    value = lead & 0x1F;
    smallest = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    value = lead & 0x0F;
    smallest = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    value = lead & 0x07;
    smallest = 0x10000;
  } else {
    return 0;  // A continuation byte, 0xC0/0xC1 (always overlong), or > 0xF4.
  }
  if (pos + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    const unsigned char next = byte(pos + i);
    if ((next & 0xC0) != 0x80) return 0;
    value = (value << 6) | (next & 0x3F);
  }
  if (value < smallest || value > 0x10FFFF ||
      (value >= 0xD800 && value <= 0xDFFF)) {
    return 0;
  }
  *code_point = value;
  return length;
}

size_t DecodeUtf8Before(absl::string_view text, size_t end,
                        char32_t* code_point) {
  // A character is at most 4 bytes: try each start that could end at `end`.
  for (size_t length = 1; length <= 4 && length <= end; ++length) {
    const size_t start = end - length;
    const unsigned char lead = static_cast<unsigned char>(text[start]);
    if ((lead & 0xC0) == 0x80) continue;  // A continuation byte.
    return DecodeUtf8(text, start, code_point) == length ? length : 0;
  }
  return 0;
}

bool IsValidUtf8(absl::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t code_point;
    const size_t length = DecodeUtf8(text, pos, &code_point);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

void AppendUtf8(char32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

namespace {

const icu::Normalizer2* NfcInstance(UErrorCode* status) {
  return icu::Normalizer2::getNFCInstance(*status);
}

}  // namespace

bool IsNfc(absl::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = NfcInstance(&status);
  if (U_FAILURE(status)) return false;
  const bool normalized = nfc->isNormalizedUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), status);
  return U_SUCCESS(status) && normalized;
}

absl::StatusOr<std::string> ToNfc(absl::string_view text) {
  if (text.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a text of ", text.size(), " bytes is too long to normalize (NFC)"));
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = NfcInstance(&status);
  std::string out;
  if (U_SUCCESS(status)) {
    out.reserve(text.size());
    icu::StringByteSink<std::string> sink(&out);
    nfc->normalizeUTF8(
        0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
        sink, nullptr, status);
  }
  if (U_FAILURE(status)) {
    return status == U_MEMORY_ALLOCATION_ERROR
               ? absl::ResourceExhaustedError("out of memory normalizing text")
               : absl::InternalError(absl::StrCat("ICU NFC normalization: ",
                                                  u_errorName(status)));
  }
  return out;
}

bool IsUnicodeWhiteSpace(char32_t code_point) {
  return u_hasBinaryProperty(static_cast<UChar32>(code_point),
                             UCHAR_WHITE_SPACE);
}

bool IsUnicodeWordCharacter(char32_t code_point) {
  const auto c = static_cast<UChar32>(code_point);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) ||
      u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

}  // namespace conveyor::tokenizer::tokenizer_internal
