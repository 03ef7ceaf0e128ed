// WorkerSession against a fake coordinator: an in-process gRPC server on
// 127.0.0.1:0 implementing WorkerSession, which records what the worker
// sends and lets the test answer. Covers registration (versions, refusal),
// heartbeats, reconnection, and a job's messages from PrepareJob to
// JobEnded, including busy, cancel, prepare timeout and shutdown.
#include "worker/session.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/build_info.h"
#include "conveyor/v1/conveyor.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "job/planner.h"
#include "job/rank_program.h"
#include "proto/protocol.h"

namespace conveyor::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;
using ServerStream =
    grpc::ServerReaderWriter<v1::CoordinatorMessage, v1::WorkerMessage>;

constexpr absl::Duration kWait = absl::Seconds(10);

class FakeCoordinator final : public v1::WorkerSession::Service {
 public:
  // Not OK: end every stream with this status after reading the register.
  void set_refusal(grpc::Status refusal) {
    absl::MutexLock lock(&mu_);
    refusal_ = std::move(refusal);
  }

  grpc::Status Session(grpc::ServerContext* context,
                       ServerStream* stream) override {
    v1::WorkerMessage message;
    if (!stream->Read(&message)) return grpc::Status::CANCELLED;
    int number = 0;
    {
      absl::MutexLock lock(&mu_);
      number = ++streams_;
      const auto& metadata = context->client_metadata();
      const auto it = metadata.find("authorization");
      authorization_ = it == metadata.end()
                           ? ""
                           : std::string(it->second.data(), it->second.size());
      if (!refusal_.ok()) {
        received_.push_back(message);
        return refusal_;
      }
      context_ = context;
      stream_ = stream;
    }
    v1::CoordinatorMessage registered;
    registered.mutable_registered()->set_worker_id(
        absl::StrCat("worker-", number));
    registered.mutable_registered()->set_heartbeat_interval_ms(50);
    Send(registered);
    {
      // Only now may the test see the registration and send its own
      // messages, which must come after Registered.
      absl::MutexLock lock(&mu_);
      received_.push_back(message);
    }
    while (stream->Read(&message)) {
      absl::MutexLock lock(&mu_);
      received_.push_back(message);
    }
    // The stream dies with this call: wait out a Send still writing to it
    // (a Leave makes the worker close its end while Write returns).
    absl::MutexLock write_lock(&write_mu_);
    absl::MutexLock lock(&mu_);
    ++ended_streams_;
    stream_ = nullptr;
    context_ = nullptr;
    return grpc::Status::OK;
  }

  void Send(const v1::CoordinatorMessage& message) {
    absl::MutexLock lock(&write_mu_);
    ServerStream* stream;
    {
      absl::MutexLock l(&mu_);
      stream = stream_;
    }
    ASSERT_NE(stream, nullptr);
    EXPECT_TRUE(stream->Write(message));
  }

  // The authorization metadata of the newest stream ("" without).
  std::string authorization() {
    absl::MutexLock lock(&mu_);
    return authorization_;
  }

  // Breaks the current stream, as a coordinator restart would.
  void BreakStream() {
    absl::MutexLock lock(&mu_);
    if (context_ != nullptr) context_->TryCancel();
  }

