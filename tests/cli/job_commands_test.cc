#include "cli/job_commands.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "cli/exit_status.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/fake_coordinator.h"

namespace conveyor::cli {
namespace {

using testing::FakeCoordinator;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kJob[] = R"(name: tiny
model:
  input_shape: [4]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
    - boundary
    - dense: {features: 4}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 4, batch_size: 8, microbatches: 2}
optimizer: {kind: sgd, lr: 0.1}
checkpoint: {dir: out}
)";

// Line 5, column 15: the key the dense layer does not take.
constexpr char kBadJob[] = R"(model:
  input_shape: [4]
  init: {seed: 0}
  layers:
    - dense: {feature: 2}
  loss: mse
)";

class JobCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / "job_commands_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  void Start(FakeCoordinator::Options options = {}, int workers = 2) {
    fake_ = std::make_unique<FakeCoordinator>(options);
    for (int i = 0; i < workers; ++i) fake_->AddWorker(absl::StrCat("w", i));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(
        static_cast<v1::Coordinator::Service*>(fake_.get()));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        CoordinatorClient::Create(address(), absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  std::string WriteJob(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  JobCommandOptions SubmitOptions(const std::string& path) {
    JobCommandOptions o;
    o.job_file = path;
    return o;
  }

  std::filesystem::path dir_;
  int port_ = 0;
  std::unique_ptr<FakeCoordinator> fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorClient> client_;
};

TEST_F(JobCommandsTest, SubmitSendsTheYamlFileNameAndBaseDir) {
  Start();
  const std::string path = WriteJob("job.yaml", kJob);
  std::ostringstream out;
  ASSERT_TRUE(RunSubmit(*client_, SubmitOptions(path), {}, out).ok());
  EXPECT_EQ(out.str(), "job-1 QUEUED\n");
  ASSERT_EQ(fake_->submitted().size(), 1u);
  const v1::SubmitJobRequest request = fake_->submitted()[0];
  EXPECT_EQ(request.yaml(), kJob);
  EXPECT_EQ(request.file_name(), path);
  EXPECT_EQ(request.base_dir(),
            std::filesystem::absolute(dir_).lexically_normal().string());
}

// -o json: the coordinator's messages in the proto3 JSON mapping, with
// proto field names, enums by name, 64-bit integers as strings and every
// field present; one object per command.
TEST_F(JobCommandsTest, JsonOutputIsTheCoordinatorsMessages) {
  Start();
  JobCommandOptions o = SubmitOptions(WriteJob("job.yaml", kJob));
  o.output_format = "json";
  o.steps = 3;  // As `run --steps`.
  std::ostringstream submitted;
  ASSERT_TRUE(RunSubmit(*client_, o, {}, submitted).ok());
  const nlohmann::json job = nlohmann::json::parse(submitted.str());
  EXPECT_EQ(job["id"], "job-1");
  EXPECT_EQ(job["state"], "QUEUED");
  EXPECT_EQ(job["steps_total"], "3");  // int64: a string.
  EXPECT_EQ(job["steps_done"], "0");   // Present although zero.
  EXPECT_THAT(fake_->submitted()[0].yaml(), HasSubstr("steps: 3"));

  std::ostringstream status, jobs, workers;
  ASSERT_TRUE(RunStatus(*client_, "job-1", absl::Now(), status, true).ok());
  EXPECT_EQ(nlohmann::json::parse(status.str()), job);
  ASSERT_TRUE(RunJobs(*client_, absl::Now(), jobs, true).ok());
  const nlohmann::json listed = nlohmann::json::parse(jobs.str());
  ASSERT_EQ(listed["jobs"].size(), 1u);
  EXPECT_EQ(listed["jobs"][0]["id"], "job-1");
  EXPECT_EQ(listed["warning"], "");
  ASSERT_TRUE(RunWorkers(*client_, workers, true).ok());
  const nlohmann::json registered = nlohmann::json::parse(workers.str());
  ASSERT_EQ(registered["workers"].size(), 2u);
  EXPECT_EQ(registered["workers"][0]["name"], "w0");
  EXPECT_EQ(registered["workers"][0]["draining"], false);
  EXPECT_TRUE(registered["workers"][0]["state"].is_string());

  // One object, then a watch would interleave lines with it: refused.
  o.watch = true;
  std::ostringstream refused;
  const absl::Status both = RunSubmit(*client_, o, {}, refused);
  EXPECT_EQ(both.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.message(), HasSubstr("-o json"));
  EXPECT_EQ(refused.str(), "");
}

TEST_F(JobCommandsTest, SubmitSendsTheOverriddenDocument) {
  Start();
  JobCommandOptions o = SubmitOptions(WriteJob("job.yaml", kJob));
  o.overrides = {"training.steps=3"};
  std::ostringstream out;
  ASSERT_TRUE(RunSubmit(*client_, o, {}, out).ok());
  const v1::SubmitJobRequest request = fake_->submitted()[0];
  EXPECT_THAT(request.file_name(), HasSubstr("job.yaml (with --set)"));
  EXPECT_THAT(request.yaml(), HasSubstr("steps: 3"));
  ASSERT_TRUE(RunStatus(*client_, "job-1", absl::Now(), out).ok());
  EXPECT_THAT(out.str(), HasSubstr("0/3 steps"));
}

TEST_F(JobCommandsTest, InvalidJobIsInvalidArgumentWithItsPosition) {
  Start();
  const std::string path = WriteJob("bad.yaml", kBadJob);
  std::ostringstream out;
  absl::Status status = RunSubmit(*client_, SubmitOptions(path), {}, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith(absl::StrCat(path, ":5:15: model.layers[0].dense: ")));
  EXPECT_EQ(ExitCode(status), kExitUsage);
  EXPECT_TRUE(ShouldPrint(status));
  EXPECT_EQ(out.str(), "");
}

TEST_F(JobCommandsTest, BadOverrideFailsBeforeSending) {
  Start();
  JobCommandOptions o = SubmitOptions(WriteJob("job.yaml", kJob));
  o.overrides = {"training"};
  std::ostringstream out;
  absl::Status status = RunSubmit(*client_, o, {}, out);
  EXPECT_EQ(ExitCode(status), kExitUsage);
  EXPECT_THAT(status.message(), HasSubstr("--set needs key.path=value"));
  EXPECT_TRUE(fake_->submitted().empty());
}

TEST_F(JobCommandsTest, TooFewWorkersIsResourceExhausted) {
  Start({}, /*workers=*/1);
  std::ostringstream out;
  absl::Status status =
      RunSubmit(*client_, SubmitOptions(WriteJob("job.yaml", kJob)), {}, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("needs 2 workers"));
  EXPECT_EQ(ExitCode(status), kExitFailure);
}

TEST_F(JobCommandsTest, SubmitWatchRendersTheJobAndSucceeds) {
  Start();
  JobCommandOptions o = SubmitOptions(WriteJob("job.yaml", kJob));
  o.watch = true;
  std::ostringstream out;
  absl::Status status =
      RunSubmit(*client_, o, {.log_every = 2, .tty = false}, out);
  ASSERT_TRUE(status.ok()) << status;
  const std::string text = out.str();
  EXPECT_THAT(text, StartsWith("job-1 QUEUED\njob-1 (tiny): QUEUED"));
  EXPECT_THAT(text,
              HasSubstr("job-1 (tiny): PLANNING on worker-1, worker-2\n"));
  EXPECT_THAT(text, HasSubstr("job-1 (tiny): RUNNING: 1f1b: 2 worker(s)"));
  EXPECT_THAT(text, HasSubstr("on worker-1, worker-2\n"));
  EXPECT_THAT(text, HasSubstr("step 1/4  loss 1.000000"));
  EXPECT_THAT(text, HasSubstr("step 2/4  loss 0.500000"));
  EXPECT_THAT(text, Not(HasSubstr("step 3/4")));
  EXPECT_THAT(text, HasSubstr("step 4/4  loss 0.250000"));
  EXPECT_THAT(text, HasSubstr("bubble 25.0%"));
  EXPECT_THAT(text, HasSubstr("\nSUCCEEDED: 4/4 steps"));
  EXPECT_THAT(text, HasSubstr("final loss 0.250000\n"));
}

TEST_F(JobCommandsTest, WatchOfAFailedJobExitsOneWithoutASecondMessage) {
  Start({.outcome = v1::FAILED, .fail_after_step = 2});
  std::ostringstream out;
  ASSERT_TRUE(
      RunSubmit(*client_, SubmitOptions(WriteJob("job.yaml", kJob)), {}, out)
          .ok());
  absl::Status status = RunWatch(*client_, "job-1", {}, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ExitCode(status), kExitFailure);
  EXPECT_FALSE(ShouldPrint(status));
  EXPECT_THAT(out.str(),
              HasSubstr("\nFAILED: worker-2 lost: no heartbeat for 5 s "
                        "(after 2/4 steps)\n"));
  // A second watch of the ended job prints the outcome at once.
  std::ostringstream again;
  EXPECT_EQ(ExitCode(RunWatch(*client_, "job-1", {}, again)), kExitFailure);
  EXPECT_THAT(again.str(), StartsWith("FAILED: worker-2 lost"));
}

TEST_F(JobCommandsTest, WatchOfAnUnknownJobIsNotFound) {
  Start();
  std::ostringstream out;
  absl::Status status = RunWatch(*client_, "job-99", {}, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("job-99"));
  EXPECT_TRUE(ShouldPrint(status));
}

TEST_F(JobCommandsTest, CancelEndsAQueuedJob) {
  Start();
  std::ostringstream out;
  ASSERT_TRUE(
      RunSubmit(*client_, SubmitOptions(WriteJob("job.yaml", kJob)), {}, out)
          .ok());
  std::ostringstream cancelled;
  ASSERT_TRUE(RunCancel(*client_, "job-1", cancelled).ok());
  EXPECT_EQ(cancelled.str(), "job-1 CANCELLED: cancelled by user\n");
  std::ostringstream watch;
  absl::Status status = RunWatch(*client_, "job-1", {}, watch);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ExitCode(status), kExitFailure);
  EXPECT_THAT(watch.str(), StartsWith("CANCELLED: cancelled by user"));
  EXPECT_EQ(RunCancel(*client_, "job-5", cancelled).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobCommandsTest, CancelWatchesStopsAWatchInProgress) {
  Start({.step_delay = absl::Seconds(10)});
  std::ostringstream out;
  ASSERT_TRUE(
      RunSubmit(*client_, SubmitOptions(WriteJob("job.yaml", kJob)), {}, out)
          .ok());
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(200));
    client_->CancelWatches();
  });
  std::ostringstream watch;
  absl::Status status = RunWatch(*client_, "job-1", {}, watch);
  canceller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(watch.str(), HasSubstr("RUNNING"));
  // Later watches are cancelled at once.
  EXPECT_EQ(RunWatch(*client_, "job-1", {}, watch).code(),
            absl::StatusCode::kCancelled);
}

