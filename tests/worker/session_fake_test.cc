// WorkerSession against FakeCoordinatorDialer (fake_coordinator_stream.h):
// the stream handling (registration, refusal, an unanswered registration,
// reconnection, Drain, Leave, Shutdown) driven in process, without sockets.
// The jobs' messages are covered over real gRPC by session_test.cc.
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"
#include "tests/worker/fake_coordinator_stream.h"
#include "worker/session.h"

namespace conveyor::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Longer than any test runs: heartbeats only where a test asks for them.
constexpr int64_t kNoHeartbeatsMs = 3600 * 1000;

v1::CoordinatorMessage Registered(const std::string& worker_id,
                                  int64_t heartbeat_interval_ms) {
  v1::CoordinatorMessage m;
  m.mutable_registered()->set_worker_id(worker_id);
  m.mutable_registered()->set_heartbeat_interval_ms(heartbeat_interval_ms);
  return m;
}

v1::CoordinatorMessage Leave(const std::string& reason) {
  v1::CoordinatorMessage m;
  m.mutable_leave()->set_reason(reason);
  return m;
}

class SessionFakeTest : public ::testing::Test {
 protected:
  SessionFakeTest() {
    options_.coordinator = "coordinator.test:7070";
    options_.name = "w1";
    options_.devices = {"cpu:2"};
    options_.data_address = "127.0.0.1:0";
    options_.metrics_address = "127.0.0.1:9100";
    options_.peak_flops_per_device = 5e12;
    options_.reconnect_interval = std::chrono::milliseconds(1);
    // Long enough that the session never cancels a call a test means to
    // end itself.
    options_.shutdown_grace = std::chrono::seconds(30);
    options_.dialer = dialer_;
  }

  ~SessionFakeTest() override {
    if (run_.joinable()) {
      session_->Shutdown();
      // The coordinator's side ends every call, so no test waits out the
      // grace.
      for (int i = 0; i < dialer_->opens(); ++i) {
        dialer_->WaitForOpen(i, absl::ZeroDuration())->End(absl::OkStatus());
      }
      run_.join();
    }
  }

  void StartSession() {
    absl::StatusOr<std::unique_ptr<WorkerSession>> session =
        WorkerSession::Create(options_);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    run_ = std::thread([this] { result_ = session_->Run(); });
  }

  absl::Status JoinRun() {
    run_.join();
    return result_;
  }

  // Answers the n-th stream's registration and waits until the session has
  // taken it in: its first heartbeat comes only once it has.
  std::shared_ptr<FakeCoordinatorStream> Register(int n,
                                                  const std::string& id) {
    std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(n);
    if (stream == nullptr) {
      ADD_FAILURE() << "stream " << n << " never opened";
      return nullptr;
    }
    EXPECT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kRegister));
    stream->Push(Registered(id, 10));
    EXPECT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kHeartbeat));
    return stream;
  }

  std::shared_ptr<FakeCoordinatorDialer> dialer_ =
      std::make_shared<FakeCoordinatorDialer>();
  SessionOptions options_;
  std::unique_ptr<WorkerSession> session_;
  std::thread run_;
  absl::Status result_;
};

TEST_F(SessionFakeTest, RegistersWithItsVersionsNameAndDevices) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(0);
  ASSERT_NE(stream, nullptr);
  std::optional<v1::WorkerMessage> hello = stream->NextWritten();
  ASSERT_TRUE(hello.has_value());
  ASSERT_TRUE(hello->has_register_());
  const v1::RegisterRequest& reg = hello->register_();
  EXPECT_EQ(reg.protocol_version(), proto::kProtocolVersion);
  EXPECT_EQ(reg.version(), kVersion);
  EXPECT_EQ(reg.name(), "w1");
  EXPECT_THAT(reg.devices(), ElementsAre("cpu:2"));
  EXPECT_EQ(reg.data_address(), "127.0.0.1:0");
  EXPECT_EQ(reg.metrics_address(), "127.0.0.1:9100");
  EXPECT_EQ(reg.peak_flops_per_device(), 5e12);
  EXPECT_FALSE(session_->standing().registered);

  stream->Push(Registered("worker-7", 10));
  // Heartbeats follow the registration, naming no job while none runs.
  std::optional<v1::WorkerMessage> beat =
      stream->NextWrittenOfKind(v1::WorkerMessage::kHeartbeat);
  ASSERT_TRUE(beat.has_value());
  EXPECT_EQ(beat->heartbeat().job_id(), "");
  EXPECT_EQ(session_->worker_id(), "worker-7");
  EXPECT_EQ(session_->registrations(), 1);
  const WorkerSession::Standing standing = session_->standing();
  EXPECT_TRUE(standing.registered);
  EXPECT_EQ(standing.detail,
            "registered with coordinator.test:7070 as worker-7");
}

TEST_F(SessionFakeTest, ARefusedRegistrationEndsRunWithTheCoordinatorsError) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kRegister));
  stream->End(absl::FailedPreconditionError("protocol version skew"));
  const absl::Status status = JoinRun();
  EXPECT_EQ(status, absl::FailedPreconditionError("protocol version skew"));
  // Retrying cannot fix a skewed build.
  EXPECT_EQ(dialer_->opens(), 1);
}

