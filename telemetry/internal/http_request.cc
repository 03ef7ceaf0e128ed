#include "telemetry/internal/http_request.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace conveyor::telemetry::http_internal {
namespace {

// RFC 9110 5.6.2: the characters of a token (methods, header names).
bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) continue;
    if (absl::string_view("!#$%&'*+-.^_`|~").find(c) == absl::string_view::npos)
      return false;
  }
  return true;
}

RequestHead Bad(int status, std::string why) {
  RequestHead head;
  head.error_status = status;
  head.error = std::move(why);
  return head;
}

}  // namespace

size_t FindHeadEnd(absl::string_view buffer) {
  // Skip the empty lines a client may send before its request line.
  size_t start = 0;
  while (start < buffer.size() &&
         (buffer[start] == '\r' || buffer[start] == '\n')) {
    ++start;
  }
  for (size_t i = start; i < buffer.size(); ++i) {
    if (buffer[i] != '\n') continue;
    // A line end followed by an empty line ends the head.
    if (i + 1 < buffer.size() && buffer[i + 1] == '\n') return i + 2;
    if (i + 2 < buffer.size() && buffer[i + 1] == '\r' &&
        buffer[i + 2] == '\n') {
      return i + 3;
    }
  }
  return absl::string_view::npos;
}

RequestHead ParseRequestHead(absl::string_view text) {
  while (!text.empty() && (text.front() == '\r' || text.front() == '\n')) {
    text.remove_prefix(1);
  }
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  if (lines.empty() || lines.front().empty()) {
    return Bad(400, "empty request");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3) {
    return Bad(400, "the request line is not METHOD TARGET VERSION");
  }
  RequestHead head;
  if (!IsToken(parts[0])) return Bad(400, "the method is not a token");
  head.method = std::string(parts[0]);
  if (!absl::StartsWith(parts[2], "HTTP/")) {
    return Bad(400, "the version is not HTTP/x.y");
  }
  if (parts[2] == "HTTP/1.1") {
    head.http11 = true;
  } else if (parts[2] != "HTTP/1.0") {
    return Bad(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }
  absl::string_view target = parts[1];
  // The absolute form (RFC 9112 3.2.2), as proxies send it.
  if (absl::StartsWithIgnoreCase(target, "http://") ||
      absl::StartsWithIgnoreCase(target, "https://")) {
    const size_t authority = target.find("//") + 2;
    const size_t slash = target.find('/', authority);
    target = slash == absl::string_view::npos ? absl::string_view("/")
                                              : target.substr(slash);
  }
  if (target.empty() || (target.front() != '/' && target != "*")) {
    return Bad(400, "the target is not a path");
  }
  for (const char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return Bad(400, "the target holds a control character");
    }
  }
  head.path = std::string(target.substr(0, target.find_first_of("?#")));

  bool close = !head.http11;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) continue;  // the head's final blank line
    const size_t colon = line.find(':');
    // Obsolete line folding (a line starting with white space) is refused,
    // as RFC 9112 5.2 allows.
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Bad(400, "a header line is not NAME: VALUE");
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value =
        absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "connection")) {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        option = absl::StripAsciiWhitespace(option);
        if (absl::EqualsIgnoreCase(option, "close")) close = true;
        if (absl::EqualsIgnoreCase(option, "keep-alive")) close = false;
      }
    } else if (absl::EqualsIgnoreCase(name, "content-length")) {
      uint64_t length = 0;
      if (!absl::SimpleAtoi(value, &length)) {
        return Bad(400, "Content-Length is not a number");
      }
      if (length > 0) head.has_body = true;
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      head.has_body = true;
    }
  }
  head.keep_alive = !close && !head.has_body;
  return head;
}

absl::string_view StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace conveyor::telemetry::http_internal