  // Waits for and removes the first received message matching `match`.
  // (The condition only looks: absl may evaluate it more than once.)
  std::optional<v1::WorkerMessage> Take(
      const std::function<bool(const v1::WorkerMessage&)>& match) {
    absl::MutexLock lock(&mu_);
    auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find_if(received_.begin(), received_.end(), match);
    };
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return find() != received_.end();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), kWait)) {
      return std::nullopt;
    }
    auto it = find();
    v1::WorkerMessage found = *it;
    received_.erase(it);
    return found;
  }

  std::optional<v1::WorkerMessage> TakeKind(v1::WorkerMessage::KindCase kind) {
    return Take(
        [kind](const v1::WorkerMessage& m) { return m.kind_case() == kind; });
  }

  std::optional<v1::JobEnded> TakeEnded(const std::string& job_id) {
    auto m = Take([&](const v1::WorkerMessage& m) {
      return m.has_ended() && m.ended().job_id() == job_id;
    });
    if (!m) return std::nullopt;
    return m->ended();
  }

  // Waits until `n` streams have ended on the coordinator's side.
  bool WaitForEndedStreams(int n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ended_streams_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kWait);
  }

  int streams() {
    absl::MutexLock lock(&mu_);
    return streams_;
  }
  int CountKind(v1::WorkerMessage::KindCase kind) {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& m : received_) n += m.kind_case() == kind;
    return n;
  }

 private:
  absl::Mutex mu_;
  absl::Mutex write_mu_;
  grpc::Status refusal_ ABSL_GUARDED_BY(mu_);
  std::string authorization_ ABSL_GUARDED_BY(mu_);
  grpc::ServerContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  ServerStream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
  int streams_ ABSL_GUARDED_BY(mu_) = 0;
  int ended_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    if (session_ != nullptr) {
      session_->Shutdown();
      if (run_.joinable()) run_.join();
    }
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }

  SessionOptions Options() {
    SessionOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", port_);
    o.name = "test-worker";
    o.devices = {"cpu:2"};
    o.data_address = "127.0.0.1:0";
    o.reconnect_interval = std::chrono::milliseconds(100);
    o.shutdown_grace = std::chrono::milliseconds(1000);
    return o;
  }

  // Runs the session on a thread; run_status_ gets Run's result.
  void StartSession(const SessionOptions& options) {
    auto session = WorkerSession::Create(options);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    run_ = std::thread([this] {
      absl::Status s = session_->Run();
      absl::MutexLock lock(&run_mu_);
      run_status_ = s;
      run_done_ = true;
    });
  }

  // Waits for Run to return; false after kWait.
  bool WaitForRun() {
    absl::MutexLock lock(&run_mu_);
    if (!run_mu_.AwaitWithTimeout(absl::Condition(&run_done_), kWait)) {
      return false;
    }
    return true;
  }
  absl::Status run_status() {
    absl::MutexLock lock(&run_mu_);
    return run_status_;
  }

  void Send(const v1::CoordinatorMessage& m) { fake_.Send(m); }

  // Starts a session running "job-1" (a million steps: it runs until
  // stopped); its first step report, or nullopt.
  std::optional<v1::WorkerMessage> StartRunningJob();

  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<WorkerSession> session_;
  std::thread run_;
  absl::Mutex run_mu_;
  bool run_done_ ABSL_GUARDED_BY(run_mu_) = false;
  absl::Status run_status_ ABSL_GUARDED_BY(run_mu_);
};

// A one-stage job: one rank, which makes the whole data plane one channel.
v1::JobProgram Program(const std::string& id, int64_t steps) {
  const std::string yaml = absl::StrCat(
      "name: tiny\n"
      "model:\n  input_shape: [4]\n  init: {seed: 1}\n  layers:\n"
      "    - dense: {features: 8}\n    - relu\n    - dense: {features: 2}\n"
      "  loss: mse\n"
      "data: {source: synthetic-regression, seed: 2}\n"
      "training: {steps: ",
      steps,
      ", batch_size: 4, microbatches: 2}\n"
      "optimizer: {kind: sgd, lr: 0.1}\n");
  auto job = job::ParseJobSpec(yaml, "tiny.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  auto plan = job::PlanJob(*job);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return job::CompileRankProgram(*plan, 0,
                                 {.job_id = id,
                                  .job_number = 3,
                                  .secret = "secret",
                                  .yaml = yaml,
                                  .file_name = "tiny.yaml"});
}

v1::CoordinatorMessage Prepare(const v1::JobProgram& program) {
  v1::CoordinatorMessage m;
  *m.mutable_prepare()->mutable_program() = program;
  return m;
}

v1::CoordinatorMessage Start(const std::string& id,
                             const std::string& endpoint) {
  v1::CoordinatorMessage m;
  m.mutable_start()->set_job_id(id);
  m.mutable_start()->add_peers(endpoint);
  return m;
}

v1::CoordinatorMessage Cancel(const std::string& id,
                              const std::string& reason) {
  v1::CoordinatorMessage m;
  m.mutable_cancel()->set_job_id(id);
  m.mutable_cancel()->set_reason(reason);
  return m;
}