TEST_F(JobCommandsTest, StatusJobsAndWorkersShowTables) {
  Start();
  std::ostringstream out;
  ASSERT_TRUE(
      RunSubmit(*client_, SubmitOptions(WriteJob("job.yaml", kJob)), {}, out)
          .ok());
  ASSERT_TRUE(RunWatch(*client_, "job-1", {}, out).ok());

  std::ostringstream status;
  ASSERT_TRUE(RunStatus(*client_, "job-1", absl::Now(), status).ok());
  EXPECT_THAT(status.str(), StartsWith("job-1 (tiny): SUCCEEDED\n"));
  EXPECT_THAT(status.str(),
              HasSubstr("  progress    4/4 steps, loss 0.250000"));
  EXPECT_THAT(status.str(),
              HasSubstr("STAGE  RANK  LAYERS  PARAMETERS  WORKER"));
  EXPECT_THAT(status.str(), HasSubstr("\n0      0     0-0     40          "
                                      "worker-1\n"));
  EXPECT_THAT(status.str(), HasSubstr("\n1      1     1-1     36          "
                                      "worker-2\n"));

  std::ostringstream jobs;
  ASSERT_TRUE(RunJobs(*client_, absl::Now(), jobs).ok());
  EXPECT_THAT(jobs.str(), StartsWith("ID     NAME  STATE      STEPS  LOSS"));
  EXPECT_THAT(jobs.str(), HasSubstr("job-1  tiny  SUCCEEDED  4/4    0.250000"));

  std::ostringstream workers;
  ASSERT_TRUE(RunWorkers(*client_, workers).ok());
  EXPECT_THAT(workers.str(), StartsWith("ID        NAME  STATE  JOB  STAGES"));
  EXPECT_THAT(workers.str(), HasSubstr("worker-1  w0    IDLE   -    -"));

  EXPECT_EQ(RunStatus(*client_, "job-2", absl::Now(), status).code(),
            absl::StatusCode::kNotFound);
}

