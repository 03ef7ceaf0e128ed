#include "coordinator/coordinator_metrics.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/service.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "proto/protocol.h"
#include "tests/coordinator/test_util.h"
#include "tests/testing/metric_series.h"

namespace conveyor::coordinator {
namespace {

using ::conveyor::testing_util::CountSeries;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Scrape(const std::shared_ptr<CoordinatorMetrics>& metrics) {
  std::vector<prometheus::MetricFamily> families =
      metrics->registry()->Collect();
  for (auto& f : metrics->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

class CoordinatorMetricsTest : public ::testing::Test {
 protected:
  CoordinatorMetricsTest()
      : metrics_(std::make_shared<CoordinatorMetrics>()),
        manager_({.observer = metrics_.get(), .version = kVersion}) {
    metrics_->Attach(&manager_);
  }

  std::string AddWorker(const std::string& name) {
    v1::RegisterRequest r;
    r.set_protocol_version(proto::kProtocolVersion);
    r.set_version(kVersion);
    r.set_name(name);
    r.add_devices("cpu:1");
    auto reg = manager_.RegisterWorker(r, std::make_shared<FakeConnection>());
    EXPECT_TRUE(reg.ok()) << reg.status();
    return reg->worker_id();
  }

  absl::StatusOr<v1::Job> SubmitTwoRankJob() {
    v1::SubmitJobRequest req;
    req.set_yaml(JobYaml(2));
    req.set_file_name("job.yaml");
    return manager_.SubmitJob(req);
  }

  // Step 1 of a two-rank job: rank 0 on `w`, or rank 1 (with the loss).
  void ReportStep(const std::string& job_id, const std::string& w, bool loss) {
    v1::WorkerMessage m;
    v1::StepReport* s = m.mutable_step();
    s->set_job_id(job_id);
    s->set_step(1);
    s->set_seconds(0.5);
    s->set_wait_seconds(0.125);
    s->set_has_loss(loss);
    s->set_loss(2.5);
    s->set_learning_rate(0.01);
    // Rank 0 holds 3^2, rank 1 4^2: a global norm of 5.
    s->set_grad_squared_sum(loss ? 16 : 9);
    // Two ranks, 400 us long, each busy 200 us: half the area idles.
    s->set_start_unix_us(1000);
    auto span = [&](v1::Span::Kind kind, int64_t start) {
      v1::Span* x = s->add_spans();
      x->set_kind(kind);
      x->set_stage(loss ? 1 : 0);
      x->set_start_us(start);
      x->set_duration_us(100);
    };
    span(v1::Span::FORWARD, loss ? 100 : 0);
    span(v1::Span::BACKWARD, loss ? 200 : 300);
    EXPECT_TRUE(manager_.HandleWorkerMessage(w, m).ok());
  }

  // Both ranks' JobReady, with their devices' peaks (0: unknown).
  void ReportReady(const std::string& job_id, const std::string& w1,
                   const std::string& w2, double peak1, double peak2) {
    for (const auto& [w, peak] : {std::pair{w1, peak1}, std::pair{w2, peak2}}) {
      v1::WorkerMessage m;
      m.mutable_ready()->set_job_id(job_id);
      m.mutable_ready()->set_data_endpoint("127.0.0.1:1");
      m.mutable_ready()->set_peak_flops(peak);
      EXPECT_TRUE(manager_.HandleWorkerMessage(w, m).ok());
    }
  }

  std::shared_ptr<CoordinatorMetrics> metrics_;
  JobManager manager_;
};

TEST_F(CoordinatorMetricsTest, StateGaugesAreReadAtScrapeTime) {
  std::string text = Scrape(metrics_);
  EXPECT_THAT(text, HasSubstr("conveyor_jobs{state=\"queued\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_jobs{state=\"cancelled\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_workers{state=\"idle\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_build_info{"));
  EXPECT_THAT(text, HasSubstr("conveyor_coordinator_state_file_healthy 1\n"));

  const std::string w1 = AddWorker("a");
  const std::string w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = SubmitTwoRankJob();
  ASSERT_TRUE(job.ok()) << job.status();
  text = Scrape(metrics_);
  EXPECT_THAT(text, HasSubstr("conveyor_jobs{state=\"planning\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_workers{state=\"busy\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_heartbeat_age_seconds{worker="
                              "\"a\",worker_id=\"" +
                              w1 + "\"} 0"));
  EXPECT_THAT(text, HasSubstr("conveyor_jobs_submitted_total 1\n"));
  EXPECT_THAT(
      text, HasSubstr(absl::StrCat("conveyor_job_info{job_id=\"", job->id(),
                                   "\",name=\"mlp\",schedule=\"1f1b\"} 1\n")));

  // A completed step updates the job's series.
  ReportReady(job->id(), w1, w2, 1e9, 1e9);
  ReportStep(job->id(), w1, false);
  ReportStep(job->id(), w2, true);
  const std::string id = absl::StrCat("{job_id=\"", job->id(), "\"}");
  text = Scrape(metrics_);
  EXPECT_THAT(text,
              HasSubstr("conveyor_job_steps_completed_total" + id + " 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_loss" + id + " 2.5\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_bubble_ratio" + id + " 0.5\n"));
  EXPECT_THAT(text,
              HasSubstr("conveyor_job_receive_wait_ratio" + id + " 0.25\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_learning_rate" + id + " 0.01\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_grad_norm" + id + " 5\n"));
  // Both ranks know their peak (the arithmetic is step_aggregator_test's).
  EXPECT_THAT(text, HasSubstr("conveyor_job_mfu_ratio" + id + " "));
  EXPECT_THAT(text,
              HasSubstr("conveyor_job_last_step_timestamp_seconds" + id + " "));
  // The job keeps no checkpoints: no checkpoint clock to alert on.
  EXPECT_THAT(
      text, Not(HasSubstr("conveyor_job_last_checkpoint_timestamp_seconds{")));
  EXPECT_THAT(text,
              HasSubstr("conveyor_job_samples_per_second" + id + " 16\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_step_duration_seconds_count" + id +
                              " 1\n"));

  // The job's series go with the job, but for its row among the recent
  // ended jobs; the totals stay.
  ASSERT_TRUE(manager_.CancelJob(job->id(), "done").ok());
  text = Scrape(metrics_);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, job->id())) {
      EXPECT_TRUE(absl::StartsWith(line, "conveyor_recent_job_")) << line;
    }
  }
  const std::string row = absl::StrCat("{job_id=\"", job->id(),
                                       "\",name=\"mlp\",state=\"cancelled\"} ");
  EXPECT_THAT(text, HasSubstr("conveyor_recent_job_duration_seconds" + row));
  EXPECT_THAT(text,
              HasSubstr("conveyor_recent_job_end_timestamp_seconds" + row));
  EXPECT_THAT(text, HasSubstr("conveyor_jobs{state=\"cancelled\"} 1\n"));
  EXPECT_THAT(
      text, HasSubstr("conveyor_jobs_finished_total{state=\"cancelled\"} 1\n"));
  EXPECT_THAT(
      text, HasSubstr("conveyor_jobs_finished_total{state=\"succeeded\"} 0\n"));
}

// One rank of unknown peak (a CPU worker without --peak-tflops) leaves the
// job without an MFU series rather than one over half the devices.
TEST_F(CoordinatorMetricsTest, NoMfuWhenARankKnowsNoPeak) {
  const std::string w1 = AddWorker("a");
  const std::string w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = SubmitTwoRankJob();
  ASSERT_TRUE(job.ok()) << job.status();
  ReportReady(job->id(), w1, w2, 1e9, 0);
  ReportStep(job->id(), w1, false);
  ReportStep(job->id(), w2, true);
  const std::string text = Scrape(metrics_);
  const std::string id = absl::StrCat("{job_id=\"", job->id(), "\"}");
  EXPECT_THAT(text, HasSubstr("conveyor_job_grad_norm" + id + " 5\n"));
  EXPECT_THAT(text, Not(HasSubstr("conveyor_job_mfu_ratio{")));
}

// Restarts are counted by reason and by whether the layout changed; the
// common series is there (at 0) before any restart.
TEST_F(CoordinatorMetricsTest, CountsRestartsByReasonAndLayout) {
  EXPECT_THAT(Scrape(metrics_),
              HasSubstr("conveyor_job_restarts_total{layout=\"same\","
                        "reason=\"worker_lost\"} 0\n"));
  v1::Job job;
  job.set_id("job-1");
  metrics_->OnRestarted(job, "worker_lost", /*layout_changed=*/true);
  metrics_->OnRestarted(job, "worker_lost", /*layout_changed=*/true);
  metrics_->OnRestarted(job, "coordinator_restarted", false);
  const std::string text = Scrape(metrics_);
  EXPECT_THAT(text, HasSubstr("conveyor_job_restarts_total{layout=\"changed\","
                              "reason=\"worker_lost\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_restarts_total{layout=\"same\","
                              "reason=\"coordinator_restarted\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_job_restarts_total{layout=\"same\","
                              "reason=\"worker_lost\"} 0\n"));
}

TEST_F(CoordinatorMetricsTest, CountsGrpcCallsByMethodAndCode) {
  CoordinatorService service(&manager_);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(metrics_->InterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id("job-42");
    v1::Job job;
    EXPECT_EQ(stub->GetJob(&context, request, &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::ListJobsResponse response;
    EXPECT_TRUE(stub->ListJobs(&context, {}, &response).ok());
  }
  {
    grpc::ClientContext context;
    v1::GetTraceRequest request;
    request.set_job_id("job-1");
    v1::Trace trace;
    EXPECT_EQ(stub->GetTrace(&context, request, &trace).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  server->Shutdown();
  const std::string text = Scrape(metrics_);
  EXPECT_THAT(text, HasSubstr("conveyor_grpc_server_requests_total{code="
                              "\"NOT_FOUND\",method=\"GetJob\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_grpc_server_requests_total{code="
                              "\"OK\",method=\"ListJobs\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_grpc_server_requests_total{code="
                              "\"NOT_FOUND\",method=\"GetTrace\"} 1\n"));
}

int CountAllSeries(const std::string& text) { return CountSeries(text, ""); }

// The cardinality budget (docs/metrics.md "Cardinality"): K live jobs of S
// stages on W workers export K x kSeriesPerJob (at most) + W x
// kSeriesPerWorker + a constant; the stage count adds nothing, and ended
// jobs leave only their rows among the newest kRecentEndedJobs.
class CardinalityTest : public CoordinatorMetricsTest {
 protected:
  // Submits a job of `stages` stages, brings it to RUNNING on its workers
  // and reports one step from every rank.
  std::string RunJob(int stages) {
    v1::SubmitJobRequest req;
    req.set_yaml(JobYaml(stages));
    req.set_file_name("job.yaml");
    absl::StatusOr<v1::Job> job = manager_.SubmitJob(req);
    EXPECT_TRUE(job.ok()) << job.status();
    absl::StatusOr<v1::Job> placed = manager_.GetJob(job->id());
    EXPECT_EQ(placed->worker_ids_size(), stages);
    for (const std::string& w : placed->worker_ids()) {
      v1::WorkerMessage m;
      m.mutable_ready()->set_job_id(job->id());
      m.mutable_ready()->set_data_endpoint("127.0.0.1:1");
      m.mutable_ready()->set_peak_flops(1e12);
      EXPECT_TRUE(manager_.HandleWorkerMessage(w, m).ok());
    }
    for (int rank = 0; rank < stages; ++rank) {
      v1::WorkerMessage m;
      v1::StepReport* s = m.mutable_step();
      s->set_job_id(job->id());
      s->set_step(1);
      s->set_seconds(0.5);
      s->set_has_loss(rank == stages - 1);
      s->set_loss(1.0);
      s->set_start_unix_us(1000);
      EXPECT_TRUE(
          manager_.HandleWorkerMessage(placed->worker_ids(rank), m).ok());
    }
    EXPECT_EQ(manager_.GetJob(job->id())->steps_done(), 1);
    return job->id();
  }

  // Cancels the job, and its workers report its end (so they are idle).
  void EndJob(const std::string& id) {
    absl::StatusOr<v1::Job> job = manager_.GetJob(id);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(manager_.CancelJob(id, "done").ok());
    for (const std::string& w : job->worker_ids()) {
      v1::WorkerMessage m;
      m.mutable_ended()->set_job_id(id);
      m.mutable_ended()->set_state(v1::CANCELLED);
      EXPECT_TRUE(manager_.HandleWorkerMessage(w, m).ok());
    }
  }
};

TEST_F(CardinalityTest, SeriesGrowByJobAndWorkerNeverByStage) {
  constexpr int kWorkers = 12;
  for (int i = 0; i < kWorkers; ++i) AddWorker(absl::StrCat("w", i));
  const int base = CountAllSeries(Scrape(metrics_));
  // Every worker's series: its heartbeat age, and nothing else.
  EXPECT_EQ(CountSeries(Scrape(metrics_), "worker_id=\""),
            kWorkers * CoordinatorMetrics::kSeriesPerWorker);

  // Jobs of 1, 3 and 8 stages: the same number of series each.
  const std::string one = RunJob(1);
  const std::string three = RunJob(3);
  const std::string eight = RunJob(8);
  std::string text = Scrape(metrics_);
  const int per_job = CountSeries(text, absl::StrCat("job_id=\"", one, "\""));
  EXPECT_GT(per_job, 0);
  EXPECT_LE(per_job, CoordinatorMetrics::kSeriesPerJob);
  EXPECT_EQ(CountSeries(text, absl::StrCat("job_id=\"", three, "\"")), per_job);
  EXPECT_EQ(CountSeries(text, absl::StrCat("job_id=\"", eight, "\"")), per_job);
  // The whole scrape: the base, three jobs' series and the message kinds
  // the steps added nothing (no timer in this test), so exactly this.
  EXPECT_EQ(CountAllSeries(text), base + 3 * per_job);
  EXPECT_EQ(CountSeries(text, "worker_id=\""),
            kWorkers * CoordinatorMetrics::kSeriesPerWorker);

  // Ended jobs keep one row in each of the two recent-job families.
  for (const std::string& id : {one, three, eight}) EndJob(id);
  text = Scrape(metrics_);
  for (const std::string& id : {one, three, eight}) {
    EXPECT_EQ(CountSeries(text, absl::StrCat("job_id=\"", id, "\"")), 2) << id;
  }
  EXPECT_EQ(CountAllSeries(text), base + 3 * 2);
}

TEST_F(CardinalityTest, EndedJobsLeaveABoundedHistory) {
  for (int i = 0; i < 2; ++i) AddWorker(absl::StrCat("w", i));
  const int base = CountAllSeries(Scrape(metrics_));
  std::vector<std::string> ids;
  for (int j = 0; j < CoordinatorMetrics::kRecentEndedJobs + 5; ++j) {
    ids.push_back(RunJob(2));
    EndJob(ids.back());
  }
  const std::string text = Scrape(metrics_);
  EXPECT_EQ(CountSeries(text, "job_id=\""),
            2 * CoordinatorMetrics::kRecentEndedJobs);
  EXPECT_EQ(CountAllSeries(text),
            base + 2 * CoordinatorMetrics::kRecentEndedJobs);
  // The oldest are gone, the newest kept.
  EXPECT_EQ(CountSeries(text, absl::StrCat("job_id=\"", ids.front(), "\"")), 0);
  EXPECT_EQ(CountSeries(text, absl::StrCat("job_id=\"", ids.back(), "\"")), 2);
}

// The handling histogram has one series per message kind seen, whatever the
// number of workers that sent them.
TEST_F(CoordinatorMetricsTest, HandlingHistogramIsPerKindOnly) {
  for (int i = 0; i < 100; ++i) {
    metrics_->ObserveWorkerMessage(v1::WorkerMessage::kHeartbeat, 0.0002);
  }
  metrics_->ObserveWorkerMessage(v1::WorkerMessage::kStep, 0.02);
  const std::string text = Scrape(metrics_);
  EXPECT_THAT(text, HasSubstr("conveyor_worker_message_handling_seconds_count{"
                              "kind=\"heartbeat\"} 100\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_message_handling_seconds_bucket{"
                              "kind=\"heartbeat\",le=\"0.00025\"} 100\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_message_handling_seconds_bucket{"
                              "kind=\"step\",le=\"0.01\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("conveyor_worker_message_handling_seconds_bucket{"
                              "kind=\"step\",le=\"0.025\"} 1\n"));
  EXPECT_EQ(CountSeries(text, "conveyor_worker_message_handling_seconds"),
            2 * (16 + 3));
}

}  // namespace
}  // namespace conveyor::coordinator
