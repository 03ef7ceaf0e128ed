// GrpcCoordinatorDialer: the real CoordinatorDialerInterface
// (worker/coordinator_stream.h), which opens the worker's stream to the
// coordinator over gRPC (conveyor.v1.WorkerSession.Session): a fresh channel
// per stream, TLS when credentials are given, and the cluster's auth token
// (common/auth_token.h) in the call's metadata.
//
// Open does not block: the call starts at the stream's first Read, Write or
// WritesDone, which waits for the connection; a Cancel before or during that
// ends it at once. That lets WorkerSession's Shutdown cut short a connection
// attempt to an unresponsive address.
//
// Thread-safety: Open may be called from any thread; the streams keep
// CoordinatorStreamInterface's rules.
#ifndef CONVEYOR_WORKER_GRPC_COORDINATOR_STREAM_H_
#define CONVEYOR_WORKER_GRPC_COORDINATOR_STREAM_H_

#include <memory>
#include <string>

#include "worker/coordinator_stream.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace conveyor::worker {

class GrpcCoordinatorDialer final : public CoordinatorDialerInterface {
 public:
  // `coordinator` is host:port; null `credentials`: plaintext; empty
  // `auth_token`: none presented.
  GrpcCoordinatorDialer(std::string coordinator,
                        std::shared_ptr<grpc::ChannelCredentials> credentials,
                        std::string auth_token);

  std::unique_ptr<CoordinatorStreamInterface> Open() override;

 private:
  const std::string coordinator_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::string auth_token_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_GRPC_COORDINATOR_STREAM_H_
