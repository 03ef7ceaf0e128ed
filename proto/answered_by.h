// AnsweredBy: tells a client whether an error came from the coordinator
// itself or from the way to it. Both arrive as gRPC statuses with the same
// codes: UNAVAILABLE is what a refused connection gives and also what the
// coordinator answers when it cannot write its state file, and the two call
// for opposite advice ("check --coordinator" against "the coordinator is
// up; its disk is full"). The server's interceptor marks every answer with
// trailing metadata, which only a call that reached the server carries.
// Thread-safe.
#ifndef CONVEYOR_PROTO_ANSWERED_BY_H_
#define CONVEYOR_PROTO_ANSWERED_BY_H_

#include <memory>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/support/server_interceptor.h"

namespace conveyor::proto {

// The trailing metadata key; its value names the server ("coordinator").
inline constexpr char kAnsweredByKey[] = "conveyor-answered-by";

// For grpc::ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
AnsweredByInterceptorFactory(std::string server);

// After a finished call: the server's name when the server itself answered,
// "" when the status came from the transport (connection refused, TLS
// handshake failed, deadline before an answer).
std::string AnsweredBy(const grpc::ClientContext& context);

}  // namespace conveyor::proto

#endif  // CONVEYOR_PROTO_ANSWERED_BY_H_
