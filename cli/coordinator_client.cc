#include "cli/coordinator_client.h"

#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth_token.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/answered_by.h"
#include "proto/protocol.h"

namespace conveyor::cli {

std::string ResolveCoordinatorAddress(absl::string_view flag) {
  if (!flag.empty()) return std::string(flag);
  if (const char* env = std::getenv(kCoordinatorEnv);
      env != nullptr && *env != '\0') {
    return env;
  }
  return kDefaultCoordinatorAddress;
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    std::string address, absl::Duration rpc_timeout, std::string auth_token,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    proto::ClientTls tls) {
  if (address.empty()) {
    return absl::InvalidArgumentError("the coordinator address is empty");
  }
  if (rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the RPC timeout must be positive; got ",
                     absl::FormatDuration(rpc_timeout)));
  }
  grpc::ChannelArguments args;
  // Jobs travel as YAML and a watch event carries the whole job: both ends
  // accept up to the protocol's limit, not gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      address,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(),
      args);
  return std::unique_ptr<CoordinatorClient>(new CoordinatorClient(
      std::move(address), rpc_timeout, std::move(auth_token),
      v1::Coordinator::NewStub(channel), tls));
}

void CoordinatorClient::Authenticate(grpc::ClientContext& context) const {
  if (!auth_token_.empty()) {
    context.AddMetadata(kAuthMetadataKey, AuthMetadataValue(auth_token_));
  }
}

void CoordinatorClient::SetDeadline(grpc::ClientContext& context) const {
  Authenticate(context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
}

absl::Status CoordinatorClient::FromGrpc(
    const grpc::Status& status, const grpc::ClientContext& context) const {
  absl::Status s = proto::FromGrpcStatus(status);
  // The coordinator's own UNAVAILABLE (it cannot write its state file):
  // its message says what happened, and where to point the CLI is not the
  // question.
  if (s.code() == absl::StatusCode::kUnavailable &&
      !proto::AnsweredBy(context).empty()) {
    return absl::Status(s.code(), absl::StrCat("the coordinator at ", address_,
                                               ": ", s.message()));
  }
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
      // A refused TLS handshake is no reason to check --coordinator.
      if (const std::string cause =
              proto::DescribeTransportFailure(s.message(), tls_);
          !cause.empty()) {
        return absl::UnavailableError(
            absl::StrCat("cannot talk to the coordinator at ", address_, ": ",
                         cause, " (gRPC: ", s.message(), ")"));
      }
      return absl::UnavailableError(
          absl::StrCat("cannot reach the coordinator at ", address_,
                       " (set --coordinator "
                       "or ",
                       kCoordinatorEnv, "): ", s.message()));
    case absl::StatusCode::kUnauthenticated:
      return absl::UnauthenticatedError(absl::StrCat("the coordinator at ",
                                                     address_,
                                                     " refused the call (set "
                                                     "--auth-token-file or ",
                                                     kAuthTokenFileEnv,
                                                     " to the cluster's "
                                                     "token file): ",
                                                     s.message()));
    case absl::StatusCode::kDeadlineExceeded:
      return absl::DeadlineExceededError(
          absl::StrCat("the coordinator at ", address_, " did not answer in ",
                       absl::FormatDuration(rpc_timeout_), ": ", s.message()));
    default:
      return s;
  }
}

absl::StatusOr<v1::Job> CoordinatorClient::SubmitJob(
    const v1::SubmitJobRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::SubmitJobResponse response;
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, context);
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::Job> CoordinatorClient::GetJob(const std::string& id) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status status = stub_->GetJob(&context, request, &job);
  if (!status.ok()) return FromGrpc(status, context);
  return job;
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListJobs() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListJobsResponse response;
  grpc::Status status =
      stub_->ListJobs(&context, v1::ListJobsRequest(), &response);
  if (!status.ok()) return FromGrpc(status, context);
  return response;
}

absl::StatusOr<v1::Job> CoordinatorClient::CancelJob(const std::string& id) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::CancelJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status status = stub_->CancelJob(&context, request, &job);
  if (!status.ok()) return FromGrpc(status, context);
  return job;
}

absl::StatusOr<std::vector<v1::Worker>> CoordinatorClient::ListWorkers() {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ListWorkersResponse response;
  grpc::Status status =
      stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  if (!status.ok()) return FromGrpc(status, context);
  return std::vector<v1::Worker>(response.workers().begin(),
                                 response.workers().end());
}

absl::StatusOr<v1::Worker> CoordinatorClient::DrainWorker(
    const std::string& worker, const std::string& reason) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::DrainWorkerRequest request;
  request.set_worker(worker);
  request.set_reason(reason);
  v1::Worker drained;
  grpc::Status status = stub_->DrainWorker(&context, request, &drained);
  if (!status.ok()) return FromGrpc(status, context);
  return drained;
}

absl::StatusOr<v1::Trace> CoordinatorClient::GetTrace(const std::string& id,
                                                      int64_t step) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetTraceRequest request;
  request.set_job_id(id);
  request.set_step(step);
  v1::Trace trace;
  grpc::Status status = stub_->GetTrace(&context, request, &trace);
  if (!status.ok()) return FromGrpc(status, context);
  return trace;
}

absl::Status CoordinatorClient::WatchJob(
    const std::string& id,
    const std::function<void(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext context;
  {
    absl::MutexLock lock(&mutex_);
    if (watches_cancelled_) {
      return absl::CancelledError(absl::StrCat("watch of ", id, " cancelled"));
    }
    watches_.insert(&context);
  }
  Authenticate(context);
  v1::WatchJobRequest request;
  request.set_id(id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      stub_->WatchJob(&context, request);
  v1::JobEvent event;
  while (reader->Read(&event)) on_event(event);
  grpc::Status status = reader->Finish();
  {
    absl::MutexLock lock(&mutex_);
    watches_.erase(&context);
  }
  return FromGrpc(status, context);
}

void CoordinatorClient::CancelWatches() {
  absl::MutexLock lock(&mutex_);
  watches_cancelled_ = true;
  for (grpc::ClientContext* context : watches_) context->TryCancel();
}

}  // namespace conveyor::cli
