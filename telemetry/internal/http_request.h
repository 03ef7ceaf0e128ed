// The request head of HTTP/1.x as HttpServer reads it: a request line and
// headers, nothing of a body. Internal to telemetry/http_server.cc (and its
// test). Thread-compatible: pure functions.
#ifndef CONVEYOR_TELEMETRY_INTERNAL_HTTP_REQUEST_H_
#define CONVEYOR_TELEMETRY_INTERNAL_HTTP_REQUEST_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::telemetry::http_internal {

struct RequestHead {
  // 0 when the head is well-formed; otherwise the status to answer with
  // (400 or 505), `error` saying why, and the connection is closed after.
  int error_status = 0;
  std::string error;
  std::string method;
  std::string path;  // the target without its query and fragment
  bool http11 = false;
  // The client may send another request on this connection.
  bool keep_alive = false;
  // The request announced a body (Content-Length > 0 or Transfer-Encoding),
  // which this server never reads: it answers, then closes.
  bool has_body = false;
};

// Where the head that starts `buffer` ends (one past its blank line, CRLF or
// bare LF line ends alike), or npos while it is incomplete. Empty lines
// before the request line are part of it (RFC 9112 2.2 lets servers skip
// them).
size_t FindHeadEnd(absl::string_view buffer);

// Parses a complete head as FindHeadEnd delimits it.
RequestHead ParseRequestHead(absl::string_view head);

// "HTTP/1.1 404 Not Found" and the like, for the statuses the server sends.
absl::string_view StatusText(int status);

}  // namespace conveyor::telemetry::http_internal

#endif  // CONVEYOR_TELEMETRY_INTERNAL_HTTP_REQUEST_H_
