// What gRPC's own failures mean, said in Conveyor's words.
//
// A refused TLS handshake reaches a client as "Socket closed" and the
// server's log as a raw gRPC line; neither says which side is wrong. These
// turn them into the likely cause, for the CLI's and the worker's errors
// and for the daemons' logs (rate-limited: a port scanner must not flood
// them).
// Thread-safe.
#ifndef CONVEYOR_PROTO_GRPC_DIAGNOSTICS_H_
#define CONVEYOR_PROTO_GRPC_DIAGNOSTICS_H_

#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::proto {

// How this end of the control plane is set up.
struct ClientTls {
  bool tls = false;          // --tls-ca given
  bool client_cert = false;  // --tls-cert given
};

// The likely cause of a call that never reached the server, from gRPC's
// status message; "" when nothing better than the message can be said
// (a refused connection, an unresolvable name).
std::string DescribeTransportFailure(absl::string_view grpc_message,
                                     const ClientTls& tls);

// The likely cause of a handshake a server refused, from gRPC's log line;
// "" when the line is not about a handshake.
std::string DescribeRefusedHandshake(absl::string_view grpc_log_line);

// Routes gRPC's log lines: a daemon's go to spdlog (a refused handshake as
// a rate-limited warning naming the likely cause, other errors rate-limited,
// the rest at debug); a CLI's are dropped, since the status of the failed
// call says it all, once. Call once, early in main.
enum class GrpcLogs { kDaemon, kQuiet };
void RouteGrpcLogs(GrpcLogs mode);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_GRPC_DIAGNOSTICS_H_
