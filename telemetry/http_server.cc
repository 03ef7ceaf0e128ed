#include "telemetry/http_server.h"

#include <algorithm>
#include <asio.hpp>  // io_context, ip::tcp, steady_timer, strand, async_*
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log_rate_limiter.h"
#include "spdlog/spdlog.h"
#include "telemetry/internal/http_request.h"

namespace conveyor::telemetry {

using tcp = asio::ip::tcp;
namespace internal = http_internal;

namespace {

class Connection;

// One accepted connection's place in the server's books.
struct Slot {
  std::weak_ptr<Connection> connection;
  std::string client;
  // Waiting for (the rest of) a request head: the connections that may be
  // closed to make room. False while a response is being written.
  bool waiting = true;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(std::map<std::string, HttpHandler> routes,
       const HttpServerOptions& options)
      : routes_(std::move(routes)),
        options_(options),
        acceptor_(io_),
        accept_retry_(io_),
        handler_pool_(static_cast<size_t>(options.handler_threads)) {}

  ~Impl() { Stop(); }

  // Binds and listens; returns the bound port.
  absl::StatusOr<int> Listen(const std::string& host, int port);
  void Run();
  void Stop();

  const std::string& address() const { return address_; }
  void set_address(std::string address) { address_ = std::move(address); }
  HttpServerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // For connections.
  const HttpServerOptions& options() const { return options_; }
  asio::thread_pool& handler_pool() { return handler_pool_; }
  HttpResponse Answer(const internal::RequestHead& head);
  void SetWaiting(uint64_t id, bool waiting) ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void Count(uint64_t HttpServerStats::*counter) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Accept();
  void OnAccept(const asio::error_code& error, tcp::socket socket);
  // Makes room for one more connection from `client`: false when none can
  // be made (every connection it would displace is answering).
  bool MakeRoom(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the oldest waiting connection among those `matches` accepts.
  bool EvictOldest(const std::function<bool(const Slot&)>& matches)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::map<std::string, HttpHandler> routes_;
  const HttpServerOptions options_;
  std::string address_;

  // Declared before io_ so that connections destroyed with io_'s pending
  // handlers can still take themselves off the books.
  mutable absl::Mutex mu_;
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);  // by age
  std::map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
  HttpServerStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  LogRateLimiter crowded_log_{5, std::chrono::minutes(1)};
  LogRateLimiter accept_log_{5, std::chrono::minutes(1)};

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  std::vector<std::thread> threads_;
  // After io_: handlers it still holds (and the connections they hold) go
  // before the sockets' io_context.
  asio::thread_pool handler_pool_;
  bool stopped_ = false;
};

namespace {

// Reads request heads and writes responses on one socket, every handler on
// the connection's strand (the socket's executor), so nothing here races.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl* server, tcp::socket socket, uint64_t id)
      : server_(server),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        id_(id) {}

  ~Connection() { server_->Forget(id_); }

  void Start() {
    asio::dispatch(socket_.get_executor(),
                   [self = shared_from_this()] { self->AwaitRequest(); });
  }

  // From any thread.
  void CloseSoon() {
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->Close(); });
  }

 private:
  void AwaitRequest() {
    server_->SetWaiting(id_, true);
    Arm(server_->options().request_timeout);
    Process();
  }

  // Answers the request at the front of in_, or reads more of it.
  void Process() {
    if (closed_) return;
    const size_t end = internal::FindHeadEnd(in_);
    if (end == std::string::npos) {
      if (in_.size() >= server_->options().max_request_bytes) {
        server_->Count(&HttpServerStats::bad_requests);
        Respond({431, "text/plain; charset=utf-8", "request head too large\n"},
                /*head_only=*/false, /*keep_alive=*/false);
        return;
      }
      Read();
      return;
    }
    const internal::RequestHead head =
        internal::ParseRequestHead(absl::string_view(in_).substr(0, end));
    in_.erase(0, end);
    if (head.error_status != 0) {
      server_->Count(&HttpServerStats::bad_requests);
      Respond({head.error_status, "text/plain; charset=utf-8",
               absl::StrCat(head.error, "\n")},
              false, false);
      return;
    }
    // Off the I/O threads: a slow handler must not stall other connections.
    // No deadline runs meanwhile; the connection counts as answering.
    server_->SetWaiting(id_, false);
    ++generation_;
    timer_.cancel();
    asio::post(server_->handler_pool(), [self = shared_from_this(), head] {
      HttpResponse response = self->server_->Answer(head);
      asio::post(self->socket_.get_executor(),
                 [self, head, response = std::move(response)] {
                   if (self->closed_) return;
                   self->Respond(response, head.method == "HEAD",
                                 head.keep_alive);
                 });
    });
  }

