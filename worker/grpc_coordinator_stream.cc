#include "worker/grpc_coordinator_stream.h"

#include <mutex>
#include <utility>

#include "common/auth_token.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/protocol.h"

namespace conveyor::worker {
namespace {

using Stream =
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>;

class GrpcCoordinatorStream final : public CoordinatorStreamInterface {
 public:
  GrpcCoordinatorStream(std::shared_ptr<grpc::Channel> channel,
                        const std::string& auth_token)
      : stub_(v1::WorkerSession::NewStub(std::move(channel))) {
    if (!auth_token.empty()) {
      context_.AddMetadata(kAuthMetadataKey, AuthMetadataValue(auth_token));
    }
  }

  bool Read(v1::CoordinatorMessage* message) override {
    return Started()->Read(message);
  }

  bool Write(const v1::WorkerMessage& message) override {
    return Started()->Write(message);
  }

  void WritesDone() override { Started()->WritesDone(); }

  absl::Status Finish() override {
    return proto::FromGrpcStatus(Started()->Finish());
  }

  // ClientContext::TryCancel is thread-safe, and takes effect on a call not
  // started yet too.
  void Cancel() override { context_.TryCancel(); }

 private:
  // Starts the call once, from whichever thread uses the stream first.
  // Starting sends the initial metadata, which waits for the connection.
  Stream* Started() {
    std::call_once(started_, [this] { stream_ = stub_->Session(&context_); });
    return stream_.get();
  }

  std::unique_ptr<v1::WorkerSession::Stub> stub_;
  grpc::ClientContext context_;
  std::once_flag started_;
  std::unique_ptr<Stream> stream_;  // Set once started_.
};

}  // namespace

GrpcCoordinatorDialer::GrpcCoordinatorDialer(
    std::string coordinator,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    std::string auth_token)
    : coordinator_(std::move(coordinator)),
      credentials_(std::move(credentials)),
      auth_token_(std::move(auth_token)) {}

std::unique_ptr<CoordinatorStreamInterface> GrpcCoordinatorDialer::Open() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  // A fresh channel per attempt: no reconnect backoff carried over from the
  // last outage, so attempts really come every reconnect_interval.
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      coordinator_,
      credentials_ != nullptr ? credentials_
                              : grpc::InsecureChannelCredentials(),
      args);
  return std::make_unique<GrpcCoordinatorStream>(std::move(channel),
                                                 auth_token_);
}

}  // namespace conveyor::worker
