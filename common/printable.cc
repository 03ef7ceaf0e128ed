#include "common/printable.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace conveyor {
namespace {

bool IsControl(char c) {
  return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
}

}  // namespace

bool HasControlCharacters(absl::string_view text) {
  return std::any_of(text.begin(), text.end(), IsControl);
}

std::string Printable(absl::string_view text) {
  if (!HasControlCharacters(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (const char c : text) {
    if (IsControl(c)) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace conveyor
