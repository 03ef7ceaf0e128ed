#include "worker/session.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"
#include "worker/grpc_coordinator_stream.h"
#include "worker/internal/session_internal.h"

namespace conveyor::worker {
namespace {

constexpr std::chrono::milliseconds kDefaultHeartbeatInterval{1000};
constexpr std::chrono::milliseconds kMinHeartbeatInterval{10};

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Create(
    SessionOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("session: empty coordinator address");
  }
  if (options.name.empty()) {
    return absl::InvalidArgumentError("session: empty worker name");
  }
  return std::unique_ptr<WorkerSession>(new WorkerSession(std::move(options)));
}

WorkerSession::WorkerSession(SessionOptions options)
    : options_(std::move(options)),
      dialer_(options_.dialer != nullptr
                  ? options_.dialer
                  : std::make_shared<GrpcCoordinatorDialer>(
                        options_.coordinator, options_.credentials,
                        options_.auth_token)) {}

WorkerSession::~WorkerSession() { JoinJob(); }

std::string WorkerSession::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

int64_t WorkerSession::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

WorkerSession::Standing WorkerSession::standing() const {
  absl::MutexLock lock(&mu_);
  if (stopping_) return {false, "shutting down"};
  if (registered_) {
    return {true, absl::StrCat("registered with ", options_.coordinator, " as ",
                               worker_id_)};
  }
  return {false,
          absl::StrCat("not registered with ", options_.coordinator,
                       last_error_.empty() ? " yet" : ": ", last_error_)};
}

absl::Status WorkerSession::Run() {
  int failures = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    bool refused = false;
    const int64_t registered_before = registrations();
    absl::Status status = RunStream(&refused);
    if (refused) return status;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      // The coordinator that was to drain this worker is gone, and with it
      // the job (its session broke): nothing is left to hand over.
      if (draining_) {
        SPDLOG_WARN("{} while draining: shutting down",
                    std::string(status.message()));
        stopping_ = true;
        break;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      last_error_ = std::string(status.message());
    }
    if (registrations() > registered_before) failures = 0;
    // Warn once per outage; a coordinator that is down for an hour should
    // not fill the log with one line per second.
    if (failures++ == 0) {
      SPDLOG_WARN("{}; retrying every {} ms", std::string(status.message()),
                  options_.reconnect_interval.count());
    } else {
      SPDLOG_DEBUG("{} (attempt {})", std::string(status.message()), failures);
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                         absl::FromChrono(options_.reconnect_interval));
  }
  return absl::OkStatus();
}

void WorkerSession::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  // A registered worker's heartbeat thread sends Deregister first and only
  // then cancels the job: were the job cancelled here, its neighbours could
  // report the abort, and this rank its end, before the Deregister, and the
  // coordinator would blame a neighbour's symptom instead of this worker.
  if (!registered_) {
    CancelJobLocked(absl::CancelledError("worker shutting down"));
  }
  // Before registration nothing needs a graceful close; a connection
  // attempt to an unresponsive address could otherwise hold Run.
  if (stream_ != nullptr && !registered_) stream_->Cancel();
}

void WorkerSession::Drain(const std::string& reason) {
  std::shared_ptr<StreamWriter> writer;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    writer = registered_ ? writer_ : nullptr;
    draining_ = writer != nullptr;
  }
  // Without a coordinator there is no one to move the job to.
  v1::WorkerMessage m;
  m.mutable_drain()->set_reason(reason);
  if (writer == nullptr || !writer->Write(m)) {
    SPDLOG_INFO("not registered with a coordinator: shutting down at once");
    Shutdown();
    return;
  }
  SPDLOG_INFO("asked the coordinator to drain this worker: {}", reason);
}