// A stray byte once failed the submission with "conveyorctl: " and nothing
// after: protobuf strings must be UTF-8. The file is refused where it is.
TEST_F(JobCommandsTest, SubmitRefusesAFileThatIsNotUtf8NamingTheByte) {
  Start();
  const std::string path =
      WriteJob("latin1.yaml", std::string(kJob) + "# caf\xe9\n");
  std::ostringstream out;
  const absl::Status status = RunSubmit(*client_, SubmitOptions(path), {}, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("latin1.yaml:"));
  EXPECT_THAT(status.message(), HasSubstr(": not UTF-8 text (byte 0xe9)"));
  EXPECT_TRUE(fake_->submitted().empty());
}

// An unhealthy coordinator (it cannot write its state file) says so above
// the list, where an operator looks first.
TEST_F(JobCommandsTest, JobsShowsTheCoordinatorsWarningFirst) {
  FakeCoordinator::Options options;
  options.jobs_warning = "the coordinator cannot write its state file";
  Start(options);
  std::ostringstream jobs;
  ASSERT_TRUE(RunJobs(*client_, absl::Now(), jobs).ok());
  EXPECT_THAT(jobs.str(),
              StartsWith("WARNING: the coordinator cannot write its state "
                         "file\nID"));
}

TEST_F(JobCommandsTest, UnreachableCoordinatorNamesItsAddress) {
  // A port nobody listens on: bind one, then let it go.
  Start();
  const std::string gone = address();
  server_->Shutdown();
  server_.reset();
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Create(gone, absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  std::ostringstream out;
  absl::Status status = RunJobs(**client, absl::Now(), out);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(absl::StrCat(
                                    "cannot reach the coordinator at ", gone)));
  EXPECT_EQ(ExitCode(status), kExitFailure);
}

