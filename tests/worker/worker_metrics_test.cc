#include "worker/worker_metrics.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/testing/metric_series.h"

namespace conveyor::worker {
namespace {

using ::conveyor::testing_util::CountSeries;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(const WorkerMetrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
}

RankStepResult Step(double seconds) {
  RankStepResult r;
  r.seconds = seconds;
  r.wait_seconds = 0.25 * seconds;
  r.stages[1] = {.forward_seconds = 0.25 * seconds,
                 .data_seconds = 0.125 * seconds,
                 .backward_seconds = 0.5 * seconds,
                 .optimizer_seconds = 0,
                 .communication_seconds = 0,
                 .idle_seconds = 0.25 * seconds,
                 .microbatches = 8,
                 .peak_activation_bytes = 4096};
  return r;
}

TEST(WorkerMetricsTest, StepsAccumulatePerStageAndSeriesGoWithTheJob) {
  WorkerMetrics metrics("w1");
  {
    std::unique_ptr<JobMetrics> job = metrics.StartJob("job-3", {1});
    job->SetPeerNames({"w0", "w1", "w2"});
    job->RecordStep(Step(2));
    job->RecordStep(Step(2));
    job->OnSent(2, 1000, std::chrono::milliseconds(3));
    job->OnReceived(0, 500);
    job->OnReceived(0, 500);
    job->OnError(transport::DataPlaneObserver::Error::kTimeout);
    const std::string text = Scrape(metrics);
    const std::string labels = "job_id=\"job-3\",stage=\"1\",worker=\"w1\"";
    EXPECT_THAT(text, HasSubstr("conveyor_stage_forward_seconds_total{" +
                                labels + "} 1\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_dataloader_wait_seconds_total{" +
                                labels + "} 0.5\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_stage_backward_seconds_total{" +
                                labels + "} 2\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_stage_idle_seconds_total{" + labels +
                                "} 1\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_stage_microbatches_total{" + labels +
                                "} 16\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_stage_receive_wait_ratio{" + labels +
                                "} 0.25\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_stage_peak_activation_bytes{" +
                                labels + "} 4096\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_worker_step_duration_seconds_count{"
                                "job_id=\"job-3\",worker=\"w1\"} 2\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_dataplane_sent_bytes_total{job_id="
                                "\"job-3\",peer=\"w2\",worker=\"w1\"} 1000\n"));
    EXPECT_THAT(text,
                HasSubstr("conveyor_dataplane_received_bytes_total{job_id="
                          "\"job-3\",peer=\"w0\",worker=\"w1\"} 1000\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_dataplane_transfer_duration_seconds_"
                                "count{job_id=\"job-3\",peer=\"w2\",worker="
                                "\"w1\"} 1\n"));
    EXPECT_THAT(text, HasSubstr("conveyor_dataplane_receive_wait_seconds_"
                                "total{job_id=\"job-3\",worker=\"w1\"} 1\n"));
  }
  // The job is gone: none of its series stay, the daemon-wide ones do.
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, Not(HasSubstr("job-3")));
  EXPECT_THAT(text, HasSubstr("conveyor_dataplane_errors_total{kind="
                              "\"timeout\",worker=\"w1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_dataplane_errors_total{kind="
                              "\"peer_lost\",worker=\"w1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_build_info{"));
}

TEST(WorkerMetricsTest, UnnamedPeersAreLabelledByRank) {
  WorkerMetrics metrics("w0");
  std::unique_ptr<JobMetrics> job = metrics.StartJob("job-1", {0, 2});
  job->OnSent(1, 8, std::chrono::microseconds(10));
  EXPECT_THAT(Scrape(metrics),
              HasSubstr("conveyor_dataplane_sent_bytes_total{job_id=\"job-1\","
                        "peer=\"rank-1\",worker=\"w0\"} 8\n"));
}

TEST(WorkerMetricsTest, StateJobsAndCheckpoints) {
  WorkerMetrics metrics("w0");
  metrics.SetConnected(true);
  metrics.SetBusy(true);
  metrics.JobEnded("cancelled");
  metrics.RecordCheckpoint(true, 0.5, 0.25, 0.125);
  metrics.RecordCheckpoint(false, 0.1, 0.5, 0);
  const std::string text = Scrape(metrics);
  EXPECT_THAT(text, HasSubstr("conveyor_worker_connected{worker=\"w0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_busy{worker=\"w0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_jobs_total{outcome="
                              "\"cancelled\",worker=\"w0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_jobs_total{outcome="
                              "\"succeeded\",worker=\"w0\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_checkpoint_saves_total{outcome="
                              "\"success\",worker=\"w0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_checkpoint_saves_total{outcome="
                              "\"failure\",worker=\"w0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_checkpoint_save_duration_seconds_"
                              "count{worker=\"w0\"} 1\n"));
  // Stalls count whatever the outcome.
  EXPECT_THAT(text, HasSubstr("conveyor_checkpoint_wait_seconds_total{worker="
                              "\"w0\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_checkpoint_snapshot_seconds_total{"
                              "worker=\"w0\"} 0.125\n"));
  EXPECT_THAT(
      text, Not(HasSubstr("conveyor_checkpoint_last_success_timestamp_seconds{"
                          "worker=\"w0\"} 0\n")));
}

// A 64-rank job: rank 5 talks activations with ranks 4 and 6 and the
// gradient norm with all 63 others; its series stay within the budget, and
// the all-reduce's traffic is summed under one peer.
TEST(WorkerMetricsTest, SeriesOfAJobDoNotGrowWithItsRanks) {
  WorkerMetrics metrics("w5");
  const int base = CountSeries(Scrape(metrics), "");
  std::unique_ptr<JobMetrics> job = metrics.StartJob("job-1", {5}, {4, 6});
  std::vector<std::string> names;
  for (int r = 0; r < 64; ++r) names.push_back(absl::StrCat("w", r));
  job->SetPeerNames(names);
  for (int r = 0; r < 64; ++r) {
    if (r == 5) continue;
    job->OnSent(r, 8, std::chrono::microseconds(10));
    job->OnReceived(r, 8);
  }
  const std::string text = Scrape(metrics);
  const int series = CountSeries(text, "job_id=\"job-1\"");
  EXPECT_EQ(series,
            WorkerMetrics::kSeriesPerStage + WorkerMetrics::kSeriesPerJob);
  EXPECT_EQ(CountSeries(text, ""), base + series);
  EXPECT_THAT(text,
              HasSubstr("conveyor_dataplane_sent_bytes_total{job_id=\"job-1\","
                        "peer=\"w4\",worker=\"w5\"} 8\n"));
  EXPECT_THAT(text,
              HasSubstr("conveyor_dataplane_sent_bytes_total{job_id=\"job-1\","
                        "peer=\"w6\",worker=\"w5\"} 8\n"));
  // 61 ranks x 8 bytes.
  EXPECT_THAT(
      text,
      HasSubstr("conveyor_dataplane_received_bytes_total{job_id=\"job-1\","
                "peer=\"other-ranks\",worker=\"w5\"} 488\n"));
  job.reset();
  EXPECT_EQ(CountSeries(Scrape(metrics), ""), base);
}

}  // namespace
}  // namespace conveyor::worker
