#include "scheduler/svg_text.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace conveyor::scheduler {

std::string SvgNumber(double v) {
  if (!std::isfinite(v)) return "0";
  char buf[64];
  auto [end, ec] =
      std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed, 2);
  if (ec != std::errc()) return "0";
  std::string out(buf, end);
  while (out.back() == '0') out.pop_back();
  if (out.back() == '.') out.pop_back();
  if (out == "-0") out = "0";
  return out;
}

std::string SvgEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out.push_back('?');
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

}  // namespace conveyor::scheduler
