#include "proto/grpc_diagnostics.h"

#include <grpc/support/log.h>

#include <chrono>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log_rate_limiter.h"
#include "spdlog/spdlog.h"

namespace conveyor::proto {
namespace {

LogRateLimiter& HandshakeLimiter() {
  static auto* limiter = new LogRateLimiter(10, std::chrono::minutes(1));
  return *limiter;
}
LogRateLimiter& ErrorLimiter() {
  static auto* limiter = new LogRateLimiter(10, std::chrono::minutes(1));
  return *limiter;
}

std::string More(uint64_t suppressed) {
  return suppressed > 0 ? absl::StrCat(" (and ", suppressed, " more like it)")
                        : std::string();
}

void ToSpdlog(gpr_log_func_args* args) {
  const absl::string_view message = args->message;
  if (const std::string cause = DescribeRefusedHandshake(message);
      !cause.empty()) {
    uint64_t suppressed = 0;
    if (HandshakeLimiter().Allow(&suppressed)) {
      SPDLOG_WARN("refused a TLS handshake: {} (gRPC: {}){}", cause,
                  std::string(message), More(suppressed));
    }
    return;
  }
  if (args->severity == GPR_LOG_SEVERITY_ERROR) {
    uint64_t suppressed = 0;
    if (ErrorLimiter().Allow(&suppressed)) {
      SPDLOG_ERROR("gRPC {}:{}: {}{}", args->file, args->line,
                   std::string(message), More(suppressed));
    }
    return;
  }
  SPDLOG_DEBUG("gRPC {}:{}: {}", args->file, args->line, std::string(message));
}

void Drop(gpr_log_func_args*) {}

}  // namespace

std::string DescribeTransportFailure(absl::string_view m,
                                     const ClientTls& tls) {
  if (absl::StrContains(m, "certificate verify failed")) {
    return "the coordinator's TLS certificate is not trusted: it is not "
           "signed by the CA given with --tls-ca, has expired, or does not "
           "name the address dialled in its subjectAltName";
  }
  if (tls.tls && absl::StrContains(m, "wrong version number")) {
    return "the coordinator does not speak TLS: it serves plaintext (leave "
           "out --tls-ca), or this is not the coordinator's port";
  }
  if (absl::StrContains(m, "Socket closed") ||
      absl::StrContains(m, "Connection reset")) {
    if (!tls.tls) {
      return "the coordinator closed the connection: it probably serves TLS "
             "(give --tls-ca, and --tls-cert/--tls-key if it requires client "
             "certificates)";
    }
    return tls.client_cert
               ? "the coordinator refused the TLS handshake: it probably does "
                 "not accept this client certificate (--tls-cert not signed "
                 "by the coordinator's --tls-ca, or expired)"
               : "the coordinator refused the TLS handshake: it probably "
                 "requires a client certificate (give --tls-cert and "
                 "--tls-key, signed by the coordinator's --tls-ca)";
  }
  return "";
}

std::string DescribeRefusedHandshake(absl::string_view line) {
  if (!absl::StrContains(line, "Handshake failed")) return "";
  if (absl::StrContains(line, "wrong version number") ||
      absl::StrContains(line, "http request") ||
      absl::StrContains(line, "packet length too long")) {
    return "a client spoke plaintext (or another protocol) to this TLS port";
  }
  if (absl::StrContains(line, "peer did not return a certificate")) {
    return "a client presented no certificate, which --tls-ca requires";
  }
  if (absl::StrContains(line, "certificate verify failed") ||
      absl::StrContains(line, "unknown ca") ||
      absl::StrContains(line, "certificate expired")) {
    return "a peer's certificate is not signed by --tls-ca, or has expired";
  }
  return "the TLS handshake failed";
}

void RouteGrpcLogs(GrpcLogs mode) {
  gpr_set_log_function(mode == GrpcLogs::kDaemon ? ToSpdlog : Drop);
}

}  // namespace conveyor::proto