TEST_F(SessionFakeTest, AWrongTokenEndsRunToo) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kRegister));
  stream->End(absl::UnauthenticatedError("wrong auth token"));
  EXPECT_EQ(JoinRun(), absl::UnauthenticatedError("wrong auth token"));
  EXPECT_EQ(dialer_->opens(), 1);
}

TEST_F(SessionFakeTest, AnUnansweredRegistrationIsCancelledAndDialedAgain) {
  options_.register_timeout = std::chrono::milliseconds(20);
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> first = dialer_->WaitForOpen(0);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->NextWrittenOfKind(v1::WorkerMessage::kRegister));
  // Nobody answers: after register_timeout the session cancels the call.
  EXPECT_TRUE(first->WaitForCancel());

  std::shared_ptr<FakeCoordinatorStream> second = dialer_->WaitForOpen(1);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(first->WaitForFinish());
  // The first stream's end was recorded before the second was dialed.
  const WorkerSession::Standing standing = session_->standing();
  EXPECT_FALSE(standing.registered);
  EXPECT_THAT(standing.detail, HasSubstr("cannot register with coordinator "
                                         "coordinator.test:7070"));
  EXPECT_EQ(session_->registrations(), 0);

  std::optional<v1::WorkerMessage> hello = second->NextWritten();
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->register_().name(), "w1");
  second->Push(Registered("worker-1", 10));
  EXPECT_TRUE(second->NextWrittenOfKind(v1::WorkerMessage::kHeartbeat));
  EXPECT_EQ(session_->registrations(), 1);
  EXPECT_FALSE(second->cancelled());
}

TEST_F(SessionFakeTest, ABrokenStreamIsDialedAgainAndRegisteredAnew) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> first = Register(0, "worker-1");
  ASSERT_NE(first, nullptr);
  first->End(absl::UnavailableError("coordinator restarted"));
  std::shared_ptr<FakeCoordinatorStream> second = Register(1, "worker-2");
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(session_->registrations(), 2);
  EXPECT_EQ(session_->worker_id(), "worker-2");
  EXPECT_TRUE(session_->standing().registered);
}

TEST_F(SessionFakeTest, LeaveDeregistersThenRunReturnsOk) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = Register(0, "worker-1");
  ASSERT_NE(stream, nullptr);
  stream->Push(Leave("drained"));
  std::optional<v1::WorkerMessage> bye =
      stream->NextWrittenOfKind(v1::WorkerMessage::kDeregister);
  ASSERT_TRUE(bye.has_value());
  EXPECT_EQ(bye->deregister().reason(), "the worker is shutting down");
  // Then the worker closes its side and waits for the coordinator to end
  // the call.
  ASSERT_TRUE(stream->WaitForWritesDone());
  EXPECT_EQ(stream->NextWritten(absl::ZeroDuration()), std::nullopt);
  stream->End(absl::OkStatus());
  EXPECT_TRUE(JoinRun().ok());
  EXPECT_FALSE(stream->cancelled());
  EXPECT_EQ(dialer_->opens(), 1);
}

TEST_F(SessionFakeTest, DrainAsksTheCoordinatorThenLeaves) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = Register(0, "worker-1");
  ASSERT_NE(stream, nullptr);
  session_->Drain("maintenance");
  std::optional<v1::WorkerMessage> drain =
      stream->NextWrittenOfKind(v1::WorkerMessage::kDrain);
  ASSERT_TRUE(drain.has_value());
  EXPECT_EQ(drain->drain().reason(), "maintenance");
  stream->Push(Leave("drained"));
  EXPECT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kDeregister));
  ASSERT_TRUE(stream->WaitForWritesDone());
  stream->End(absl::OkStatus());
  EXPECT_TRUE(JoinRun().ok());
}

TEST_F(SessionFakeTest, ShutdownBeforeTheAnswerCancelsTheCall) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kRegister));
  session_->Shutdown();
  EXPECT_TRUE(stream->WaitForCancel());
  EXPECT_TRUE(JoinRun().ok());
  EXPECT_EQ(dialer_->opens(), 1);
  EXPECT_EQ(session_->standing().detail, "shutting down");
}

TEST_F(SessionFakeTest, MessagesBeforeRegisteredAreIgnored) {
  StartSession();
  std::shared_ptr<FakeCoordinatorStream> stream = dialer_->WaitForOpen(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(stream->NextWrittenOfKind(v1::WorkerMessage::kRegister));
  v1::CoordinatorMessage early;
  early.mutable_start()->set_job_id("job-1");
  stream->Push(early);
  stream->Push(Registered("worker-1", kNoHeartbeatsMs));
  // Registered, a StartJob for a job this worker never prepared is answered
  // FAILED, so the coordinator does not wait for it; the early one was not.
  v1::CoordinatorMessage start;
  start.mutable_start()->set_job_id("job-2");
  stream->Push(start);
  std::optional<v1::WorkerMessage> ended = stream->NextWritten();
  ASSERT_TRUE(ended.has_value());
  ASSERT_TRUE(ended->has_ended()) << ended->DebugString();
  EXPECT_EQ(ended->ended().job_id(), "job-2");
  EXPECT_EQ(ended->ended().state(), v1::FAILED);
  EXPECT_EQ(ended->ended().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(ended->ended().message(), "worker holds no prepared job-2");
}

}  // namespace
}  // namespace conveyor::worker