std::optional<v1::WorkerMessage> SessionTest::StartRunningJob() {
  StartSession(Options());
  if (!fake_.TakeKind(v1::WorkerMessage::kRegister).has_value()) {
    return std::nullopt;
  }
  Send(Prepare(Program("job-1", 1000000)));
  auto ready = fake_.TakeKind(v1::WorkerMessage::kReady);
  if (!ready.has_value()) return std::nullopt;
  Send(Start("job-1", ready->ready().data_endpoint()));
  return fake_.TakeKind(v1::WorkerMessage::kStep);
}

TEST_F(SessionTest, RegistersWithVersionsAndSendsHeartbeats) {
  StartSession(Options());
  auto reg = fake_.TakeKind(v1::WorkerMessage::kRegister);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->register_().protocol_version(), proto::kProtocolVersion);
  EXPECT_EQ(reg->register_().version(), kVersion);
  EXPECT_EQ(reg->register_().name(), "test-worker");
  EXPECT_THAT(reg->register_().devices(), ::testing::ElementsAre("cpu:2"));
  EXPECT_EQ(reg->register_().data_address(), "127.0.0.1:0");

  // Every 50 ms, as the coordinator asked; idle, so without a job id.
  for (int i = 0; i < 3; ++i) {
    auto beat = fake_.TakeKind(v1::WorkerMessage::kHeartbeat);
    ASSERT_TRUE(beat.has_value()) << "heartbeat " << i;
    EXPECT_EQ(beat->heartbeat().job_id(), "");
  }
  EXPECT_EQ(session_->worker_id(), "worker-1");
  EXPECT_EQ(session_->registrations(), 1);

  // Shutdown closes the stream cleanly (the coordinator sees its end) and
  // makes Run return OK.
  const Clock::time_point start = Clock::now();
  session_->Shutdown();
  ASSERT_TRUE(WaitForRun());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(run_status().ok()) << run_status();
  EXPECT_TRUE(fake_.WaitForEndedStreams(1));
  EXPECT_EQ(fake_.streams(), 1);
}

TEST_F(SessionTest, VersionSkewStopsTheSessionWithTheCoordinatorsError) {
  fake_.set_refusal(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "version skew: worker 0.0.1, coordinator "
                                 "0.1.0"));
  StartSession(Options());
  ASSERT_TRUE(WaitForRun());
  EXPECT_EQ(run_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(run_status().message()),
              HasSubstr("version skew: worker 0.0.1"));
  EXPECT_EQ(session_->registrations(), 0);
  // Not retried: a skewed build stays skewed.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(fake_.streams(), 1);
}

TEST_F(SessionTest, PresentsItsTokenAndStopsWhenTheCoordinatorRefusesIt) {
  fake_.set_refusal(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "the coordinator requires an auth token"));
  SessionOptions options = Options();
  options.auth_token = "t0ken";
  StartSession(options);
  ASSERT_TRUE(WaitForRun());
  EXPECT_EQ(run_status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(fake_.authorization(), "Bearer t0ken");
  // Not retried: a wrong token stays wrong.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(fake_.streams(), 1);
}

TEST_F(SessionTest, ReconnectsAndRegistersAgainAfterTheStreamBreaks) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kHeartbeat).has_value());
  fake_.BreakStream();
  ASSERT_TRUE(fake_.WaitForEndedStreams(1));
  // A second registration, and heartbeats on the new stream.
  const Clock::time_point start = Clock::now();
  while (session_->registrations() < 2 &&
         Clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(session_->registrations(), 2);
  EXPECT_EQ(fake_.streams(), 2);
  EXPECT_EQ(session_->worker_id(), "worker-2");
  EXPECT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  EXPECT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
}