absl::Status WorkerSession::RunStream(bool* refused) {
  std::unique_ptr<CoordinatorStreamInterface> stream = dialer_->Open();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    stream_ = stream.get();
    registered_ = false;
    stream_done_ = false;
  }
  auto writer = std::make_shared<StreamWriter>(stream.get());
  {
    absl::MutexLock lock(&mu_);
    writer_ = writer;
  }

  v1::WorkerMessage hello;
  v1::RegisterRequest* reg = hello.mutable_register_();
  reg->set_protocol_version(proto::kProtocolVersion);
  reg->set_version(kVersion);
  reg->set_name(options_.name);
  for (const std::string& d : options_.devices) reg->add_devices(d);
  reg->set_data_address(options_.data_address);
  reg->set_metrics_address(options_.metrics_address);
  reg->set_peak_flops_per_device(options_.peak_flops_per_device);
  // A failed write shows up as the end of the stream below. The first use
  // of the stream starts the call, which waits for the connection (a
  // Shutdown meanwhile cancels it); only then does the registration's
  // timeout start.
  writer->Write(hello);
  std::thread heartbeat(
      [this, stream = stream.get(), writer] { HeartbeatLoop(stream, writer); });

  bool registered = false;
  v1::CoordinatorMessage message;
  while (stream->Read(&message)) {
    if (!registered &&
        message.kind_case() != v1::CoordinatorMessage::kRegistered) {
      SPDLOG_WARN(
          "coordinator sent message kind {} before Registered; "
          "ignored",
          static_cast<int>(message.kind_case()));
      continue;
    }
    switch (message.kind_case()) {
      case v1::CoordinatorMessage::kRegistered: {
        if (registered) {
          SPDLOG_WARN("coordinator sent Registered twice; ignored");
          break;
        }
        registered = true;
        const int64_t ms = message.registered().heartbeat_interval_ms();
        absl::MutexLock lock(&mu_);
        registered_ = true;
        ++registrations_;
        worker_id_ = message.registered().worker_id();
        if (options_.metrics != nullptr) options_.metrics->SetConnected(true);
        heartbeat_interval_ = ms <= 0 ? kDefaultHeartbeatInterval
                                      : std::max(kMinHeartbeatInterval,
                                                 std::chrono::milliseconds(ms));
        SPDLOG_INFO(
            "registered with coordinator {} as {} (heartbeat every "
            "{} ms)",
            options_.coordinator, worker_id_, heartbeat_interval_.count());
        break;
      }
      case v1::CoordinatorMessage::kPrepare:
        OnPrepare(message.prepare(), writer);
        break;
      case v1::CoordinatorMessage::kStart:
        OnStart(message.start(), writer);
        break;
      case v1::CoordinatorMessage::kCancel:
        OnCancel(message.cancel());
        break;
      case v1::CoordinatorMessage::kProfile:
        OnProfile(message.profile(), writer);
        break;
      case v1::CoordinatorMessage::kDrain:
        OnDrain(message.drain(), writer);
        break;
      case v1::CoordinatorMessage::kLeave:
        SPDLOG_INFO("drained: {}; leaving", message.leave().reason());
        Shutdown();
        break;
      default:
        SPDLOG_WARN("coordinator sent an unknown message kind {}; ignored",
                    static_cast<int>(message.kind_case()));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    stream_done_ = true;
    writer_ = nullptr;
  }
  heartbeat.join();
  // Whatever the job still says can no longer reach the coordinator, which
  // has marked this worker lost; the job cannot finish usefully.
  writer->Close();
  {
    absl::MutexLock lock(&mu_);
    CancelJobLocked(
        absl::UnavailableError("lost the connection to the coordinator"));
  }
  JoinJob();
  const absl::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    registered_ = false;
  }
  if (options_.metrics != nullptr) options_.metrics->SetConnected(false);
  if (!registered) {
    if (status.code() == absl::StatusCode::kFailedPrecondition ||
        status.code() == absl::StatusCode::kUnauthenticated) {
      *refused = true;
      return status;
    }
    const std::string cause =
        proto::DescribeTransportFailure(status.message(), options_.tls);
    return absl::UnavailableError(absl::StrCat(
        "cannot register with coordinator ", options_.coordinator, ": ",
        cause.empty() ? "" : absl::StrCat(cause, " (gRPC: "),
        status.ok() ? "stream closed without an answer" : status.ToString(),
        cause.empty() ? "" : ")"));
  }
  return absl::UnavailableError(absl::StrCat(
      "session with coordinator ", options_.coordinator, " ended: ",
      status.ok() ? "closed by the coordinator" : status.ToString()));
}

void WorkerSession::HeartbeatLoop(CoordinatorStreamInterface* stream,
                                  const std::shared_ptr<StreamWriter>& writer) {
  absl::MutexLock lock(&mu_);
  // A coordinator that accepts the connection but never answers must not
  // hold the worker forever: cancel the call and reconnect.
  auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registered_ || stream_done_ || stopping_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&answered),
                            absl::FromChrono(options_.register_timeout))) {
    SPDLOG_WARN("coordinator {} did not answer the registration within {} ms",
                options_.coordinator, options_.register_timeout.count());
    stream->Cancel();
    return;
  }
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stream_done_ || stopping_;
  };
  while (!stream_done_ && !stopping_) {
    if (mu_.AwaitWithTimeout(absl::Condition(&wake),
                             absl::FromChrono(heartbeat_interval_))) {
      break;
    }
    v1::WorkerMessage beat;
    if (job_ != nullptr && !job_->ended) {
      beat.mutable_heartbeat()->set_job_id(job_->program.job_id());
    } else {
      beat.mutable_heartbeat();
    }
    // Unlocked: a write can wait on flow control, and the reading thread
    // must keep dispatching meanwhile.
    mu_.Unlock();
    writer->Write(beat);
    mu_.Lock();
  }
  if (stream_done_) return;
  // Shutdown. Leaving on purpose: the coordinator forgets this worker (and
  // fails or restarts its job naming it) instead of reporting it lost when
  // the stream closes. Deregister comes before anything the job says, so
  // the job's reason is this departure, not a neighbour's symptom of it.
  v1::WorkerMessage bye;
  bye.mutable_deregister()->set_reason("the worker is shutting down");
  mu_.Unlock();
  writer->Write(bye);
  mu_.Lock();
  // Then abandon the job, let it report its end (which the coordinator no
  // longer needs), close our side, and give the coordinator a moment to end
  // the call before cancelling it.
  CancelJobLocked(absl::CancelledError("worker shutting down"));
  auto job_reported = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return job_ == nullptr || job_->reported || stream_done_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&job_reported),
                       absl::FromChrono(options_.shutdown_grace));
  mu_.Unlock();
  writer->WritesDone();
  mu_.Lock();
  if (!mu_.AwaitWithTimeout(absl::Condition(&stream_done_),
                            absl::FromChrono(options_.shutdown_grace))) {
    stream->Cancel();
  }
}

}  // namespace conveyor::worker