  void Read() {
    const size_t room = server_->options().max_request_bytes - in_.size();
    chunk_.resize(std::min<size_t>(room, 4096));
    socket_.async_read_some(
        asio::buffer(chunk_),
        [self = shared_from_this()](const asio::error_code& error, size_t n) {
          if (error || self->closed_) {
            self->Close();
            return;
          }
          self->in_.append(self->chunk_.data(), n);
          self->Process();
        });
  }

  void Respond(const HttpResponse& response, bool head_only, bool keep_alive) {
    server_->SetWaiting(id_, false);
    server_->Count(&HttpServerStats::requests);
    Arm(server_->options().write_timeout);
    out_ = absl::StrCat("HTTP/1.1 ", response.status, " ",
                        internal::StatusText(response.status),
                        "\r\nContent-Type: ", response.content_type,
                        "\r\nContent-Length: ", response.body.size(),
                        response.status == 405 ? "\r\nAllow: GET, HEAD" : "",
                        "\r\nConnection: ", keep_alive ? "keep-alive" : "close",
                        "\r\n\r\n");
    if (!head_only) out_ += response.body;
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this(), keep_alive](
                          const asio::error_code& error, size_t) {
                        if (error || !keep_alive || self->closed_) {
                          self->Close();
                          return;
                        }
                        self->out_.clear();
                        self->AwaitRequest();
                      });
  }

  // One deadline at a time: for the request head, then for the response.
  void Arm(std::chrono::milliseconds timeout) {
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(),
                       generation = ++generation_](const asio::error_code& e) {
      if (e || generation != self->generation_ || self->closed_) return;
      self->server_->Count(&HttpServerStats::timed_out);
      self->Close();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    asio::error_code ignored;
    timer_.cancel();
    // Shutdown first so a client mid-send sees the end promptly.
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    server_->Forget(id_);
  }

  HttpServer::Impl* const server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  const uint64_t id_;
  std::string in_;
  std::string chunk_;
  std::string out_;
  uint64_t generation_ = 0;
  bool closed_ = false;
};

}  // namespace

absl::StatusOr<int> HttpServer::Impl::Listen(const std::string& host,
                                             int port) {
  asio::error_code error;
  tcp::endpoint endpoint;
  if (const asio::ip::address ip = asio::ip::make_address(host, error);
      !error) {
    endpoint = tcp::endpoint(ip, static_cast<uint16_t>(port));
  } else {
    // A host name (Slurm passes the node's): its first address.
    tcp::resolver resolver(io_);
    const tcp::resolver::results_type found =
        resolver.resolve(host, std::to_string(port), error);
    if (error || found.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot resolve \"", host, "\"",
          error ? absl::StrCat(": ", error.message()) : std::string()));
    }
    endpoint = found.begin()->endpoint();
  }
  if (acceptor_.open(endpoint.protocol(), error) ||
      acceptor_.set_option(tcp::acceptor::reuse_address(true), error) ||
      acceptor_.bind(endpoint, error) ||
      acceptor_.listen(asio::socket_base::max_listen_connections, error)) {
    return absl::UnavailableError(error.message());
  }
  const tcp::endpoint bound = acceptor_.local_endpoint(error);
  if (error) return absl::UnavailableError(error.message());
  return static_cast<int>(bound.port());
}

void HttpServer::Impl::Run() {
  Accept();
  for (int i = 0; i < options_.io_threads; ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
}

void HttpServer::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  io_.stop();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  // Waits for running handlers; queued ones are dropped.
  handler_pool_.stop();
  handler_pool_.join();
  asio::error_code ignored;
  acceptor_.close(ignored);
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(
      asio::make_strand(io_),
      [this](const asio::error_code& error, tcp::socket socket) {
        OnAccept(error, std::move(socket));
      });
}

void HttpServer::Impl::OnAccept(const asio::error_code& error,
                                tcp::socket socket) {
  if (error == asio::error::operation_aborted) return;
  if (error) {
    // Out of file descriptors, most likely: the pending connection stays in
    // the backlog, so wait instead of spinning on it.
    uint64_t suppressed = 0;
    if (accept_log_.Allow(&suppressed)) {
      SPDLOG_WARN("metrics server on {}: accept failed: {}{}", address_,
                  error.message(),
                  suppressed ? absl::StrCat(" (and ", suppressed, " more)")
                             : std::string());
    }
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](const asio::error_code& e) {
      if (!e) Accept();
    });
    return;
  }
  asio::error_code peer_error;
  const tcp::endpoint peer = socket.remote_endpoint(peer_error);
  if (peer_error) {  // already reset by the client
    Accept();
    return;
  }
  std::shared_ptr<Connection> connection;
  {
    absl::MutexLock lock(&mu_);
    const std::string client = peer.address().to_string();
    if (!MakeRoom(client)) {
      ++stats_.refused;
      asio::error_code ignored;
      socket.close(ignored);
    } else {
      const uint64_t id = next_id_++;
      connection = std::make_shared<Connection>(this, std::move(socket), id);
      slots_[id] = Slot{connection, client, true};
      ++per_client_[client];
      ++stats_.accepted;
      ++stats_.open;
    }
  }
  if (connection != nullptr) connection->Start();
  Accept();
}