TEST_F(SessionTest, RunsAJobThenRefusesASecondWhileBusyAndCancels) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());

  // job-1 runs to the end: ready, one report per step, SUCCEEDED.
  Send(Prepare(Program("job-1", 2)));
  auto ready = fake_.TakeKind(v1::WorkerMessage::kReady);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->ready().job_id(), "job-1");
  EXPECT_THAT(ready->ready().data_endpoint(), StartsWith("127.0.0.1:"));
  EXPECT_NE(ready->ready().data_endpoint(), "127.0.0.1:0");
  auto busy_beat = fake_.Take([](const v1::WorkerMessage& m) {
    return m.has_heartbeat() && m.heartbeat().job_id() == "job-1";
  });
  EXPECT_TRUE(busy_beat.has_value());
  Send(Start("job-1", ready->ready().data_endpoint()));
  for (int step = 1; step <= 2; ++step) {
    auto report = fake_.TakeKind(v1::WorkerMessage::kStep);
    ASSERT_TRUE(report.has_value());
    EXPECT_EQ(report->step().job_id(), "job-1");
    EXPECT_EQ(report->step().step(), step);
    EXPECT_TRUE(report->step().has_loss());
    EXPECT_GT(report->step().loss(), 0);
    EXPECT_DOUBLE_EQ(report->step().learning_rate(), 0.1);
    EXPECT_GT(report->step().seconds(), 0);
  }
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::SUCCEEDED) << ended->message();

  // job-2 is prepared and never started; job-3 is refused meanwhile.
  Send(Prepare(Program("job-2", 1)));
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kReady).has_value());
  Send(Prepare(Program("job-3", 1)));
  auto busy = fake_.TakeEnded("job-3");
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->state(), v1::FAILED);
  EXPECT_EQ(busy->message(), "worker busy with job-2");

  // Cancelling job-2 releases the worker, which then serves job-4.
  Send(Cancel("job-2", "user asked"));
  auto cancelled = fake_.TakeEnded("job-2");
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_EQ(cancelled->message(), "user asked");
  Send(Prepare(Program("job-4", 1)));
  auto ready4 = fake_.TakeKind(v1::WorkerMessage::kReady);
  ASSERT_TRUE(ready4.has_value());
  EXPECT_EQ(ready4->ready().job_id(), "job-4");
}

TEST_F(SessionTest, APreparedJobNeverStartedGivesUp) {
  SessionOptions options = Options();
  options.prepare_timeout = std::chrono::milliseconds(200);
  StartSession(options);
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  Send(Prepare(Program("job-1", 1)));
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kReady).has_value());
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::FAILED);
  EXPECT_EQ(ended->code(),
            static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(ended->message(), StartsWith("rank 0 (stage 0): no StartJob"));
}

TEST_F(SessionTest, AJobTheBuildDisagreesWithFailsWithItsReason) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  v1::JobProgram program = Program("job-1", 1);
  program.mutable_stages(0)->set_parameter_names(0, "layers.0.kernel");
  Send(Prepare(program));
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::FAILED);
  EXPECT_EQ(ended->code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(ended->message(),
              StartsWith("rank 0 (stage 0): program/build mismatch"));
  EXPECT_EQ(fake_.CountKind(v1::WorkerMessage::kReady), 0);
}

v1::CoordinatorMessage Profile(const std::string& id, const std::string& yaml) {
  v1::CoordinatorMessage m;
  m.mutable_profile()->set_job_id(id);
  m.mutable_profile()->set_yaml(yaml);
  m.mutable_profile()->set_file_name("tiny.yaml");
  m.mutable_profile()->set_repetitions(1);
  return m;
}

TEST_F(SessionTest, ProfilesEveryLayerThenHoldsItselfForThePrepare) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  const v1::JobProgram program = Program("job-1", 1);
  Send(Profile("job-1", program.yaml()));
  auto profile = fake_.TakeKind(v1::WorkerMessage::kProfile);
  ASSERT_TRUE(profile.has_value());
  EXPECT_EQ(profile->profile().job_id(), "job-1");
  EXPECT_EQ(profile->profile().device(), "cpu:2");  // Options()'s devices
  ASSERT_EQ(profile->profile().layers_size(), 3);   // dense, relu, dense
  EXPECT_EQ(profile->profile().layers(0).parameter_bytes(), (4 * 8 + 8) * 4);
  EXPECT_EQ(profile->profile().layers(1).parameter_bytes(), 0);
  EXPECT_GT(profile->profile().layers(2).activation_bytes(), 0);
  // Then the job itself is prepared as usual.
  Send(Prepare(program));
  auto ready = fake_.TakeKind(v1::WorkerMessage::kReady);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->ready().job_id(), "job-1");
  Send(Cancel("job-1", "done"));
  ASSERT_TRUE(fake_.TakeEnded("job-1").has_value());
}

