// WorkerSession's jobs (worker/session.h): PrepareJob and ProfileModel
// start a job thread, which builds a JobRunner, reports JobReady, waits for
// StartJob, runs the steps and reports JobEnded; CancelJob and DrainJob reach
// the runner from the reading thread. The stream side is in session.cc.
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/status_macros.h"
#include "scheduler/placement.h"  // NeighbourRanks
#include "scheduler/schedule.h"   // ParseScheduleKind, PlacementOf
#include "spdlog/spdlog.h"
#include "worker/internal/session_internal.h"
#include "worker/job_runner.h"
#include "worker/model_profile.h"
#include "worker/session.h"
#include "worker/step_report.h"

namespace conveyor::worker {
namespace {

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
    // The ranks next to this one's stages get data-plane series of their
    // own; the rest (the gradient norm's all-reduce) share one.
    std::vector<int> neighbours;
    if (absl::StatusOr<scheduler::ScheduleKind> kind =
            scheduler::ParseScheduleKind(program.schedule());
        kind.ok()) {
      neighbours = scheduler::NeighbourRanks(
          scheduler::PlacementOf(*kind), program.rank(), program.num_ranks(),
          program.num_stages());
    }
    metrics = options_.metrics->StartJob(program.job_id(), stages, neighbours);
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
