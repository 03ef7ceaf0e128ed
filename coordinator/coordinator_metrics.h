// CoordinatorMetrics: the coordinator's Prometheus metrics (docs/metrics.md).
//
// Three sources: the JobManager's state, read at scrape time (jobs and
// workers by state, heartbeat ages), so the gauges are never stale and cost
// nothing between scrapes; the manager's job events (JobObserver: steps,
// loss, throughput, bubble), whose per-job series go when the job ends; and
// a gRPC server interceptor counting every finished call by method and code.
//
// Thread-safe.
#ifndef CONVEYOR_COORDINATOR_COORDINATOR_METRICS_H_
#define CONVEYOR_COORDINATOR_COORDINATOR_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "coordinator/job_manager.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace conveyor::coordinator {

class CoordinatorMetrics final : public JobObserver,
                                 public prometheus::Collectable {
 public:
  // The cardinality budget (docs/metrics.md "Cardinality"), which
  // coordinator_metrics_test checks. A job that is queued, planning or
  // running exports at most kSeriesPerJob series (its info, step counter,
  // step-time histogram of 19 buckets + 3, 13 gauges, and 3 scrape-time
  // clocks), whatever its stage count; a live worker kSeriesPerWorker (its
  // heartbeat age); an ended job none, but for its two rows while it is
  // among the newest kRecentEndedJobs. The rest is a constant (per state,
  // per gRPC method and code, per worker-message kind).
  static constexpr int kSeriesPerJob = 40;
  static constexpr int kSeriesPerWorker = 1;
  static constexpr int kRecentEndedJobs = 20;

  CoordinatorMetrics();
  ~CoordinatorMetrics() override;

  // The manager whose state the scrape-time gauges read; set once, before
  // the metrics are served. It must outlive the metrics server.
  void Attach(const JobManager* manager);

  // What the metrics server serves, besides this object itself.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // `method` is gRPC's full name ("/conveyor.v1.Coordinator/SubmitJob").
  void CountRequest(const std::string& method, grpc::StatusCode code);

  // For ServerBuilder::experimental().SetInterceptorCreators: counts every
  // call this object outlives.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  InterceptorFactory();

  // One worker message of `kind` took the coordinator `seconds` to handle
  // (WorkerSessionService::set_message_timer): the
  // conveyor_worker_message_handling_seconds histogram, one series per kind
  // seen (a closed set of at most 10: the cardinality does not grow with the
  // fleet).
  void ObserveWorkerMessage(v1::WorkerMessage::KindCase kind, double seconds);

  // JobObserver.
  void OnSubmitted(const v1::Job& job) override;
  void OnStep(const v1::Job& job, const v1::StepSummary& step) override;
  void OnFinished(const v1::Job& job) override;
  void OnRestarted(const v1::Job& job, absl::string_view reason,
                   bool layout_changed) override;

  // prometheus::Collectable: the scrape-time gauges.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct JobSeries {
    prometheus::Gauge* info;
    prometheus::Counter* steps;
    prometheus::Histogram* step_duration;
    prometheus::Gauge* loss;
    prometheus::Gauge* samples_per_second;
    prometheus::Gauge* tokens_per_second;
    prometheus::Gauge* bubble_ratio;
    prometheus::Gauge* receive_wait_ratio;
    prometheus::Gauge* learning_rate;
    prometheus::Gauge* grad_norm;
    // Added at the job's first evaluation, so a job without an eval
    // section exports no eval loss at all (not a misleading 0); the MFU
    // likewise at its first step with a known device peak.
    prometheus::Gauge* eval_loss = nullptr;
    prometheus::Gauge* mfu = nullptr;
    // At the first step that reports them.
    prometheus::Gauge* tflops_per_device = nullptr;
    prometheus::Gauge* memory_allocated = nullptr;
    prometheus::Gauge* memory_reserved = nullptr;
    prometheus::Gauge* memory_capacity = nullptr;
  };

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& submitted_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Gauge>& job_info_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& samples_per_second_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& bubble_ratio_;
  prometheus::Family<prometheus::Gauge>& receive_wait_ratio_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& tflops_per_device_;
  prometheus::Family<prometheus::Gauge>& memory_peak_;
  prometheus::Family<prometheus::Gauge>& memory_capacity_;
  prometheus::Family<prometheus::Gauge>& eval_loss_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& message_handling_;

  mutable Mutex mu_;
  const JobManager* manager_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);
  // By method and code: Family::Add takes a lock and hashes the labels, so
  // the hot path looks here first.
  std::map<std::pair<std::string, int>, prometheus::Counter*> request_counters_
      ABSL_GUARDED_BY(mu_);
  // By WorkerMessage::KindCase, added at the kind's first message.
  std::map<int, prometheus::Histogram*> message_histograms_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::coordinator

#endif  // CONVEYOR_COORDINATOR_COORDINATOR_METRICS_H_