TEST_F(SessionTest, ACancelAfterTheProfileIsAnsweredSoTheWorkerIsFreed) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  Send(Profile("job-1", Program("job-1", 1).yaml()));
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kProfile).has_value());
  Send(Cancel("job-1", "user asked"));
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::CANCELLED);
  EXPECT_EQ(ended->message(), "user asked");
  // Free again.
  Send(Prepare(Program("job-2", 1)));
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kReady).has_value());
}

TEST_F(SessionTest, AProfileOfABadJobFailsWithItsPosition) {
  StartSession(Options());
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kRegister).has_value());
  Send(Profile("job-1", "model: {input_shape: [4], layers: [], lost: 1}\n"));
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::FAILED);
  EXPECT_THAT(ended->message(), StartsWith("profiling the layers: tiny.yaml:"));
  EXPECT_EQ(fake_.CountKind(v1::WorkerMessage::kProfile), 0);
  // The worker is free for the next job.
  Send(Prepare(Program("job-2", 1)));
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kReady).has_value());
}

TEST_F(SessionTest, ShutdownCancelsTheRunningJobAndClosesTheStream) {
  ASSERT_TRUE(StartRunningJob().has_value());

  const Clock::time_point start = Clock::now();
  session_->Shutdown();
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::CANCELLED);
  EXPECT_EQ(ended->message(), "worker shutting down");
  ASSERT_TRUE(WaitForRun());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(run_status().ok()) << run_status();
  EXPECT_TRUE(fake_.WaitForEndedStreams(1));
}

// A drain as the coordinator runs it: the rank answers the end of the step
// it is in and holds there until it hears where to stop, runs to that step
// and ends with drained_after_step; the worker's own Drain asks the
// coordinator, and Leave ends the session (Deregister first).
TEST_F(SessionTest, DrainHoldsAtTheAnsweredBoundaryThenStopsWhereTold) {
  const std::optional<v1::WorkerMessage> first = StartRunningJob();
  ASSERT_TRUE(first.has_value());

  v1::CoordinatorMessage ask;
  ask.mutable_drain()->set_job_id("job-1");
  Send(ask);
  auto point = fake_.TakeKind(v1::WorkerMessage::kDrainPoint);
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->drain_point().job_id(), "job-1");
  const int64_t boundary = point->drain_point().step();
  EXPECT_GE(boundary, 1);
  // Held: no step past the boundary while the answer is on its way.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int64_t last = first->step().step();
  while (fake_.CountKind(v1::WorkerMessage::kStep) > 0) {
    last =
        std::max(last, fake_.TakeKind(v1::WorkerMessage::kStep)->step().step());
  }
  EXPECT_EQ(last, boundary);

  v1::CoordinatorMessage stop;
  stop.mutable_drain()->set_job_id("job-1");
  stop.mutable_drain()->set_stop_after_step(boundary + 2);
  Send(stop);
  auto ended = fake_.TakeEnded("job-1");
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), v1::CANCELLED);
  EXPECT_EQ(ended->drained_after_step(), boundary + 2);
  EXPECT_EQ(ended->message(),
            absl::StrCat("drained after step ", boundary + 2));
  int64_t after = 0;
  while (fake_.CountKind(v1::WorkerMessage::kStep) > 0) {
    after = std::max(after,
                     fake_.TakeKind(v1::WorkerMessage::kStep)->step().step());
  }
  EXPECT_EQ(after, boundary + 2);

  session_->Drain("signal 15");
  auto request = fake_.TakeKind(v1::WorkerMessage::kDrain);
  ASSERT_TRUE(request.has_value());
  EXPECT_EQ(request->drain().reason(), "signal 15");
  v1::CoordinatorMessage leave;
  leave.mutable_leave()->set_reason("drained");
  Send(leave);
  ASSERT_TRUE(fake_.TakeKind(v1::WorkerMessage::kDeregister).has_value());
  ASSERT_TRUE(WaitForRun());
  EXPECT_TRUE(run_status().ok()) << run_status();
}

// Drain without a coordinator to hand the job to: shut down at once.
TEST_F(SessionTest, ADrainWithoutACoordinatorShutsDown) {
  SessionOptions options = Options();
  options.coordinator = "127.0.0.1:1";  // Nothing listens there.
  StartSession(options);
  session_->Drain("signal 15");
  ASSERT_TRUE(WaitForRun());
  EXPECT_TRUE(run_status().ok()) << run_status();
}

}  // namespace
}  // namespace conveyor::worker
