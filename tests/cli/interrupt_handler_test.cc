#include "cli/interrupt_handler.h"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/coordinator_client.h"
#include "gmock/gmock.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/cli/fake_coordinator.h"

namespace conveyor::cli {
namespace {

using ::testing::ElementsAre;
using testing::FakeCoordinator;
using ::testing::HasSubstr;

constexpr char kJob[] = R"(model:
  input_shape: [4]
  init: {seed: 0}
  layers: [{dense: {features: 4}}]
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 3, batch_size: 4, microbatches: 1}
optimizer: {kind: sgd, lr: 0.1}
)";

// Polls `done` for up to 10 s.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

class InterruptHandlerTest : public ::testing::Test {
 protected:
  void Start(FakeCoordinator::Options options = {}) {
    fake_ = std::make_unique<FakeCoordinator>(options);
    fake_->AddWorker("w0");
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(
        static_cast<v1::Coordinator::Service*>(fake_.get()));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    client_ = *CoordinatorClient::Create(absl::StrCat("127.0.0.1:", port),
                                         absl::Seconds(5));
    v1::SubmitJobRequest request;
    request.set_yaml(kJob);
    request.set_file_name("job.yaml");
    absl::StatusOr<v1::Job> job = client_->SubmitJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    job_id_ = job->id();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::ostringstream err_;
  std::unique_ptr<FakeCoordinator> fake_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorClient> client_;
  std::string job_id_;
};

TEST_F(InterruptHandlerTest, RecordsTheSignalAndRestoresTheDisposition) {
  {
    absl::StatusOr<std::unique_ptr<InterruptHandler>> handler =
        InterruptHandler::Install(absl::Seconds(5), err_);
    ASSERT_TRUE(handler.ok()) << handler.status();
    EXPECT_EQ((*handler)->signal(), 0);
    // Only one at a time: the signal pipe is process-wide.
    EXPECT_EQ(InterruptHandler::Install(absl::Seconds(5), err_).status().code(),
              absl::StatusCode::kFailedPrecondition);
    raise(SIGTERM);  // Would end the test binary without the handler.
    EXPECT_TRUE(Eventually([&] { return (*handler)->signal() == SIGTERM; }));
    raise(SIGINT);  // A second signal: the first one stays.
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_EQ((*handler)->signal(), SIGTERM);
  }
  EXPECT_THAT(err_.str(),
              HasSubstr("conveyorctl: SIGTERM: cancelling the job"));
  struct sigaction now;
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  // And it can be installed again.
  EXPECT_TRUE(InterruptHandler::Install(absl::Seconds(5), err_).ok());
}

TEST_F(InterruptHandlerTest, CancelsTheTrackedJob) {
  Start();
  absl::StatusOr<std::unique_ptr<InterruptHandler>> handler =
      InterruptHandler::Install(absl::Seconds(5), err_);
  ASSERT_TRUE(handler.ok());
  (*handler)->Track(client_.get(), job_id_);
  raise(SIGINT);
  EXPECT_TRUE(Eventually([&] { return !fake_->cancelled().empty(); }));
  EXPECT_THAT(fake_->cancelled(), ElementsAre(job_id_));
  (*handler)->Untrack();
}

TEST_F(InterruptHandlerTest, ASignalBeforeTrackingCancelsOnTrack) {
  Start();
  absl::StatusOr<std::unique_ptr<InterruptHandler>> handler =
      InterruptHandler::Install(absl::Seconds(5), err_);
  ASSERT_TRUE(handler.ok());
  raise(SIGINT);
  EXPECT_TRUE(Eventually([&] { return (*handler)->signal() == SIGINT; }));
  EXPECT_TRUE(fake_->cancelled().empty());
  (*handler)->Track(client_.get(), job_id_);
  EXPECT_THAT(fake_->cancelled(), ElementsAre(job_id_));
  (*handler)->Untrack();
}

TEST_F(InterruptHandlerTest, StopsWaitingForAJobThatDoesNotEnd) {
  // The job would end at its next step, ten seconds away; the grace period
  // is shorter.
  Start({.step_delay = absl::Seconds(10)});
  absl::StatusOr<std::unique_ptr<InterruptHandler>> handler =
      InterruptHandler::Install(absl::Milliseconds(200), err_);
  ASSERT_TRUE(handler.ok());
  (*handler)->Track(client_.get(), job_id_);
  std::thread interrupter([] {
    absl::SleepFor(absl::Milliseconds(300));
    raise(SIGINT);
  });
  const absl::Time start = absl::Now();
  absl::Status watch = client_->WatchJob(job_id_, [](const v1::JobEvent&) {});
  interrupter.join();
  EXPECT_EQ(watch.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(err_.str(), HasSubstr("did not end within 200ms"));
  (*handler)->Untrack();
}

}  // namespace
}  // namespace conveyor::cli