TEST_F(JobCommandsTest, RunJobCommandParsesFlagsAndConnects) {
  Start();
  JobCommandOptions o;
  CLI::App app;
  const JobCommands commands = AddJobCommands(app, o);
  std::vector<std::string> args = {"workers", "--coordinator", address(),
                                   "--timeout", "3"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector.
  app.parse(args);
  ASSERT_TRUE(commands.AnyParsed());
  std::ostringstream out;
  ASSERT_TRUE(RunJobCommand(commands, o, false, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("worker-2  w1"));
}

TEST_F(JobCommandsTest, RunJobCommandRejectsBadFlags) {
  JobCommandOptions o;
  CLI::App app;
  const JobCommands commands = AddJobCommands(app, o);
  std::vector<std::string> args = {"jobs", "--timeout", "0"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  std::ostringstream out;
  EXPECT_EQ(ExitCode(RunJobCommand(commands, o, false, out)), kExitUsage);
}

TEST(ResolveCoordinatorAddressTest, FlagThenEnvironmentThenDefault) {
  unsetenv(kCoordinatorEnv);
  EXPECT_EQ(ResolveCoordinatorAddress(""), "127.0.0.1:7070");
  setenv(kCoordinatorEnv, "coord:9000", 1);
  EXPECT_EQ(ResolveCoordinatorAddress(""), "coord:9000");
  EXPECT_EQ(ResolveCoordinatorAddress("flag:1"), "flag:1");
  setenv(kCoordinatorEnv, "", 1);
  EXPECT_EQ(ResolveCoordinatorAddress(""), "127.0.0.1:7070");
  unsetenv(kCoordinatorEnv);
}

TEST(CoordinatorClientTest, CreateRejectsBadArguments) {
  EXPECT_EQ(CoordinatorClient::Create("", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CoordinatorClient::Create("a:1", absl::ZeroDuration()).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ExitStatusTest, MapsCodesAndKeepsReportedOnes) {
  EXPECT_EQ(ExitCode(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCode(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCode(absl::NotFoundError("x")), 1);
  absl::Status reported =
      AlreadyReported(absl::StatusCode::kCancelled, "interrupted", 130);
  EXPECT_EQ(ExitCode(reported), 130);
  EXPECT_FALSE(ShouldPrint(reported));
  EXPECT_TRUE(ShouldPrint(absl::InternalError("x")));
  EXPECT_FALSE(ShouldPrint(absl::OkStatus()));
}

}  // namespace
}  // namespace conveyor::cli
