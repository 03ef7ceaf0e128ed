#include "coordinator/service.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/auth_token.h"
#include "common/printable.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {
namespace {

using SessionStream =
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>;

// One worker's session as the JobManager sees it: Send queues, a writer
// thread writes (gRPC allows one write in flight per stream, and a write may
// wait for the worker to read), Close cancels the call so the handler's
// blocking Read returns.
class StreamConnection final : public WorkerConnection {
 public:
  StreamConnection(grpc::ServerContext* context, SessionStream* stream)
      : context_(context), stream_(stream) {
    writer_ = std::thread([this] { RunWriter(); });
  }
  ~StreamConnection() override { Stop(); }

  bool Send(const v1::CoordinatorMessage& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    queue_.push_back(message);
    cv_.notify_one();
    return true;
  }

  void Close(const absl::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      SPDLOG_DEBUG("closing a worker session: {}", status.ToString());
      cv_.notify_one();
      // The handler has stopped reading and returns on its own: cancelling
      // would turn the worker's clean goodbye into CANCELLED.
      if (read_done_) return;
    }
    context_->TryCancel();
  }

  // The handler's Read returned false: the session is ending.
  void MarkReadDone() {
    std::lock_guard<std::mutex> lock(mu_);
    read_done_ = true;
  }

  // Called by the handler before it returns: after this the stream and
  // context may go away.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      cv_.notify_one();
    }
    if (writer_.joinable()) writer_.join();
  }

 private:
  void RunWriter() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      // Messages queued before Close are still written: a cancel order
      // followed by a close must reach the worker first.
      if (queue_.empty()) return;
      v1::CoordinatorMessage m = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      const bool ok = stream_->Write(m);
      lock.lock();
      if (!ok) {
        closed_ = true;
        lock.unlock();
        context_->TryCancel();
        return;
      }
    }
  }

  grpc::ServerContext* context_;
  SessionStream* stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::CoordinatorMessage> queue_;
  bool closed_ = false;
  bool read_done_ = false;
  std::thread writer_;
};

// OK when no token is configured or the call presents it; UNAUTHENTICATED
// otherwise, logged with the caller's address but never what it presented.
grpc::Status Authenticate(const grpc::ServerContextBase* context,
                          const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find(kAuthMetadataKey);
  const bool present = it != metadata.end();
  if (present &&
      AuthMetadataMatches(
          absl::string_view(it->second.data(), it->second.size()), token)) {
    return grpc::Status::OK;
  }
  const char* why = present ? "a wrong auth token" : "no auth token";
  SPDLOG_WARN("refused a call from {}: {}", context->peer(), why);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat("the coordinator requires an auth token "
                                   "(--auth-token-file); the call carried ",
                                   why));
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* context,
                                           const v1::SubmitJobRequest* request,
                                           v1::SubmitJobResponse* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = manager_->SubmitJob(*request);
  if (!job.ok()) return proto::ToGrpcStatus(job.status());
  *response->mutable_job() = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context,
                                        const v1::GetJobRequest* request,
                                        v1::Job* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = manager_->GetJob(request->id());
  if (!job.ok()) return proto::ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const v1::ListJobsRequest*,
                                          v1::ListJobsResponse* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  for (v1::Job& job : manager_->ListJobs()) {
    *response->add_jobs() = std::move(job);
  }
  if (const std::string error = manager_->StateFileError(); !error.empty()) {
    response->set_warning(absl::StrCat(
        "the coordinator cannot write its state file, so it refuses "
        "submissions and cancels until it can: ",
        error));
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* context,
                                           const v1::CancelJobRequest* request,
                                           v1::Job* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  absl::StatusOr<v1::Job> job =
      manager_->CancelJob(request->id(), "cancelled by user");
  if (!job.ok()) return proto::ToGrpcStatus(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

namespace {

// A watch refused before it started: finishes at once with `status`.
class RefusedWatch final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  explicit RefusedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) {
    return new RefusedWatch(s);
  }
  std::optional<StreamLimiter::Slot> slot = watches_.Acquire(context->peer());
  if (!slot.has_value()) {
    return new RefusedWatch(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                         watches_.Refusal(context->peer())));
  }
  return hub_.Watch(request->id(), *std::move(slot));
}

grpc::Status CoordinatorService::ListWorkers(
    grpc::ServerContext* context, const v1::ListWorkersRequest*,
    v1::ListWorkersResponse* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  for (v1::Worker& w : manager_->ListWorkers()) {
    *response->add_workers() = std::move(w);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::DrainWorker(
    grpc::ServerContext* context, const v1::DrainWorkerRequest* request,
    v1::Worker* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  // The reason reaches logs, terminals and events.
  const std::string& reason = request->reason();
  if (reason.size() > 1024 || HasControlCharacters(reason)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "drain: the reason must be at most 1024 bytes of "
                        "text without control characters");
  }
  absl::StatusOr<v1::Worker> worker =
      manager_->DrainWorker(request->worker(), request->reason());
  if (!worker.ok()) return proto::ToGrpcStatus(worker.status());
  *response = *std::move(worker);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetTrace(grpc::ServerContext* context,
                                          const v1::GetTraceRequest* request,
                                          v1::Trace* response) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  absl::StatusOr<v1::Trace> trace =
      manager_->GetTrace(request->job_id(), request->step());
  if (!trace.ok()) return proto::ToGrpcStatus(trace.status());
  *response = *std::move(trace);
  return grpc::Status::OK;
}

grpc::Status WorkerSessionService::Session(grpc::ServerContext* context,
                                           SessionStream* stream) {
  if (grpc::Status s = Authenticate(context, auth_token_); !s.ok()) return s;
  v1::WorkerMessage first;
  if (!stream->Read(&first)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "session ended before registration");
  }
  if (first.kind_case() != v1::WorkerMessage::kRegister) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the first message of a session must be register");
  }
  auto connection = std::make_shared<StreamConnection>(context, stream);
  absl::StatusOr<v1::Registered> registered =
      manager_->RegisterWorker(first.register_(), connection);
  if (!registered.ok()) {
    SPDLOG_WARN("refused worker '{}' at {}: {}", first.register_().name(),
                context->peer(), registered.status().ToString());
    connection->Stop();
    return proto::ToGrpcStatus(registered.status());
  }
  const std::string id = registered->worker_id();
  v1::WorkerMessage message;
  std::string reason;
  while (stream->Read(&message)) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = manager_->HandleWorkerMessage(id, message);
    if (timer_) {
      timer_(message.kind_case(), std::chrono::steady_clock::now() - start);
    }
    if (!s.ok()) {
      SPDLOG_WARN("{}: {}", id, s.ToString());
      reason = std::string(s.message());
      break;
    }
  }
  if (reason.empty()) {
    connection->MarkReadDone();
    reason = context->IsCancelled()
                 ? "its control connection closed (process exited or "
                   "network failed)"
                 : "it ended its session (shut down)";
  }
  manager_->WorkerDisconnected(id, reason);
  connection->Stop();
  return grpc::Status::OK;
}

}  // namespace conveyor::coordinator
