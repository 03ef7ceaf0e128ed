// WorkerMetrics: the worker daemon's Prometheus metrics (docs/metrics.md):
// its session and job state, and per job its stages' time split, bubble and
// activation memory, and its data plane's traffic, with errors and
// checkpoint saves kept for the daemon's lifetime.
//
// Per-job series live in a JobMetrics, created when the worker takes a job
// and destroyed after the job's channel is gone; destruction removes them,
// so a long-lived worker's series count does not grow with the jobs it ran.
//
// Thread-safe: metric updates are atomic, and series are added and removed
// under prometheus-cpp's family locks.
#ifndef CONVEYOR_WORKER_WORKER_METRICS_H_
#define CONVEYOR_WORKER_WORKER_METRICS_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "transport/channel.h"
#include "worker/stage_executor.h"

namespace conveyor::worker {

class WorkerMetrics;

// One job's series on this worker. Also the job channel's observer.
class JobMetrics final : public transport::DataPlaneObserver {
 public:
  ~JobMetrics() override;
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // The peers' names by rank, for the `peer` label (once known, at
  // StartJob); a rank without a name is labelled "rank-N".
  void SetPeerNames(std::vector<std::string> names);

  // After each step.
  void RecordStep(const RankStepResult& step);

  // transport::DataPlaneObserver.
  void OnSent(int peer, uint64_t bytes,
              std::chrono::steady_clock::duration took) override;
  void OnReceived(int peer, uint64_t bytes) override;
  void OnError(Error error) override;

 private:
  friend class WorkerMetrics;
  struct StageSeries {
    prometheus::Counter* forward;
    prometheus::Counter* dataloader_wait;
    prometheus::Counter* backward;
    prometheus::Counter* optimizer;
    prometheus::Counter* communication;
    prometheus::Counter* idle;
    prometheus::Counter* microbatches;
    prometheus::Gauge* receive_wait_ratio;
    prometheus::Gauge* peak_activation_bytes;
  };
  static constexpr int kOtherRanks = -1;  // peers_' key for non-neighbours.
  struct PeerSeries {
    prometheus::Counter* sent = nullptr;
    prometheus::Counter* received = nullptr;
    prometheus::Histogram* transfer = nullptr;
  };

  JobMetrics(WorkerMetrics* owner, std::string job_id,
             const std::vector<int>& stages, std::vector<int> neighbours);
  PeerSeries& Peer(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WorkerMetrics* const owner_;
  const std::string job_id_;
  std::map<int, StageSeries> stages_;
  prometheus::Histogram* step_duration_;
  prometheus::Counter* receive_wait_;

  Mutex mu_;
  std::vector<std::string> peer_names_ ABSL_GUARDED_BY(mu_);
  // By rank; kOtherRanks for the ranks that are not neighbours_.
  std::map<int, PeerSeries> peers_ ABSL_GUARDED_BY(mu_);
  const std::vector<int> neighbours_;  // Empty: every rank is one.
};

class WorkerMetrics {
 public:
  explicit WorkerMetrics(std::string worker_name);

  // What the metrics server serves.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void SetConnected(bool connected);
  void SetBusy(bool busy);
  // outcome: "succeeded", "failed" or "cancelled".
  void JobEnded(const std::string& outcome);
  // One checkpoint write (worker/job_runner.h CheckpointWrite): its
  // outcome and duration, and how long the step loop stood still for it
  // (waiting for the write before it, and copying the stages to host).
  void RecordCheckpoint(bool ok, double seconds, double wait_seconds,
                        double snapshot_seconds);

  // Series for job `job_id` on the given global stages. `neighbours`: the
  // ranks this worker exchanges activations and gradients with (the holders
  // of the stages next to its own, scheduler::NeighbourRanks); each gets its
  // own data-plane series, and traffic with any other rank (the gradient
  // norm's all-reduce reaches every rank) is summed under one `peer` value,
  // "other-ranks", so a worker's series do not grow with the job's ranks:
  // at most kSeriesPerStage per stage it holds plus kSeriesPerJob
  // (docs/metrics.md "Cardinality"). Empty: every peer its own series.
  std::unique_ptr<JobMetrics> StartJob(const std::string& job_id,
                                       const std::vector<int>& stages,
                                       std::vector<int> neighbours = {});

  // The cardinality budget of one job on this worker, checked by
  // worker_metrics_test: 9 series per stage held, and 23 (the step-time
  // histogram and the receive-wait counter) + 3 peers x 24 (two counters and
  // a transfer histogram; two neighbours and "other-ranks") per job.
  static constexpr int kSeriesPerStage = 9;
  static constexpr int kSeriesPerJob = 23 + 3 * 24;

 private:
  friend class JobMetrics;

  const std::string worker_;
  std::shared_ptr<prometheus::Registry> registry_;

  prometheus::Gauge& connected_;
  prometheus::Gauge& busy_;
  prometheus::Family<prometheus::Counter>& jobs_;
  prometheus::Family<prometheus::Counter>& forward_;
  prometheus::Family<prometheus::Counter>& dataloader_wait_;
  prometheus::Family<prometheus::Counter>& backward_;
  prometheus::Family<prometheus::Counter>& optimizer_;
  prometheus::Family<prometheus::Counter>& communication_;
  prometheus::Family<prometheus::Counter>& idle_;
  prometheus::Family<prometheus::Counter>& microbatches_;
  prometheus::Family<prometheus::Gauge>& receive_wait_ratio_;
  prometheus::Family<prometheus::Gauge>& peak_activation_;
  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Counter>& sent_;
  prometheus::Family<prometheus::Counter>& received_;
  prometheus::Family<prometheus::Histogram>& transfer_;
  prometheus::Family<prometheus::Counter>& receive_wait_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Counter>& checkpoint_saves_;
  prometheus::Histogram& checkpoint_duration_;
  prometheus::Counter& checkpoint_wait_;
  prometheus::Counter& checkpoint_snapshot_;
  prometheus::Gauge& checkpoint_last_success_;
};

}  // namespace conveyor::worker

#endif  // CONVEYOR_WORKER_WORKER_METRICS_H_
