#include "worker/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/auth_token.h"
#include "common/build_info.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "job/job_spec.h"
#include "proto/protocol.h"
#include "spdlog/spdlog.h"
#include "worker/grpc_coordinator_stream.h"
#include "worker/job_runner.h"
#include "worker/model_profile.h"
#include "worker/step_report.h"

namespace conveyor::worker {
namespace {

constexpr std::chrono::milliseconds kDefaultHeartbeatInterval{1000};
constexpr std::chrono::milliseconds kMinHeartbeatInterval{10};

v1::WorkerMessage Ended(const std::string& job_id, v1::JobState state,
                        absl::string_view message, absl::StatusCode code) {
  v1::WorkerMessage m;
  v1::JobEnded* e = m.mutable_ended();
  e->set_job_id(job_id);
  e->set_state(state);
  e->set_message(std::string(message));
  e->set_code(static_cast<int>(code));
  return m;
}

}  // namespace

// Serializes the writes of the reading, heartbeat and job threads to one
// stream, and drops them once the stream is closed for writing or gone, so
// a job that outlives its stream never touches a dead or newer stream.
class WorkerSession::StreamWriter {
 public:
  explicit StreamWriter(CoordinatorStreamInterface* stream) : stream_(stream) {}

  // False when the message was not sent (stream closed or broken).
  bool Write(const v1::WorkerMessage& message) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || done_) return false;
    if (!stream_->Write(message)) {
      // The call is over; Read will say why.
      done_ = true;
      return false;
    }
    return true;
  }

  // Half-closes the stream: the coordinator sees the end of our messages.
  void WritesDone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || done_) return;
    done_ = true;
    stream_->WritesDone();
  }

  // The stream is about to be finished and destroyed.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  CoordinatorStreamInterface* stream_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One job, from PrepareJob to JobEnded. Fields other than the constant
// program and writer are guarded by the session's mu_.
struct WorkerSession::Job {
  v1::JobProgram program;
  // The stream the job came on; its reports go there only.
  std::shared_ptr<StreamWriter> writer;
  std::optional<std::vector<std::string>> peers;  // From StartJob.
  std::vector<std::string> peer_names;            // From StartJob.
  bool nccl = false;                              // From StartJob.
  absl::Status cancel;                            // Not OK once cancelled.
  JobRunner* runner = nullptr;  // While the job thread holds one.
  bool ended = false;           // The worker is no longer busy with it.
  bool reported = false;        // JobEnded written (or dropped).
  std::thread thread;
  // A ProfileModel job: `profile` is the request; once `profiled` (the
  // answer went out) the worker holds itself for the job's PrepareJob, and a
  // CancelJob must still be answered (`cancel_answered`).
  std::optional<v1::ProfileModel> profile;
  bool profiled = false;
  // The job file as profiling parsed it; handed from the profiled job to
  // its PrepareJob's, so the worker parses the file once.
  std::shared_ptr<const job::ParsedJob> parsed;
  bool cancel_answered = false;
  // Cancelled with `cancel`; installed on the job thread, so the job's
  // preparation and profile stop at its cancel (common/cancellation.h).
  Cancellation cancellation;
  // The step the job stopped after for a drain (DrainJob); 0: none.
  int64_t drained_after_step = 0;
};

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

void WorkerSession::OnPrepare(const v1::PrepareJob& prepare,
                              const std::shared_ptr<StreamWriter>& writer) {
  const v1::JobProgram& program = prepare.program();
  auto job = std::make_unique<Job>();
  job->program = program;
  job->writer = writer;
  if (std::optional<v1::WorkerMessage> refusal =
          StartJobThread(std::move(job))) {
    if (refusal->kind_case() != v1::WorkerMessage::kEnded) return;
    SPDLOG_WARN("refusing {}: {}", program.job_id(),
                refusal->ended().message());
    writer->Write(*refusal);
    return;
  }
  SPDLOG_INFO("preparing {}: {} of {}", program.job_id(), DescribeRank(program),
              program.num_ranks());
}

void WorkerSession::OnProfile(const v1::ProfileModel& profile,
                              const std::shared_ptr<StreamWriter>& writer) {
  auto job = std::make_unique<Job>();
  job->program.set_job_id(profile.job_id());
  job->writer = writer;
  job->profile = profile;
  if (std::optional<v1::WorkerMessage> refusal =
          StartJobThread(std::move(job))) {
    if (refusal->kind_case() != v1::WorkerMessage::kEnded) return;
    SPDLOG_WARN("refusing to profile {}: {}", profile.job_id(),
                refusal->ended().message());
    writer->Write(*refusal);
    return;
  }
  SPDLOG_INFO("profiling the layers of {}", profile.job_id());
}

