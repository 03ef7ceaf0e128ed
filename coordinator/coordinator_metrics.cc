#include "coordinator/coordinator_metrics.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "google/protobuf/descriptor.h"
#include "proto/protocol.h"
#include "telemetry/daemon_metrics.h"

namespace conveyor::coordinator {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// "OK", "INVALID_ARGUMENT", ...: absl's codes and names are gRPC's.
std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// "/conveyor.v1.Coordinator/SubmitJob" -> "SubmitJob".
std::string ShortMethod(const std::string& method) {
  const size_t slash = method.rfind('/');
  return slash == std::string::npos ? method : method.substr(slash + 1);
}

// Lower-case state names for labels: "queued", "running", ...
std::string Lower(absl::string_view name) {
  return absl::AsciiStrToLower(std::string(name));
}

prometheus::ClientMetric GaugeSample(
    std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

// The label of a worker message's kind: its field name in WorkerMessage.
std::string MessageKindName(v1::WorkerMessage::KindCase kind) {
  const google::protobuf::FieldDescriptor* field =
      v1::WorkerMessage::descriptor()->FindFieldByNumber(kind);
  return field == nullptr ? "none" : field->name();
}

// Finer than DurationBuckets at the low end, where a healthy coordinator
// handles a message, with a bound at 10 ms, the heartbeat target
// (docs/operations.md "Fleet scale").
const prometheus::Histogram::BucketBoundaries& HandlingBuckets() {
  static const auto* const kBuckets =
      new prometheus::Histogram::BucketBoundaries{
          0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
          0.01,     0.025,   0.05,   0.1,     0.25,   1,     2.5,    10};
  return *kBuckets;
}

class CountingInterceptor final : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(CoordinatorMetrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->CountRequest(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  CoordinatorMetrics* const metrics_;
  const std::string method_;
};

class CountingFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(CoordinatorMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CountingInterceptor(metrics_, info->method());
  }

 private:
  CoordinatorMetrics* const metrics_;
};

// Read at scrape time from the jobs the manager holds, so an alert's
// clock is the manager's own record: when each running job last stepped
// and checkpointed (for the stall and stale-checkpoint alerts), and the
// newest kRecentEndedJobs ended jobs with their outcome and duration (the
// dashboard's recent-jobs table; bounded, so the series count stays flat).
constexpr size_t kRecentJobs = CoordinatorMetrics::kRecentEndedJobs;

std::vector<prometheus::MetricFamily> JobTimeFamilies(
    const std::vector<v1::Job>& jobs) {
  auto family = [](const char* name, const char* help) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = prometheus::MetricType::Gauge;
    return f;
  };
  prometheus::MetricFamily last_step =
      family("conveyor_job_last_step_timestamp_seconds",
             "Unix time of the running job's last completed step (its start "
             "before the first)");
  prometheus::MetricFamily last_checkpoint =
      family("conveyor_job_last_checkpoint_timestamp_seconds",
             "Unix time of the running job's newest committed checkpoint (its "
             "start before the first); jobs with checkpoint.every > 0");
  prometheus::MetricFamily interval =
      family("conveyor_job_checkpoint_interval_steps",
             "checkpoint.every of the running job; jobs with "
             "checkpoint.every > 0");
  prometheus::MetricFamily durations =
      family("conveyor_recent_job_duration_seconds",
             "Seconds from submission to the final state, for the newest 20 "
             "ended jobs");
  prometheus::MetricFamily ends =
      family("conveyor_recent_job_end_timestamp_seconds",
             "Unix time the job ended, for the newest 20 ended jobs");
  std::vector<const v1::Job*> ended;
  for (const v1::Job& job : jobs) {
    if (job.state() == v1::RUNNING && job.started_unix_ms() > 0) {
      const std::vector<prometheus::ClientMetric::Label> id = {
          {"job_id", job.id()}};
      const int64_t stepped =
          std::max(job.last_step_unix_ms(), job.started_unix_ms());
      last_step.metric.push_back(GaugeSample(id, stepped / 1000.0));
      if (job.checkpoint_every() > 0) {
        const int64_t saved =
            std::max(job.last_checkpoint_unix_ms(), job.started_unix_ms());
        last_checkpoint.metric.push_back(GaugeSample(id, saved / 1000.0));
        interval.metric.push_back(
            GaugeSample(id, static_cast<double>(job.checkpoint_every())));
      }
    }
    if (job.ended_unix_ms() > 0 &&
        (job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
         job.state() == v1::CANCELLED)) {
      ended.push_back(&job);
    }
  }
  const size_t keep = std::min(ended.size(), kRecentJobs);
  std::partial_sort(ended.begin(), ended.begin() + keep, ended.end(),
                    [](const v1::Job* a, const v1::Job* b) {
                      return a->ended_unix_ms() > b->ended_unix_ms();
                    });
  for (size_t i = 0; i < keep; ++i) {
    const v1::Job& job = *ended[i];
    const std::vector<prometheus::ClientMetric::Label> labels = {
        {"job_id", job.id()},
        {"name", job.name()},
        {"state", Lower(proto::JobStateName(job.state()))}};
    durations.metric.push_back(GaugeSample(
        labels,
        std::max<int64_t>(0, job.ended_unix_ms() - job.created_unix_ms()) /
            1000.0));
    ends.metric.push_back(GaugeSample(labels, job.ended_unix_ms() / 1000.0));
  }
  std::vector<prometheus::MetricFamily> out;
  for (prometheus::MetricFamily* f :
       {&last_step, &last_checkpoint, &interval, &durations, &ends}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      submitted_(BuildCounter()
                     .Name("conveyor_jobs_submitted_total")
                     .Help("Jobs accepted by SubmitJob")
                     .Register(*registry_)
                     .Add({})),
      finished_(BuildCounter()
                    .Name("conveyor_jobs_finished_total")
                    .Help("Jobs that reached a final state, by state")
                    .Register(*registry_)),
      // Not labelled by job: a restart loop must show on dashboards, but
      // the series count must not grow with the job history.
      restarts_(BuildCounter()
                    .Name("conveyor_job_restarts_total")
                    .Help("Times a job was re-planned after a failure "
                          "(restart: {max_restarts}), by reason and by "
                          "whether its layout changed (elastic)")
                    .Register(*registry_)),
      job_info_(BuildGauge()
                    .Name("conveyor_job_info")
                    .Help("1 while the job is queued, planning or running")
                    .Register(*registry_)),
      steps_(BuildCounter()
                 .Name("conveyor_job_steps_completed_total")
                 .Help("Steps every rank of the job has reported")
                 .Register(*registry_)),
      step_duration_(BuildHistogram()
                         .Name("conveyor_job_step_duration_seconds")
                         .Help("Step time (the slowest rank's) per step")
                         .Register(*registry_)),
      loss_(BuildGauge()
                .Name("conveyor_job_loss")
                .Help("Training loss of the last completed step")
                .Register(*registry_)),
      samples_per_second_(BuildGauge()
                              .Name("conveyor_job_samples_per_second")
                              .Help("Samples per second of the last step")
                              .Register(*registry_)),
      tokens_per_second_(BuildGauge()
                             .Name("conveyor_job_tokens_per_second")
                             .Help("Tokens per second of the last step (0 "
                                   "for jobs without tokens)")
                             .Register(*registry_)),
      bubble_ratio_(BuildGauge()
                        .Name("conveyor_job_bubble_ratio")
                        .Help("Schedule bubble of the last step: idle area "
                              "of its timeline over ranks x makespan")
                        .Register(*registry_)),
      receive_wait_ratio_(BuildGauge()
                              .Name("conveyor_job_receive_wait_ratio")
                              .Help("Mean over ranks of receive-wait time "
                                    "over step time, last step")
                              .Register(*registry_)),
      learning_rate_(BuildGauge()
                         .Name("conveyor_job_learning_rate")
                         .Help("Learning rate of the last completed step")
                         .Register(*registry_)),
      grad_norm_(BuildGauge()
                     .Name("conveyor_job_grad_norm")
                     .Help("Global L2 norm of the last step's gradients, "
                           "before clipping")
                     .Register(*registry_)),
      mfu_(BuildGauge()
               .Name("conveyor_job_mfu_ratio")
               .Help("Model FLOPs utilisation of the last step: the model's "
                     "training FLOP/s over the devices' peak "
                     "(conveyor-worker --peak-tflops)")
               .Register(*registry_)),
      tflops_per_device_(
          BuildGauge()
              .Name("conveyor_job_tflops_per_device")
              .Help("The model's training TFLOP/s per device of the job, "
                    "last step")
              .Register(*registry_)),
      memory_peak_(BuildGauge()
                       .Name("conveyor_job_memory_peak_bytes")
                       .Help("Device memory at the last step's peak on the "
                             "job's fullest device: held by tensors "
                             "(kind=allocated) and taken from the device "
                             "(kind=reserved)")
                       .Register(*registry_)),
      memory_capacity_(BuildGauge()
                           .Name("conveyor_job_memory_capacity_bytes")
                           .Help("Memory of the job's fullest device (host "
                                 "RAM for a CPU worker)")
                           .Register(*registry_)),
      eval_loss_(BuildGauge()
                     .Name("conveyor_eval_loss")
                     .Help("Mean loss over the validation batches of the "
                           "job's newest evaluation (eval: in the job)")
                     .Register(*registry_)),
      requests_(BuildCounter()
                    .Name("conveyor_grpc_server_requests_total")
                    .Help("Finished gRPC calls by method and status code")
                    .Register(*registry_)),
      message_handling_(
          BuildHistogram()
              .Name("conveyor_worker_message_handling_seconds")
              .Help("Time the coordinator took to handle one worker message "
                    "(heartbeat, step report, ...), from its read to the "
                    "next: the manager's lock wait, the handling and any "
                    "state-file write it caused")
              .Register(*registry_)) {
  telemetry::AddBuildInfo(*registry_, "coordinator");
  for (v1::JobState state : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    finished_.Add({{"state", Lower(proto::JobStateName(state))}});
  }
  // The common case exists from the start, so a dashboard shows 0, not
  // nothing.
  restarts_.Add({{"reason", "worker_lost"}, {"layout", "same"}});
}

CoordinatorMetrics::~CoordinatorMetrics() = default;

void CoordinatorMetrics::Attach(const JobManager* manager) {
  MutexLock lock(mu_);
  manager_ = manager;
}

void CoordinatorMetrics::CountRequest(const std::string& method,
                                      grpc::StatusCode code) {
  MutexLock lock(mu_);
  prometheus::Counter*& counter =
      request_counters_[{method, static_cast<int>(code)}];
  if (counter == nullptr) {
    counter = &requests_.Add(
        {{"method", ShortMethod(method)}, {"code", CodeName(code)}});
  }
  counter->Increment();
}

void CoordinatorMetrics::ObserveWorkerMessage(v1::WorkerMessage::KindCase kind,
                                              double seconds) {
  MutexLock lock(mu_);
  prometheus::Histogram*& histogram = message_histograms_[kind];
  if (histogram == nullptr) {
    histogram = &message_handling_.Add({{"kind", MessageKindName(kind)}},
                                       HandlingBuckets());
  }
  histogram->Observe(seconds);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CoordinatorMetrics::InterceptorFactory() {
  return std::make_unique<CountingFactory>(this);
}

void CoordinatorMetrics::OnSubmitted(const v1::Job& job) {
  submitted_.Increment();
  const prometheus::Labels labels = {{"job_id", job.id()}};
  MutexLock lock(mu_);
  jobs_[job.id()] =
      JobSeries{.info = &job_info_.Add({{"job_id", job.id()},
                                        {"name", job.name()},
                                        {"schedule", job.schedule()}}),
                .steps = &steps_.Add(labels),
                .step_duration =
                    &step_duration_.Add(labels, telemetry::DurationBuckets()),
                .loss = &loss_.Add(labels),
                .samples_per_second = &samples_per_second_.Add(labels),
                .tokens_per_second = &tokens_per_second_.Add(labels),
                .bubble_ratio = &bubble_ratio_.Add(labels),
                .receive_wait_ratio = &receive_wait_ratio_.Add(labels),
                .learning_rate = &learning_rate_.Add(labels),
                .grad_norm = &grad_norm_.Add(labels)};
  jobs_[job.id()].info->Set(1);
}

void CoordinatorMetrics::OnStep(const v1::Job& job,
                                const v1::StepSummary& step) {
  MutexLock lock(mu_);
  auto it = jobs_.find(job.id());
  if (it == jobs_.end()) return;
  JobSeries& s = it->second;
  s.steps->Increment();
  s.step_duration->Observe(step.seconds());
  if (step.has_loss()) s.loss->Set(step.loss());
  s.samples_per_second->Set(step.samples_per_second());
  s.tokens_per_second->Set(step.tokens_per_second());
  s.bubble_ratio->Set(step.bubble_fraction());
  s.receive_wait_ratio->Set(step.receive_wait_fraction());
  s.learning_rate->Set(step.learning_rate());
  s.grad_norm->Set(step.grad_norm());
  if (step.mfu() > 0) {
    if (s.mfu == nullptr) s.mfu = &mfu_.Add({{"job_id", job.id()}});
    s.mfu->Set(step.mfu());
  }
  if (step.tflops_per_device() > 0) {
    if (s.tflops_per_device == nullptr) {
      s.tflops_per_device = &tflops_per_device_.Add({{"job_id", job.id()}});
    }
    s.tflops_per_device->Set(step.tflops_per_device());
  }
  if (step.peak_memory_reserved_bytes() > 0) {
    if (s.memory_allocated == nullptr) {
      s.memory_allocated =
          &memory_peak_.Add({{"job_id", job.id()}, {"kind", "allocated"}});
      s.memory_reserved =
          &memory_peak_.Add({{"job_id", job.id()}, {"kind", "reserved"}});
      s.memory_capacity = &memory_capacity_.Add({{"job_id", job.id()}});
    }
    s.memory_allocated->Set(
        static_cast<double>(step.peak_memory_allocated_bytes()));
    s.memory_reserved->Set(
        static_cast<double>(step.peak_memory_reserved_bytes()));
    s.memory_capacity->Set(static_cast<double>(step.memory_capacity_bytes()));
  }
  if (step.has_eval()) {
    if (s.eval_loss == nullptr)
      s.eval_loss = &eval_loss_.Add({{"job_id", job.id()}});
    s.eval_loss->Set(step.eval_loss());
  }
}

void CoordinatorMetrics::OnFinished(const v1::Job& job) {
  finished_.Add({{"state", Lower(proto::JobStateName(job.state()))}})
      .Increment();
  MutexLock lock(mu_);
  auto it = jobs_.find(job.id());
  if (it == jobs_.end()) return;
  const JobSeries& s = it->second;
  job_info_.Remove(s.info);
  steps_.Remove(s.steps);
  step_duration_.Remove(s.step_duration);
  loss_.Remove(s.loss);
  samples_per_second_.Remove(s.samples_per_second);
  tokens_per_second_.Remove(s.tokens_per_second);
  bubble_ratio_.Remove(s.bubble_ratio);
  receive_wait_ratio_.Remove(s.receive_wait_ratio);
  learning_rate_.Remove(s.learning_rate);
  grad_norm_.Remove(s.grad_norm);
  if (s.eval_loss != nullptr) eval_loss_.Remove(s.eval_loss);
  if (s.mfu != nullptr) mfu_.Remove(s.mfu);
  if (s.tflops_per_device != nullptr) {
    tflops_per_device_.Remove(s.tflops_per_device);
  }
  if (s.memory_allocated != nullptr) {
    memory_peak_.Remove(s.memory_allocated);
    memory_peak_.Remove(s.memory_reserved);
    memory_capacity_.Remove(s.memory_capacity);
  }
  jobs_.erase(it);
}

void CoordinatorMetrics::OnRestarted(const v1::Job& /*job*/,
                                     absl::string_view reason,
                                     bool layout_changed) {
  restarts_
      .Add({{"reason", std::string(reason)},
            {"layout", layout_changed ? "changed" : "same"}})
      .Increment();
}

std::vector<prometheus::MetricFamily> CoordinatorMetrics::Collect() const {
  const JobManager* manager;
  {
    MutexLock lock(mu_);
    manager = manager_;
  }
  if (manager == nullptr) return {};
  std::map<std::string, double> jobs;
  for (v1::JobState state : {v1::QUEUED, v1::PLANNING, v1::RUNNING,
                             v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    jobs[Lower(proto::JobStateName(state))] = 0;
  }
  const std::vector<v1::Job> listed = manager->ListJobs();
  for (const v1::Job& job : listed) {
    ++jobs[Lower(proto::JobStateName(job.state()))];
  }
  std::map<std::string, double> workers = {
      {"idle", 0}, {"busy", 0}, {"lost", 0}, {"draining", 0}};
  prometheus::MetricFamily ages;
  ages.name = "conveyor_worker_heartbeat_age_seconds";
  ages.help = "Seconds since anything was heard from each live worker";
  ages.type = prometheus::MetricType::Gauge;
  for (const v1::Worker& w : manager->ListWorkers()) {
    // A draining worker is counted as draining, busy or idle alike.
    ++workers[w.draining() && w.state() != v1::LOST
                  ? std::string("draining")
                  : Lower(proto::WorkerStateName(w.state()))];
    if (w.state() != v1::LOST) {
      // Both labels: names need not be unique, and a scrape with two
      // identical series would be rejected whole.
      ages.metric.push_back(
          GaugeSample({{"worker", w.name()}, {"worker_id", w.id()}},
                      w.seconds_since_heartbeat()));
    }
  }
  std::vector<prometheus::MetricFamily> out(2);
  out[0].name = "conveyor_jobs";
  out[0].help = "Jobs in each state";
  out[0].type = prometheus::MetricType::Gauge;
  for (const auto& [state, n] : jobs) {
    out[0].metric.push_back(GaugeSample({{"state", state}}, n));
  }
  out[1].name = "conveyor_workers";
  out[1].help = "Registered workers by state";
  out[1].type = prometheus::MetricType::Gauge;
  for (const auto& [state, n] : workers) {
    out[1].metric.push_back(GaugeSample({{"state", state}}, n));
  }
  out.push_back(std::move(ages));
  prometheus::MetricFamily healthy;
  healthy.name = "conveyor_coordinator_state_file_healthy";
  healthy.help =
      "1 while the state file is written (or none is kept), 0 while writes "
      "fail and submissions and cancels are refused";
  healthy.type = prometheus::MetricType::Gauge;
  healthy.metric.push_back(
      GaugeSample({}, manager->StateFileError().empty() ? 1 : 0));
  out.push_back(std::move(healthy));
  for (prometheus::MetricFamily& family : JobTimeFamilies(listed)) {
    out.push_back(std::move(family));
  }
  return out;
}

}  // namespace conveyor::coordinator
