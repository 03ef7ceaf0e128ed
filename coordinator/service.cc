#include "coordinator/service.h"

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/auth_token.h"
#include "common/mutex.h"
#include "common/printable.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"

namespace conveyor::coordinator {
namespace {

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

namespace {

using SessionReactorBase =
    grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>;

// What the JobManager holds for a worker's session (Send, Close), and the
// bookkeeping that decides when the session's stream may be finished.
//
// gRPC deletes the reactor after OnDone, which comes once Finish has been
// called and every read and write has seen its reaction. So the reactor is
// alive for as long as Finish has not been called, and Finish waits until
// nothing else is about to touch the stream: no write in flight and no
// hold (a message being handled, a read about to start). Whoever ends the
// last of these after a close calls Finish, once, outside the lock: a
// reaction may run on the calling thread.
class SessionConnection final : public WorkerConnection {
 public:
  explicit SessionConnection(SessionReactorBase* reactor) : reactor_(reactor) {}

  bool Send(const v1::CoordinatorMessage& message) override {
    const v1::CoordinatorMessage* next = nullptr;
    {
      MutexLock lock(mu_);
      if (closing_) return false;
      queue_.push_back(message);
      if (writing_) return true;
      writing_ = true;
      // A deque keeps its elements in place as it grows: the front stays
      // valid until OnWriteDone pops it.
      next = &queue_.front();
    }
    reactor_->StartWrite(next);
    return true;
  }

  // Messages queued before the close are still written first: a cancel
  // order followed by a close must reach the worker.
  void Close(const absl::Status& status) override {
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(mu_);
      if (closing_) return;
      SPDLOG_DEBUG("closing a worker session: {}", status.ToString());
      closing_ = true;
      status_ = proto::ToGrpcStatus(status);
      finish = TakeFinish();
    }
    if (finish.has_value()) reactor_->Finish(*std::move(finish));
  }

  void OnWriteDone(bool ok) {
    const v1::CoordinatorMessage* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(mu_);
      queue_.pop_front();
      if (!ok) {
        // The stream is broken: nothing more reaches the worker. Finishing
        // ends the outstanding read, which reports the loss.
        queue_.clear();
        if (!closing_) {
          closing_ = true;
          status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "a write to the worker failed");
        }
      }
      if (queue_.empty()) {
        writing_ = false;
        finish = TakeFinish();
      } else {
        next = &queue_.front();
      }
    }
    if (next != nullptr) reactor_->StartWrite(next);
    if (finish.has_value()) reactor_->Finish(*std::move(finish));
  }

  // Takes a hold for work that will touch the stream (handling a message,
  // then starting the next read); false once the session is closing, when
  // no more reads start.
  bool Hold() {
    MutexLock lock(mu_);
    if (closing_) return false;
    ++holds_;
    return true;
  }
  void Release() {
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(mu_);
      --holds_;
      finish = TakeFinish();
    }
    if (finish.has_value()) reactor_->Finish(*std::move(finish));
  }
  bool closing() const {
    MutexLock lock(mu_);
    return closing_;
  }

  // The session's reads have ended: the worker's goodbye, a broken
  // connection, or the Finish of a close. The session closes with
  // `status` unless it was closing already; in particular the manager's
  // close that follows a goodbye (it marks the worker lost) does not turn
  // a clean end into an error. Takes a hold that the caller releases once
  // the manager has been told.
  void ReadsEnded(const grpc::Status& status) {
    MutexLock lock(mu_);
    if (!closing_) {
      closing_ = true;
      status_ = status;
    }
    ++holds_;
  }

 private:
  // The status to Finish with, once, when the session is closing and
  // nothing touches its stream any more. The caller calls Finish after
  // releasing the lock: a reaction may run on the calling thread.
  std::optional<grpc::Status> TakeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closing_ || writing_ || holds_ > 0 || finished_) return std::nullopt;
    finished_ = true;
    return status_;
  }

  mutable Mutex mu_;
  SessionReactorBase* const reactor_;
  std::deque<v1::CoordinatorMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // queue_.front() in flight.
  int holds_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// One worker's session on gRPC's callback API: no thread of its own. Reads