std::optional<v1::WorkerMessage> WorkerSession::StartJobThread(
    std::unique_ptr<Job> job) {
  const std::string& id = job->program.job_id();
  std::unique_ptr<Job> previous;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return Ended(id, v1::FAILED, "worker shutting down",
                   absl::StatusCode::kUnavailable);
    }
    if (job_ != nullptr && !job_->ended) {
      if (job_->program.job_id() == id) {
        SPDLOG_WARN("a second request for {}; ignored", id);
        return v1::WorkerMessage();  // Nothing to answer.
      }
      return Ended(id, v1::FAILED,
                   absl::StrCat("worker busy with ", job_->program.job_id()),
                   absl::StatusCode::kFailedPrecondition);
    }
    if (job_ != nullptr && job_->profiled && job_->program.job_id() == id) {
      job->parsed = std::move(job_->parsed);
    }
    previous = std::move(job_);
    job_ = std::move(job);
    job_->thread = std::thread(&WorkerSession::JobMain, this, job_.get());
  }
  // The previous job has ended; its thread is at most finishing its report.
  if (previous != nullptr) previous->thread.join();
  return std::nullopt;
}

void WorkerSession::OnStart(const v1::StartJob& start,
                            const std::shared_ptr<StreamWriter>& writer) {
  {
    absl::MutexLock lock(&mu_);
    if (job_ != nullptr && job_->program.job_id() == start.job_id()) {
      if (job_->ended) return;  // It has reported its end already.
      if (job_->peers.has_value()) {
        SPDLOG_WARN("StartJob for {} again; ignored", start.job_id());
      } else {
        job_->peers.emplace(start.peers().begin(), start.peers().end());
        job_->peer_names.assign(start.peer_names().begin(),
                                start.peer_names().end());
        job_->nccl = start.nccl();
      }
      return;
    }
  }
  // The coordinator waits for this job to run: tell it that it never will.
  SPDLOG_WARN("StartJob for {}, which this worker does not hold",
              start.job_id());
  writer->Write(Ended(start.job_id(), v1::FAILED,
                      absl::StrCat("worker holds no prepared ", start.job_id()),
                      absl::StatusCode::kFailedPrecondition));
}

void WorkerSession::OnCancel(const v1::CancelJob& cancel) {
  std::shared_ptr<StreamWriter> answer_on;
  {
    absl::MutexLock lock(&mu_);
    // A profiled job waiting for its PrepareJob holds this worker until the
    // coordinator hears that the job is over here too.
    if (job_ != nullptr && job_->profiled && !job_->cancel_answered &&
        job_->program.job_id() == cancel.job_id()) {
      job_->cancel_answered = true;
      answer_on = job_->writer;
    }
  }
  if (answer_on != nullptr) {
    SPDLOG_INFO("{} cancelled after profiling: {}", cancel.job_id(),
                cancel.reason());
    answer_on->Write(Ended(cancel.job_id(), v1::CANCELLED, cancel.reason(),
                           absl::StatusCode::kCancelled));
    return;
  }
  absl::MutexLock lock(&mu_);
  if (job_ == nullptr || job_->ended ||
      job_->program.job_id() != cancel.job_id()) {
    SPDLOG_DEBUG("CancelJob for {}, which is not running here; ignored",
                 cancel.job_id());
    return;
  }
  SPDLOG_INFO("cancelling {}: {}", cancel.job_id(), cancel.reason());
  CancelJobLocked(absl::CancelledError(
      cancel.reason().empty() ? "cancelled" : cancel.reason()));
}

void WorkerSession::OnDrain(const v1::DrainJob& drain,
                            const std::shared_ptr<StreamWriter>& writer) {
  int64_t point = 0;
  {
    absl::MutexLock lock(&mu_);
    // A job that has ended here answers with its JobEnded.
    if (job_ == nullptr || job_->ended ||
        job_->program.job_id() != drain.job_id()) {
      SPDLOG_DEBUG("DrainJob for {}, which is not running here; ignored",
                   drain.job_id());
      return;
    }
    if (job_->runner == nullptr) {
      // Still preparing: the coordinator drains only running jobs, whose
      // ranks all hold their runner.
      SPDLOG_WARN("DrainJob for {} before it runs; ignored", drain.job_id());
      return;
    }
    if (drain.stop_after_step() > 0) {
      SPDLOG_INFO("{}: draining after step {}", drain.job_id(),
                  drain.stop_after_step());
      job_->runner->StopAfter(drain.stop_after_step());
      return;
    }
    point = job_->runner->RequestStop();
  }
  v1::WorkerMessage m;
  m.mutable_drain_point()->set_job_id(drain.job_id());
  m.mutable_drain_point()->set_step(point);
  writer->Write(m);
}

