// HttpServer: the small HTTP/1.1 server behind each daemon's
// --metrics-address (/metrics, /healthz, /readyz). It answers GET and HEAD
// for the paths it is given, 404 for any other path, 405 for other methods,
// 400/431/505 for requests it cannot read, and closes every connection that
// does not deliver a complete request in time.
//
// Why our own, on Asio: the embedded civetweb of prometheus-cpp crashed both
// daemons on any path but /metrics (SIGSEGV on its small thread stacks) and
// let two silent connections block every scrape for tens of seconds. Here no
// connection can hold a thread: all I/O is asynchronous, each connection has
// one deadline for its request head (slow and silent clients are closed,
// however they trickle bytes) and one for writing its response, a request
// head is bounded in bytes, and the number of connections is bounded per
// client and in all. When a bound is reached the oldest connection that is
// still waiting for its request is closed to make room, so a flood of idle
// connections cannot lock out a scraper; only when every connection is busy
// answering is a new one refused.
//
// Thread-safe. Handlers run on the server's handler threads (two by default),
// several at once, so they must be thread-safe; while every handler thread is
// busy, requests wait for one.
#ifndef CONVEYOR_TELEMETRY_HTTP_SERVER_H_
#define CONVEYOR_TELEMETRY_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor::telemetry {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Answers one GET (or HEAD: the body is then left out) of its path.
using HttpHandler = std::function<HttpResponse()>;

struct HttpServerOptions {
  // From a connection's accept, or from the end of its previous response,
  // to a complete request head. Well under Prometheus' 10 s scrape timeout,
  // and far above what a client on any network needs to send ~200 bytes.
  std::chrono::milliseconds request_timeout{3000};
  // To write one response.
  std::chrono::milliseconds write_timeout{10000};
  // A request line and headers larger than this get 431.
  size_t max_request_bytes = 16 * 1024;
  // Open connections from one client address, and in all: bounded so that
  // nobody can use up the daemon's file descriptors through this port.
  int max_connections_per_client = 64;
  int max_connections = 512;
  // Threads for the sockets, and threads for the handlers: a handler that
  // blocks (a collector waiting for a daemon's lock) delays its own
  // responses, never the accepting, reading and deadlines of others.
  int io_threads = 1;
  int handler_threads = 2;
};

// Counts since Start, for tests and logs.
struct HttpServerStats {
  int64_t open = 0;           // connections open now
  uint64_t accepted = 0;      // connections accepted
  uint64_t requests = 0;      // requests answered (any status)
  uint64_t timed_out = 0;     // closed at a deadline
  uint64_t evicted = 0;       // closed to make room for a newer connection
  uint64_t refused = 0;       // closed at accept: every slot busy answering
  uint64_t bad_requests = 0;  // answered 400, 431 or 505
};

class HttpServer {
 public:
  // `address` is "host:port" (IPv6 as "[::1]:port"; port 0 picks a free
  // port, see address()); `routes` maps exact paths ("/metrics") to their
  // handlers, the query string ignored. InvalidArgument for a malformed
  // address or options; Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& address, std::map<std::string, HttpHandler> routes,
      const HttpServerOptions& options = {});

  // Closes the listener and every connection; waits for running handlers.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // "host:port" with the bound port.
  const std::string& address() const;
  HttpServerStats stats() const;

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::telemetry

#endif  // CONVEYOR_TELEMETRY_HTTP_SERVER_H_