// go one at a time; each message read is handled on the service's pool,
// which then starts the next read, so a session's messages are handled in
// order and a slow manager slows only the sessions waiting for it.
class SessionReactor final : public SessionReactorBase {
 public:
  SessionReactor(grpc::CallbackServerContext* context, JobManager* manager,
                 ThreadPool* pool,
                 const WorkerSessionService::MessageTimer* timer,
                 const std::string& auth_token)
      : context_(context),
        manager_(manager),
        pool_(pool),
        timer_(timer),
        connection_(std::make_shared<SessionConnection>(this)) {
    if (grpc::Status s = Authenticate(context, auth_token); !s.ok()) {
      connection_->Close(proto::FromGrpcStatus(s));
      return;
    }
    if (connection_->Hold()) {
      StartRead(&incoming_);
      connection_->Release();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      OnReadsEnded();
      return;
    }
    // A message that arrives after the manager closed the session (it
    // declared the worker lost) is dropped: no one is listening.
    if (!connection_->Hold()) return;
    pool_->Post([this, connection = connection_, message = std::move(incoming_),
                 read_at = std::chrono::steady_clock::now()] {
      Handle(message, read_at);
      if (!connection->closing()) {
        StartRead(&incoming_);
      } else if (!id_.empty()) {
        // No read is outstanding, so no read's end will report this one:
        // the session closed while the message was handled. The manager
        // closed it (the worker is lost already, and this changes nothing)
        // or a write to the worker failed, which the manager must hear of.
        manager_->WorkerDisconnected(
            id_, "a write to it failed (its control connection broke)");
      }
      // May finish, and so delete this (the connection lives on in the
      // task's copy until the call returns).
      connection->Release();
    });
  }

  void OnWriteDone(bool ok) override { connection_->OnWriteDone(ok); }

  void OnDone() override { delete this; }

 private:
  // On the pool, under a hold.
  void Handle(const v1::WorkerMessage& message,
              std::chrono::steady_clock::time_point read_at) {
    if (id_.empty()) {
      Register(message);
      return;
    }
    absl::Status s = manager_->HandleWorkerMessage(id_, message);
    if (*timer_) {
      (*timer_)(message.kind_case(),
                std::chrono::steady_clock::now() - read_at);
    }
    if (!s.ok()) {
      // No read follows: the manager hears of the end here (and closes
      // the session as it marks the worker lost).
      SPDLOG_WARN("{}: {}", id_, s.ToString());
      manager_->WorkerDisconnected(id_, std::string(s.message()));
      connection_->Close(s);
    }
  }

  void Register(const v1::WorkerMessage& first) {
    if (first.kind_case() != v1::WorkerMessage::kRegister) {
      connection_->Close(absl::FailedPreconditionError(
          "the first message of a session must be register"));
      return;
    }
    absl::StatusOr<v1::Registered> registered =
        manager_->RegisterWorker(first.register_(), connection_);
    if (!registered.ok()) {
      SPDLOG_WARN("refused worker '{}' at {}: {}", first.register_().name(),
                  context_->peer(), registered.status().ToString());
      connection_->Close(registered.status());
      return;
    }
    id_ = registered->worker_id();
  }

  // On a gRPC thread: the last read has ended. The manager hears of it on
  // the pool, and the stream finishes after that.
  void OnReadsEnded() {
    // Before registration there is no worker to lose.
    connection_->ReadsEnded(
        id_.empty() ? grpc::Status(grpc::StatusCode::CANCELLED,
                                   "session ended before registration")
                    : grpc::Status::OK);
    std::string id = id_;
    std::string reason =
        context_->IsCancelled()
            ? "its control connection closed (process exited or network "
              "failed)"
            : "it ended its session (shut down)";
    // From here the reactor may be deleted as soon as the hold is
    // released: the task keeps only what it needs.
    pool_->Post([manager = manager_, connection = connection_,
                 id = std::move(id), reason = std::move(reason)] {
      if (!id.empty()) manager->WorkerDisconnected(id, reason);
      connection->Release();
    });
  }

  grpc::CallbackServerContext* const context_;
  JobManager* const manager_;
  ThreadPool* const pool_;
  const WorkerSessionService::MessageTimer* const timer_;
  const std::shared_ptr<SessionConnection> connection_;
  v1::WorkerMessage incoming_;
  // Written only by the session's handling, one message at a time, and
  // read by OnReadsEnded after the last of them.
  std::string id_;
};

}  // namespace

SessionReactorBase* WorkerSessionService::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(context, manager_, &pool_, &timer_, auth_token_);
}

}  // namespace conveyor::coordinator
