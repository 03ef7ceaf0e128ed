#include "worker/worker_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "telemetry/daemon_metrics.h"

namespace conveyor::worker {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const char* ErrorKind(transport::DataPlaneObserver::Error error) {
  using Error = transport::DataPlaneObserver::Error;
  switch (error) {
    case Error::kTimeout:
      return "timeout";
    case Error::kPeerLost:
      return "peer_lost";
    case Error::kBadFrame:
      return "bad_frame";
    case Error::kRejected:
      return "rejected";
  }
  return "unknown";
}

}  // namespace

WorkerMetrics::WorkerMetrics(std::string worker_name)
    : worker_(std::move(worker_name)),
      registry_(std::make_shared<prometheus::Registry>()),
      connected_(BuildGauge()
                     .Name("conveyor_worker_connected")
                     .Help("1 while the session with the coordinator is up")
                     .Register(*registry_)
                     .Add({{"worker", worker_}})),
      busy_(BuildGauge()
                .Name("conveyor_worker_busy")
                .Help("1 while the worker holds a job")
                .Register(*registry_)
                .Add({{"worker", worker_}})),
      jobs_(BuildCounter()
                .Name("conveyor_worker_jobs_total")
                .Help("Jobs this worker ran, by outcome")
                .Register(*registry_)),
      forward_(BuildCounter()
                   .Name("conveyor_stage_forward_seconds_total")
                   .Help("Time in the stage's forward, its data reads and loss")
                   .Register(*registry_)),
      dataloader_wait_(
          BuildCounter()
              .Name("conveyor_dataloader_wait_seconds_total")
              .Help("Of the stage's forward time, the time it waited for the "
                    "data loader: inputs, targets and document layouts")
              .Register(*registry_)),
      backward_(BuildCounter()
                    .Name("conveyor_stage_backward_seconds_total")
                    .Help("Time in the stage's backward (B, BI and BW)")
                    .Register(*registry_)),
      optimizer_(BuildCounter()
                     .Name("conveyor_stage_optimizer_seconds_total")
                     .Help("The worker's optimizer step, split over its "
                           "stages by parameter count")
                     .Register(*registry_)),
      communication_(BuildCounter()
                         .Name("conveyor_stage_communication_seconds_total")
                         .Help("Time handing tensors to the data plane and in "
                               "the gradient-norm reduction")
                         .Register(*registry_)),
      idle_(BuildCounter()
                .Name("conveyor_stage_idle_seconds_total")
                .Help("Time the stage's actions waited to receive a "
                      "tensor")
                .Register(*registry_)),
      microbatches_(BuildCounter()
                        .Name("conveyor_stage_microbatches_total")
                        .Help("Microbatches through the stage's forward")
                        .Register(*registry_)),
      receive_wait_ratio_(BuildGauge()
                              .Name("conveyor_stage_receive_wait_ratio")
                              .Help("Time the stage waited to receive tensors "
                                    "over the worker's step time, last step")
                              .Register(*registry_)),
      peak_activation_(BuildGauge()
                           .Name("conveyor_stage_peak_activation_bytes")
                           .Help("Most activation bytes the stage held at "
                                 "once, last step")
                           .Register(*registry_)),
      step_duration_(BuildHistogram()
                         .Name("conveyor_worker_step_duration_seconds")
                         .Help("This worker's step times")
                         .Register(*registry_)),
      sent_(BuildCounter()
                .Name("conveyor_dataplane_sent_bytes_total")
                .Help("Tensor bytes sent to each peer")
                .Register(*registry_)),
      received_(BuildCounter()
                    .Name("conveyor_dataplane_received_bytes_total")
                    .Help("Tensor bytes received from each peer")
                    .Register(*registry_)),
      transfer_(BuildHistogram()
                    .Name("conveyor_dataplane_transfer_duration_seconds")
                    .Help("Per tensor sent: from Send until the kernel took "
                          "its last byte")
                    .Register(*registry_)),
      receive_wait_(BuildCounter()
                        .Name("conveyor_dataplane_receive_wait_seconds_total")
                        .Help("Time the compute thread waited in receives")
                        .Register(*registry_)),
      errors_(BuildCounter()
                  .Name("conveyor_dataplane_errors_total")
                  .Help("Data-plane failures by kind")
                  .Register(*registry_)),
      checkpoint_saves_(BuildCounter()
                            .Name("conveyor_checkpoint_saves_total")
                            .Help("Stage checkpoint writes by outcome")
                            .Register(*registry_)),
      checkpoint_duration_(
          BuildHistogram()
              .Name("conveyor_checkpoint_save_duration_seconds")
              .Help("Time to write this worker's stage files of a checkpoint")
              .Register(*registry_)
              .Add({{"worker", worker_}}, telemetry::DurationBuckets())),
      checkpoint_wait_(
          BuildCounter()
              .Name("conveyor_checkpoint_wait_seconds_total")
              .Help("Time the step loop waited for a checkpoint write in "
                    "flight before it could start the next")
              .Register(*registry_)
              .Add({{"worker", worker_}})),
      checkpoint_snapshot_(
          BuildCounter()
              .Name("conveyor_checkpoint_snapshot_seconds_total")
              .Help("Time the step loop spent copying stages to host memory "
                    "for checkpoints")
              .Register(*registry_)
              .Add({{"worker", worker_}})),
      checkpoint_last_success_(
          BuildGauge()
              .Name("conveyor_checkpoint_last_success_timestamp_seconds")
              .Help("Unix time of the last good checkpoint save")
              .Register(*registry_)
              .Add({{"worker", worker_}})) {
  telemetry::AddBuildInfo(*registry_, "worker");
  // Present from the start, so rate() and dashboards see zeros rather than
  // nothing on a healthy worker.
  for (const char* outcome : {"succeeded", "failed", "cancelled"}) {
    jobs_.Add({{"worker", worker_}, {"outcome", outcome}});
  }
  for (auto error : {transport::DataPlaneObserver::Error::kTimeout,
                     transport::DataPlaneObserver::Error::kPeerLost,
                     transport::DataPlaneObserver::Error::kBadFrame,
                     transport::DataPlaneObserver::Error::kRejected}) {
    errors_.Add({{"worker", worker_}, {"kind", ErrorKind(error)}});
  }
  for (const char* outcome : {"success", "failure"}) {
    checkpoint_saves_.Add({{"worker", worker_}, {"outcome", outcome}});
  }
}

