#include "tests/cli/fake_coordinator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "job/job_spec.h"
#include "job/planner.h"
#include "proto/protocol.h"

namespace conveyor::cli::testing {
namespace {

constexpr absl::Duration kSlice = absl::Milliseconds(5);
constexpr double kStepSeconds = 0.002;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

void FakeCoordinator::AddWorker(const std::string& name) {
  absl::MutexLock lock(&mutex_);
  v1::Worker w;
  w.set_name(name);
  w.set_data_address("127.0.0.1:0");
  AddWorkerLocked(std::move(w));
}

std::string FakeCoordinator::AddWorkerLocked(v1::Worker worker) {
  const std::string id = absl::StrCat("worker-", next_worker_++);
  worker.set_id(id);
  worker.set_state(v1::IDLE);
  worker.set_version("fake");
  worker.add_devices("cpu:1");
  worker.set_seconds_since_heartbeat(0.25);
  worker.set_registered_unix_ms(NowMs());
  workers_[id] = std::move(worker);
  return id;
}

std::vector<v1::SubmitJobRequest> FakeCoordinator::submitted() const {
  absl::MutexLock lock(&mutex_);
  return submitted_;
}

std::vector<std::string> FakeCoordinator::cancelled() const {
  absl::MutexLock lock(&mutex_);
  return cancelled_;
}

grpc::Status FakeCoordinator::SubmitJob(grpc::ServerContext*,
                                        const v1::SubmitJobRequest* request,
                                        v1::SubmitJobResponse* response) {
  {
    absl::MutexLock lock(&mutex_);
    submitted_.push_back(*request);
  }
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpec(
      request->yaml(), request->file_name(), request->base_dir());
  if (!spec.ok()) return proto::ToGrpcStatus(spec.status());
  absl::StatusOr<job::JobPlan> plan = job::PlanJob(*std::move(spec));
  if (!plan.ok()) return proto::ToGrpcStatus(plan.status());

  absl::MutexLock lock(&mutex_);
  int live = 0;
  for (const auto& [id, w] : workers_) live += w.state() != v1::LOST;
  if (live < plan->num_ranks) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the job needs ", plan->num_ranks,
                                     " workers; the cluster has ", live));
  }
  v1::Job job;
  job.set_id(absl::StrCat("job-", next_job_++));
  job.set_name(plan->job.name);
  job.set_state(v1::QUEUED);
  job.set_queue_position(1);
  job.set_steps_total(plan->job.training.steps);
  job.set_schedule(plan->job.pipeline.schedule);
  job.set_num_stages(plan->num_stages);
  job.set_num_workers(plan->num_ranks);
  job.set_virtual_stages(plan->virtual_stages);
  job.set_batch_size(plan->job.training.batch_size);
  job.set_microbatches(static_cast<int32_t>(plan->job.training.microbatches));
  job.set_checkpoint_dir(plan->job.checkpoint.dir);
  job.set_created_unix_ms(NowMs());
  for (const job::StagePlan& s : plan->stages) {
    v1::StagePlacement* p = job.add_stages();
    p->set_stage(s.stage);
    p->set_rank(s.rank);
    p->set_first_layer(s.first_layer);
    p->set_num_layers(s.num_layers);
    p->set_num_params(s.num_params);
  }
  *response->mutable_job() = job;
  job_order_.push_back(job.id());
  jobs_[job.id()].job = std::move(job);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::GetJob(grpc::ServerContext*,
                                     const v1::GetJobRequest* request,
                                     v1::Job* response) {
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(request->id());
  if (it == jobs_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown job '", request->id(), "'"));
  }
  *response = it->second.job;
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::ListJobs(grpc::ServerContext*,
                                       const v1::ListJobsRequest*,
                                       v1::ListJobsResponse* response) {
  absl::MutexLock lock(&mutex_);
  for (const std::string& id : job_order_) {
    *response->add_jobs() = jobs_[id].job;
  }
  response->set_warning(options_.jobs_warning);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::CancelJob(grpc::ServerContext*,
                                        const v1::CancelJobRequest* request,
                                        v1::Job* response) {
  absl::MutexLock lock(&mutex_);
  cancelled_.push_back(request->id());
  auto it = jobs_.find(request->id());
  if (it == jobs_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown job '", request->id(), "'"));
  }
  JobEntry& entry = it->second;
  if (!proto::IsTerminal(entry.job.state())) {
    entry.cancel_requested = true;
    // Nobody drives it: it ends now rather than at its next step.
    if (!entry.driven) EndJobLocked(entry, v1::CANCELLED, "cancelled by user");
  }
  *response = entry.job;
  return grpc::Status::OK;
}

void FakeCoordinator::EndJobLocked(JobEntry& entry, v1::JobState state,
                                   const std::string& message) {
  entry.job.set_state(state);
  entry.job.set_message(message);
  entry.job.set_ended_unix_ms(NowMs());
  for (auto& [id, w] : workers_) {
    if (w.job_id() == entry.job.id()) {
      w.set_state(v1::IDLE);
      w.clear_job_id();
      w.clear_stages();
    }
  }
}

grpc::Status FakeCoordinator::WatchJob(
    grpc::ServerContext* context, const v1::WatchJobRequest* request,
    grpc::ServerWriter<v1::JobEvent>* writer) {
  v1::JobEvent event;
  bool drive = false;
  {
    absl::MutexLock lock(&mutex_);
    auto it = jobs_.find(request->id());
    if (it == jobs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("unknown job '", request->id(), "'"));
    }
    *event.mutable_job() = it->second.job;
    if (!proto::IsTerminal(it->second.job.state()) && !it->second.driven) {
      it->second.driven = true;
      drive = true;
    }
  }
  if (!writer->Write(event) || proto::IsTerminal(event.job().state())) {
    return grpc::Status::OK;
  }
  if (!drive) {
    // Another stream drives the job: follow its state.
    v1::Job last = event.job();
    while (!context->IsCancelled()) {
      absl::SleepFor(kSlice);
      v1::JobEvent next;
      {
        absl::MutexLock lock(&mutex_);
        *next.mutable_job() = jobs_[request->id()].job;
      }
      if (next.job().state() == last.state() &&
          next.job().steps_done() == last.steps_done()) {
        continue;
      }
      last = next.job();
      if (!writer->Write(next) || proto::IsTerminal(last.state())) break;
    }
    return grpc::Status::OK;
  }

  // Writes the job as it is now (and `step`, if given); false when the job
  // has ended or the watcher left.
  auto publish = [&](const v1::StepSummary* step) {
    v1::JobEvent e;
    {
      absl::MutexLock lock(&mutex_);
      *e.mutable_job() = jobs_[request->id()].job;
    }
    if (step != nullptr) *e.mutable_step() = *step;
    return writer->Write(e) && !proto::IsTerminal(e.job().state());
  };
  {
    absl::MutexLock lock(&mutex_);
    JobEntry& entry = jobs_[request->id()];
    entry.job.set_state(v1::PLANNING);
    entry.job.set_queue_position(0);
    int rank = 0;
    for (auto& [id, w] : workers_) {
      if (rank == entry.job.num_workers()) break;
      if (w.state() != v1::IDLE) continue;
      w.set_state(v1::BUSY);
      w.set_job_id(entry.job.id());
      entry.job.add_worker_ids(id);
      for (v1::StagePlacement& s : *entry.job.mutable_stages()) {
        if (s.rank() == rank) {
          s.set_worker_id(id);
          w.add_stages(s.stage());
        }
      }
      ++rank;
    }
  }
  if (!publish(nullptr)) return grpc::Status::OK;
  {
    absl::MutexLock lock(&mutex_);
    JobEntry& entry = jobs_[request->id()];
    entry.job.set_state(v1::RUNNING);
    entry.job.set_started_unix_ms(NowMs());
  }
  if (!publish(nullptr)) return grpc::Status::OK;

  const int64_t total = event.job().steps_total();
  for (int64_t step = 1; step <= total; ++step) {
    for (absl::Duration slept; slept < options_.step_delay; slept += kSlice) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      absl::SleepFor(kSlice);
    }
    v1::StepSummary summary;
    {
      absl::MutexLock lock(&mutex_);
      JobEntry& entry = jobs_[request->id()];
      if (entry.cancel_requested) {
        EndJobLocked(entry, v1::CANCELLED, "cancelled by user");
      } else {
        const int ranks = entry.job.num_workers();
        summary.set_step(step);
        summary.set_has_loss(true);
        summary.set_loss(1.0 / static_cast<double>(step));
        summary.set_seconds(kStepSeconds);
        summary.set_samples_per_second(
            static_cast<double>(entry.job.batch_size()) / kStepSeconds);
        summary.set_learning_rate(0.003);
        summary.set_bubble_fraction(ranks > 1 ? 0.25 : 0);
        for (int r = 0; r < ranks; ++r) {
          v1::RankStep* rs = summary.add_ranks();
          rs->set_rank(r);
          rs->set_seconds(kStepSeconds);
          rs->set_wait_seconds(ranks > 1 ? kStepSeconds / 4 : 0);
        }
        entry.job.set_steps_done(step);
        entry.job.set_has_loss(true);
        entry.job.set_last_loss(summary.loss());
        entry.job.set_last_step_seconds(kStepSeconds);
        entry.job.set_samples_per_second(summary.samples_per_second());
      }
    }
    if (!publish(summary.step() > 0 ? &summary : nullptr)) {
      return grpc::Status::OK;
    }
    if (options_.outcome == v1::FAILED && step == options_.fail_after_step) {
      break;
    }
  }
  {
    absl::MutexLock lock(&mutex_);
    EndJobLocked(
        jobs_[request->id()], options_.outcome,
        options_.outcome == v1::SUCCEEDED ? "" : options_.failure_message);
  }
  publish(nullptr);
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::ListWorkers(grpc::ServerContext*,
                                          const v1::ListWorkersRequest*,
                                          v1::ListWorkersResponse* response) {
  absl::MutexLock lock(&mutex_);
  for (const auto& [id, w] : workers_) *response->add_workers() = w;
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::Session(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>*
        stream) {
  v1::WorkerMessage message;
  if (!stream->Read(&message) || !message.has_register_()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the first message must be a RegisterRequest");
  }
  std::string id;
  {
    absl::MutexLock lock(&mutex_);
    v1::Worker w;
    w.set_name(message.register_().name());
    w.set_data_address(message.register_().data_address());
    id = AddWorkerLocked(std::move(w));
  }
  v1::CoordinatorMessage registered;
  registered.mutable_registered()->set_worker_id(id);
  registered.mutable_registered()->set_heartbeat_interval_ms(1000);
  stream->Write(registered);
  while (stream->Read(&message)) {
  }
  absl::MutexLock lock(&mutex_);
  workers_[id].set_state(v1::LOST);
  workers_[id].set_lost_reason("session ended");
  return grpc::Status::OK;
}

}  // namespace conveyor::cli::testing