void WorkerSession::CancelJobLocked(const absl::Status& status) {
  if (job_ == nullptr || job_->ended || !job_->cancel.ok()) return;
  job_->cancel = status;
  job_->cancellation.Cancel(status);
  // Aborts the data plane, waking a blocked Recv or Connect now; a job
  // still building or waiting for StartJob sees job_->cancel instead.
  if (job_->runner != nullptr) job_->runner->Cancel(status);
}

void WorkerSession::JoinJob() {
  std::unique_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    job = std::move(job_);
  }
  if (job != nullptr && job->thread.joinable()) job->thread.join();
}

void WorkerSession::ProfileMain(Job* job) {
  const v1::ProfileModel& request = *job->profile;
  absl::StatusOr<ProfiledJob> profiled =
      ProfileJobModel(request, options_.backends, options_.devices);
  v1::WorkerMessage answer;
  {
    absl::MutexLock lock(&mu_);
    if (profiled.ok() && !job->cancel.ok()) profiled = job->cancel;
    job->ended = true;
    job->profiled = profiled.ok();
    // Kept for the job's PrepareJob (StartJobThread).
    if (profiled.ok()) job->parsed = profiled->parsed;
    // From here a CancelJob is answered by OnCancel.
  }
  if (profiled.ok()) {
    *answer.mutable_profile() = std::move(profiled->profile);
    SPDLOG_INFO("profiled {} layers of {} in {:.2f} s",
                answer.profile().layers_size(), request.job_id(),
                answer.profile().seconds());
  } else if (profiled.status().code() == absl::StatusCode::kCancelled) {
    answer = Ended(request.job_id(), v1::CANCELLED, profiled.status().message(),
                   profiled.status().code());
  } else {
    const std::string message =
        absl::StrCat("profiling the layers: ", profiled.status().message());
    SPDLOG_WARN("{} failed: {}", request.job_id(), message);
    answer =
        Ended(request.job_id(), v1::FAILED, message, profiled.status().code());
  }
  job->writer->Write(answer);
  absl::MutexLock lock(&mu_);
  job->reported = true;
}

void WorkerSession::JobMain(Job* job) {
  // Everything the job does on this thread, from parsing to its last step,
  // stops at its cancel: CancelJobLocked cancels this too.
  CancellationScope cancellable(&job->cancellation);
  if (job->profile.has_value()) {
    ProfileMain(job);
    return;
  }
  const v1::JobProgram& program = job->program;
  if (options_.metrics != nullptr) options_.metrics->SetBusy(true);
  absl::Status status;
  // The last line of defence for a job larger than this machine: sizes from
  // a job are checked before they are allocated (common/host_memory.h), but
  // an allocation that still fails must end the job, never the worker, which
  // serves the jobs after it. Everything the job built is released on the
  // way out.
  try {
    status = RunJob(job);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError(
        "out of host memory (std::bad_alloc): the job's model or data is too "
        "large for this worker");
  }
  if (options_.metrics != nullptr) {
    options_.metrics->JobEnded(status.ok() ? "succeeded"
                               : status.code() == absl::StatusCode::kCancelled
                                   ? "cancelled"
                                   : "failed");
    options_.metrics->SetBusy(false);
  }
  v1::WorkerMessage ended;
  int64_t drained = 0;
  {
    absl::MutexLock lock(&mu_);
    drained = job->drained_after_step;
  }
  if (status.ok() && drained > 0) {
    ended = Ended(program.job_id(), v1::CANCELLED,
                  absl::StrCat("drained after step ", drained),
                  absl::StatusCode::kCancelled);
    ended.mutable_ended()->set_drained_after_step(drained);
  } else if (status.ok()) {
    SPDLOG_INFO("{} succeeded", program.job_id());
    ended = Ended(program.job_id(), v1::SUCCEEDED, "", absl::StatusCode::kOk);
  } else if (status.code() == absl::StatusCode::kCancelled) {
    // Also when a peer's cancel reached this rank over the data plane
    // before the coordinator's CancelJob did.
    SPDLOG_INFO("{} cancelled: {}", program.job_id(),
                std::string(status.message()));
    ended =
        Ended(program.job_id(), v1::CANCELLED, status.message(), status.code());
  } else {
    const std::string message =
        absl::StrCat(DescribeRank(program), ": ", status.message());
    SPDLOG_WARN("{} failed: {}", program.job_id(), message);
    ended = Ended(program.job_id(), v1::FAILED, message, status.code());
  }
  // Idle before JobEnded goes out: the coordinator may send the next
  // PrepareJob as soon as it reads it.
  {
    absl::MutexLock lock(&mu_);
    job->ended = true;
  }
  job->writer->Write(ended);
  absl::MutexLock lock(&mu_);
  job->reported = true;
}