bool HttpServer::Impl::MakeRoom(const std::string& client) {
  const auto it = per_client_.find(client);
  const int from_client = it == per_client_.end() ? 0 : it->second;
  const bool client_full = from_client >= options_.max_connections_per_client;
  const bool all_full =
      static_cast<int64_t>(slots_.size()) >= options_.max_connections;
  if (!client_full && !all_full) return true;
  bool made = true;
  if (client_full) {
    made = EvictOldest(
        [&client](const Slot& slot) { return slot.client == client; });
  }
  if (made && static_cast<int64_t>(slots_.size()) >= options_.max_connections) {
    made = EvictOldest([](const Slot&) { return true; });
  }
  uint64_t suppressed = 0;
  if (crowded_log_.Allow(&suppressed)) {
    SPDLOG_WARN("metrics server on {}: {} connections open, {} from {}: {}{}",
                address_, slots_.size() + (made ? 1 : 0), from_client, client,
                made ? "closed the oldest one still waiting for its request"
                     : "refused a new one (all are answering)",
                suppressed
                    ? absl::StrCat(" (and ", suppressed, " more like it)")
                    : std::string());
  }
  return made;
}

bool HttpServer::Impl::EvictOldest(
    const std::function<bool(const Slot&)>& matches) {
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (!it->second.waiting || !matches(it->second)) continue;
    if (std::shared_ptr<Connection> victim = it->second.connection.lock()) {
      victim->CloseSoon();
    }
    if (--per_client_[it->second.client] == 0) {
      per_client_.erase(it->second.client);
    }
    slots_.erase(it);
    ++stats_.evicted;
    --stats_.open;
    return true;
  }
  return false;
}

void HttpServer::Impl::SetWaiting(uint64_t id, bool waiting) {
  absl::MutexLock lock(&mu_);
  if (const auto it = slots_.find(id); it != slots_.end()) {
    it->second.waiting = waiting;
  }
}

void HttpServer::Impl::Forget(uint64_t id) {
  absl::MutexLock lock(&mu_);
  const auto it = slots_.find(id);
  if (it == slots_.end()) return;
  if (--per_client_[it->second.client] == 0) {
    per_client_.erase(it->second.client);
  }
  slots_.erase(it);
  --stats_.open;
}

void HttpServer::Impl::Count(uint64_t HttpServerStats::*counter) {
  absl::MutexLock lock(&mu_);
  ++(stats_.*counter);
}

HttpServerStats HttpServer::Impl::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

HttpResponse HttpServer::Impl::Answer(const internal::RequestHead& head) {
  const auto route = routes_.find(head.path);
  if (route == routes_.end()) {
    std::string paths;
    for (const auto& [path, handler] : routes_) {
      absl::StrAppend(&paths, paths.empty() ? "" : ", ", path);
    }
    return {404, "text/plain; charset=utf-8",
            absl::StrCat("not found; this server answers ", paths, "\n")};
  }
  if (head.method != "GET" && head.method != "HEAD") {
    return {405, "text/plain; charset=utf-8", "only GET and HEAD\n"};
  }
  // A handler that throws (a collector's parse of /proc, say) must not take
  // the daemon down: the scrape fails, the daemon stays.
  try {
    return route->second();
  } catch (const std::exception& e) {
    return {500, "text/plain; charset=utf-8", absl::StrCat(e.what(), "\n")};
  } catch (...) {
    return {500, "text/plain; charset=utf-8", "internal error\n"};
  }
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() = default;

const std::string& HttpServer::address() const { return impl_->address(); }

HttpServerStats HttpServer::stats() const { return impl_->stats(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& address, std::map<std::string, HttpHandler> routes,
    const HttpServerOptions& options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535 || (address.front() == '[') != (address[colon - 1] == ']')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address \"", address,
        "\": expected host:port (IPv6 as [::1]:port; port 0 picks one)"));
  }
  if (options.io_threads < 1 || options.handler_threads < 1 ||
      options.max_connections < 1 || options.max_connections_per_client < 1 ||
      options.max_request_bytes < 64) {
    return absl::InvalidArgumentError(
        "HTTP server options: io_threads, handler_threads, max_connections and "
        "max_connections_per_client must be >= 1, max_request_bytes >= 64");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') {
    host = host.substr(1, host.size() - 2);
  }
  auto impl = std::make_unique<Impl>(std::move(routes), options);
  absl::StatusOr<int> bound = impl->Listen(host, port);
  if (!bound.ok()) {
    if (absl::IsInvalidArgument(bound.status())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "address \"", address, "\": ", bound.status().message()));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, ": ", bound.status().message(),
        " (is the address in use or not local?)"));
  }
  impl->set_address(absl::StrCat(address.substr(0, colon + 1), *bound));
  impl->Run();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace conveyor::telemetry