void WorkerMetrics::SetConnected(bool connected) {
  connected_.Set(connected ? 1 : 0);
}

void WorkerMetrics::SetBusy(bool busy) { busy_.Set(busy ? 1 : 0); }

void WorkerMetrics::JobEnded(const std::string& outcome) {
  jobs_.Add({{"worker", worker_}, {"outcome", outcome}}).Increment();
}

void WorkerMetrics::RecordCheckpoint(bool ok, double seconds,
                                     double wait_seconds,
                                     double snapshot_seconds) {
  checkpoint_wait_.Increment(wait_seconds);
  checkpoint_snapshot_.Increment(snapshot_seconds);
  checkpoint_saves_
      .Add({{"worker", worker_}, {"outcome", ok ? "success" : "failure"}})
      .Increment();
  if (!ok) return;
  checkpoint_duration_.Observe(seconds);
  checkpoint_last_success_.Set(
      std::chrono::duration<double>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::unique_ptr<JobMetrics> WorkerMetrics::StartJob(
    const std::string& job_id, const std::vector<int>& stages,
    std::vector<int> neighbours) {
  return std::unique_ptr<JobMetrics>(
      new JobMetrics(this, job_id, stages, std::move(neighbours)));
}

JobMetrics::JobMetrics(WorkerMetrics* owner, std::string job_id,
                       const std::vector<int>& stages,
                       std::vector<int> neighbours)
    : owner_(owner),
      job_id_(std::move(job_id)),
      neighbours_(std::move(neighbours)) {
  const prometheus::Labels job = {{"job_id", job_id_},
                                  {"worker", owner_->worker_}};
  for (int stage : stages) {
    prometheus::Labels labels = job;
    labels["stage"] = absl::StrCat(stage);
    stages_[stage] = StageSeries{
        .forward = &owner_->forward_.Add(labels),
        .dataloader_wait = &owner_->dataloader_wait_.Add(labels),
        .backward = &owner_->backward_.Add(labels),
        .optimizer = &owner_->optimizer_.Add(labels),
        .communication = &owner_->communication_.Add(labels),
        .idle = &owner_->idle_.Add(labels),
        .microbatches = &owner_->microbatches_.Add(labels),
        .receive_wait_ratio = &owner_->receive_wait_ratio_.Add(labels),
        .peak_activation_bytes = &owner_->peak_activation_.Add(labels)};
  }
  step_duration_ =
      &owner_->step_duration_.Add(job, telemetry::DurationBuckets());
  receive_wait_ = &owner_->receive_wait_.Add(job);
}

JobMetrics::~JobMetrics() {
  WorkerMetrics& o = *owner_;
  for (const auto& [stage, s] : stages_) {
    o.forward_.Remove(s.forward);
    o.dataloader_wait_.Remove(s.dataloader_wait);
    o.backward_.Remove(s.backward);
    o.optimizer_.Remove(s.optimizer);
    o.communication_.Remove(s.communication);
    o.idle_.Remove(s.idle);
    o.microbatches_.Remove(s.microbatches);
    o.receive_wait_ratio_.Remove(s.receive_wait_ratio);
    o.peak_activation_.Remove(s.peak_activation_bytes);
  }
  o.step_duration_.Remove(step_duration_);
  o.receive_wait_.Remove(receive_wait_);
  MutexLock lock(mu_);
  for (const auto& [rank, p] : peers_) {
    if (p.sent != nullptr) o.sent_.Remove(p.sent);
    if (p.received != nullptr) o.received_.Remove(p.received);
    if (p.transfer != nullptr) o.transfer_.Remove(p.transfer);
  }
}

void JobMetrics::SetPeerNames(std::vector<std::string> names) {
  MutexLock lock(mu_);
  peer_names_ = std::move(names);
}

void JobMetrics::RecordStep(const RankStepResult& step) {
  step_duration_->Observe(step.seconds);
  receive_wait_->Increment(step.wait_seconds);
  for (const auto& [stage, t] : step.stages) {
    auto it = stages_.find(stage);
    if (it == stages_.end()) continue;
    StageSeries& s = it->second;
    s.forward->Increment(t.forward_seconds);
    s.dataloader_wait->Increment(t.data_seconds);
    s.backward->Increment(t.backward_seconds);
    s.optimizer->Increment(t.optimizer_seconds);
    s.communication->Increment(t.communication_seconds);
    s.idle->Increment(t.idle_seconds);
    s.microbatches->Increment(static_cast<double>(t.microbatches));
    s.receive_wait_ratio->Set(step.seconds > 0 ? t.idle_seconds / step.seconds
                                               : 0);
    s.peak_activation_bytes->Set(static_cast<double>(t.peak_activation_bytes));
  }
}

JobMetrics::PeerSeries& JobMetrics::Peer(int rank) {
  // Not a neighbour: the gradient norm's all-reduce, which reaches every
  // rank; one series for all of them keeps the count flat in the ranks.
  const bool other = !neighbours_.empty() &&
                     std::find(neighbours_.begin(), neighbours_.end(), rank) ==
                         neighbours_.end();
  PeerSeries& p = peers_[other ? kOtherRanks : rank];
  if (p.sent == nullptr) {
    // Created on first traffic.
    const std::string name =
        other ? std::string("other-ranks")
        : rank >= 0 && static_cast<size_t>(rank) < peer_names_.size() &&
                !peer_names_[rank].empty()
            ? peer_names_[rank]
            : absl::StrCat("rank-", rank);
    const prometheus::Labels labels = {
        {"job_id", job_id_}, {"worker", owner_->worker_}, {"peer", name}};
    p.sent = &owner_->sent_.Add(labels);
    p.received = &owner_->received_.Add(labels);
    p.transfer = &owner_->transfer_.Add(labels, telemetry::DurationBuckets());
  }
  return p;
}

void JobMetrics::OnSent(int peer, uint64_t bytes,
                        std::chrono::steady_clock::duration took) {
  MutexLock lock(mu_);
  PeerSeries& p = Peer(peer);
  p.sent->Increment(static_cast<double>(bytes));
  p.transfer->Observe(std::chrono::duration<double>(took).count());
}

void JobMetrics::OnReceived(int peer, uint64_t bytes) {
  MutexLock lock(mu_);
  Peer(peer).received->Increment(static_cast<double>(bytes));
}

void JobMetrics::OnError(Error error) {
  owner_->errors_.Add({{"worker", owner_->worker_}, {"kind", ErrorKind(error)}})
      .Increment();
}

}  // namespace conveyor::worker