absl::Status WorkerSession::RunJob(Job* job) {
  const v1::JobProgram& program = job->program;
  // Declared before the runner: its channel reports here until destroyed.
  std::unique_ptr<JobMetrics> metrics;
  JobRunnerOptions runner_options = {
      .listen_address = options_.data_address,
      .connect_timeout = options_.data_connect_timeout,
      .auth_token = options_.auth_token,
      .backends = options_.backends,
      .parsed = job->parsed};
  if (options_.metrics != nullptr) {
    std::vector<int> stages;
    for (const v1::StageProgram& s : program.stages()) {
      stages.push_back(s.stage());
    }
    metrics = options_.metrics->StartJob(program.job_id(), stages);
    runner_options.observer = metrics.get();
  }
  runner_options.TEST_checkpoint_delay = options_.TEST_checkpoint_delay;
  runner_options.peak_flops_per_device = options_.peak_flops_per_device;
  // The coordinator commits a step's checkpoint once every rank's files are
  // in; it hears of them on the stream, before the next StepReport.
  runner_options.on_checkpoint = [this, job](const CheckpointWrite& write) {
    if (options_.metrics != nullptr) {
      options_.metrics->RecordCheckpoint(write.status.ok(), write.seconds,
                                         write.wait_seconds,
                                         write.snapshot_seconds);
    }
    if (!write.status.ok()) return;  // The job fails with the error.
    v1::WorkerMessage m;
    v1::CheckpointSaved* saved = m.mutable_checkpoint();
    saved->set_job_id(job->program.job_id());
    saved->set_step(write.step);
    saved->set_seconds(write.seconds);
    for (const v1::StageFile& f : write.files) *saved->add_files() = f;
    job->writer->Write(m);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<JobRunner> runner,
                   JobRunner::Create(program, runner_options));
  {
    absl::MutexLock lock(&mu_);
    // A cancel that came while the runner was being built.
    if (!job->cancel.ok()) return job->cancel;
    job->runner = runner.get();
  }
  // Declared after `runner`, so it runs first: nobody may cancel through
  // the pointer once the runner is being destroyed.
  absl::Cleanup forget_runner = [this, job] {
    absl::MutexLock lock(&mu_);
    job->runner = nullptr;
  };

  v1::WorkerMessage ready;
  ready.mutable_ready()->set_job_id(program.job_id());
  ready.mutable_ready()->set_data_endpoint(runner->data_endpoint());
  ready.mutable_ready()->set_device_uuid(runner->device_uuid());
  ready.mutable_ready()->set_nccl(runner->nccl());
  ready.mutable_ready()->set_peak_flops(runner->peak_flops());
  job->writer->Write(ready);
  SPDLOG_INFO("{} ready, data plane on {}", program.job_id(),
              runner->data_endpoint());

  std::vector<std::string> peers;
  bool nccl = false;
  {
    absl::MutexLock lock(&mu_);
    auto started = [job]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return job->peers.has_value() || !job->cancel.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&started),
                              absl::FromChrono(options_.prepare_timeout))) {
      return absl::DeadlineExceededError(
          absl::StrCat("no StartJob within ", options_.prepare_timeout.count(),
                       " ms of JobReady; giving the job up"));
    }
    if (!job->cancel.ok()) return job->cancel;
    peers = *job->peers;
    nccl = job->nccl;
    if (metrics != nullptr) metrics->SetPeerNames(job->peer_names);
  }
  RETURN_IF_ERROR(runner->Start(peers, nccl));
  SPDLOG_INFO("{} connected to {} peer(s), tensors over {}; running {} steps",
              program.job_id(), peers.size() - 1, nccl ? "NCCL" : "TCP",
              program.steps());
  absl::Cleanup note_drain = [this, job, &runner] {
    absl::MutexLock lock(&mu_);
    job->drained_after_step = runner->drained_after_step();
  };
  return runner->Run([&](const StepProgress& p) {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_step();
    r->set_job_id(program.job_id());
    r->set_step(p.step);
    r->set_learning_rate(p.learning_rate);
    // JobRunner always passes the executor's result.
    FillStepReport(*p.result, r);
    if (p.eval != nullptr) FillEvalReport(*p.eval, r);
    if (metrics != nullptr) metrics->RecordStep(*p.result);
    job->writer->Write(m);
    SPDLOG_DEBUG("{} step {}/{}: {:.3f} s", program.job_id(), p.step,
                 program.steps(), p.seconds);
  });
}

}  // namespace conveyor::worker
