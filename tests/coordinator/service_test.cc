// The coordinator's gRPC services over a real loopback server: status codes
// reach clients unchanged, a session registers and receives its reply first,
// version skew ends the stream with FAILED_PRECONDITION, and a worker whose
// stream ends is LOST.
#include "coordinator/service.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/protocol.h"
#include "tests/coordinator/test_util.h"

namespace conveyor::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ServiceTest : public ::testing::Test {
 protected:
  // With a non-empty token both services require it.
  explicit ServiceTest(const std::string& token = "",
                       CoordinatorService::WatchLimits limits = {})
      : manager_({.heartbeat_timeout = std::chrono::seconds(5),
                  .version = kVersion}),
        coordinator_(&manager_, token, limits),
        sessions_(&manager_, token) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&coordinator_);
    builder.RegisterService(&sessions_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                   grpc::InsecureChannelCredentials());
  }
  ~ServiceTest() override {
    manager_.Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }

  v1::WorkerMessage Register(const std::string& version,
                             const std::string& name = "w") {
    v1::WorkerMessage m;
    v1::RegisterRequest* r = m.mutable_register_();
    r->set_protocol_version(proto::kProtocolVersion);
    r->set_version(version);
    r->set_name(name);
    r->add_devices("cpu:1");
    return m;
  }

  // A worker session that registered (its reply read); it stays open until
  // the struct goes or its context is cancelled.
  struct Session {
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>>
        stream;
    v1::CoordinatorMessage reply;
  };
  std::unique_ptr<Session> Registered(const std::string& name = "w") {
    auto session = std::make_unique<Session>();
    session->stream =
        v1::WorkerSession::NewStub(channel_)->Session(&session->context);
    EXPECT_TRUE(session->stream->Write(Register(kVersion, name)));
    EXPECT_TRUE(session->stream->Read(&session->reply));
    return session;
  }

  // A one-rank job that stays PLANNING (its worker never reports ready),
  // for watching; its id.
  std::string SubmitStuckJob() {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.set_yaml(JobYaml(1));
    v1::SubmitJobResponse submitted;
    EXPECT_TRUE(v1::Coordinator::NewStub(channel_)
                    ->SubmitJob(&context, request, &submitted)
                    .ok());
    return submitted.job().id();
  }

  // An open WatchJob stream; it stays open until the struct goes or its
  // context is cancelled.
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  };
  std::unique_ptr<Watch> OpenWatch(const std::string& job_id) {
    auto w = std::make_unique<Watch>();
    v1::WatchJobRequest request;
    request.set_id(job_id);
    w->reader =
        v1::Coordinator::NewStub(channel_)->WatchJob(&w->context, request);
    return w;
  }

  int LostWorkers() {
    int lost = 0;
    for (const v1::Worker& w : manager_.ListWorkers()) {
      lost += w.state() == v1::LOST;
    }
    return lost;
  }

  JobManager manager_;
  CoordinatorService coordinator_;
  WorkerSessionService sessions_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServiceTest, SessionRegistersAndItsEndMarksTheWorkerLost) {
  std::unique_ptr<Session> session = Registered();
  EXPECT_EQ(session->reply.registered().worker_id(), "worker-1");
  ASSERT_EQ(manager_.ListWorkers().size(), 1u);
  EXPECT_EQ(manager_.ListWorkers()[0].state(), v1::IDLE);
  session->stream->WritesDone();
  EXPECT_TRUE(session->stream->Finish().ok());
  for (int i = 0; i < 100 && LostWorkers() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(LostWorkers(), 1);
}

TEST_F(ServiceTest, AWorkerThatVanishesIsLost) {
  std::unique_ptr<Session> session = Registered();
  session->context.TryCancel();
  for (int i = 0; i < 500 && LostWorkers() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(LostWorkers(), 1);
  ASSERT_EQ(manager_.ListWorkers().size(), 1u);
  EXPECT_THAT(manager_.ListWorkers()[0].lost_reason(),
              HasSubstr("control connection closed"));
}

TEST_F(ServiceTest, ASessionTheManagerEndsTellsTheWorkerWhy) {
  // A second registration on a registered session is a protocol error:
  // the manager declares the worker lost, and the worker reads why in the
  // stream's status (with a thread per session it read only CANCELLED).
  std::unique_ptr<Session> session = Registered();
  ASSERT_TRUE(session->stream->Write(Register(kVersion)));
  v1::CoordinatorMessage m;
  while (session->stream->Read(&m)) {
  }
  const grpc::Status status = session->stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("declared lost"));
  EXPECT_THAT(status.error_message(), HasSubstr("already registered"));
  EXPECT_EQ(LostWorkers(), 1);
}

TEST_F(ServiceTest, ASessionThatNeverRegistersEndsCancelled) {
  auto stub = v1::WorkerSession::NewStub(channel_);
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  ASSERT_TRUE(stream->WritesDone());
  v1::CoordinatorMessage m;
  EXPECT_FALSE(stream->Read(&m));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(manager_.ListWorkers().empty());
}

TEST_F(ServiceTest, VersionSkewEndsTheSessionWithFailedPrecondition) {
  auto stub = v1::WorkerSession::NewStub(channel_);
  grpc::ClientContext context;
  auto stream = stub->Session(&context);
  ASSERT_TRUE(stream->Write(Register("0.0.0-old")));
  v1::CoordinatorMessage reply;
  EXPECT_FALSE(stream->Read(&reply));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("0.0.0-old"));
  EXPECT_TRUE(manager_.ListWorkers().empty());
}

TEST_F(ServiceTest, StatusCodesReachTheClientUnchanged) {
  auto stub = v1::Coordinator::NewStub(channel_);
  {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.set_yaml("model: [");
    request.set_file_name("bad.yaml");
    v1::SubmitJobResponse response;
    grpc::Status s = stub->SubmitJob(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("bad.yaml:1:"));
  }
  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id("job-42");
    v1::Job job;
    EXPECT_EQ(stub->GetJob(&context, request, &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_id("job-42");
    auto reader = stub->WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// Watch streams once each held a server thread: 792 of them exhausted the
// server, refusing every other call. Past the caps a watch is refused at
// once, and workers and job control are still served.
class WatchLimitServiceTest : public ServiceTest {
 protected:
  WatchLimitServiceTest()
      : ServiceTest("", {.max_total = 3, .max_per_client = 2}) {}
};

TEST_F(WatchLimitServiceTest, WatchesPastTheCapAreRefusedAndOtherCallsServed) {
  std::unique_ptr<Session> worker = Registered();
  auto stub = v1::Coordinator::NewStub(channel_);
  const std::string job_id = SubmitStuckJob();
  auto open = [&] { return OpenWatch(job_id); };
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 2; ++i) {
    watches.push_back(open());
    v1::JobEvent event;
    ASSERT_TRUE(watches.back()->reader->Read(&event));  // The job as it is.
  }
  std::unique_ptr<Watch> refused = open();
  v1::JobEvent event;
  EXPECT_FALSE(refused->reader->Read(&event));
  const grpc::Status status = refused->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("too many open watch streams: 2 from 127.0.0.1"));
  // Job control and worker registration go on.
  {
    grpc::ClientContext context;
    v1::ListJobsResponse jobs;
    EXPECT_TRUE(stub->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
    EXPECT_EQ(jobs.jobs_size(), 1);
  }
  std::unique_ptr<Session> second = Registered("w2");
  EXPECT_EQ(second->reply.registered().worker_id(), "worker-2");
  // A watch that ends gives its place back.
  watches[0]->context.TryCancel();
  (void)watches[0]->reader->Finish();
  bool reopened = false;
  for (int i = 0; i < 100 && !reopened; ++i) {
    std::unique_ptr<Watch> again = open();
    reopened = again->reader->Read(&event);
    again->context.TryCancel();
    (void)again->reader->Finish();
    if (!reopened) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(reopened);
  for (auto& w : watches) w->context.TryCancel();
  worker->context.TryCancel();
  second->context.TryCancel();
}

// Watches hold no server thread (coordinator/watch_hub.h): 1,000 watchers of
// one job leave the process's threads nearly where they were (with a
// thread per stream, as before, they grew by 1,000), every watcher gets the
// job's news, and every stream ends when the job does.
class ManyWatchersServiceTest : public ServiceTest {
 protected:
  ManyWatchersServiceTest()
      : ServiceTest("", {.max_total = 2000, .max_per_client = 2000}) {}

  static int Threads() {
    int n = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator("/proc/self/task")) {
      (void)entry;
      ++n;
    }
    return n;
  }
};

TEST_F(ManyWatchersServiceTest, WatchersHoldNoThreadAndAllSeeTheEnd) {
  std::unique_ptr<Session> worker = Registered();
  auto stub = v1::Coordinator::NewStub(channel_);
  const std::string job_id = SubmitStuckJob();
  const int before = Threads();
  constexpr int kWatchers = 1000;
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < kWatchers; ++i) {
    std::unique_ptr<Watch> w = OpenWatch(job_id);
    v1::JobEvent event;
    ASSERT_TRUE(w->reader->Read(&event)) << i;  // The job as it is.
    EXPECT_EQ(event.job().id(), job_id);
    watches.push_back(std::move(w));
  }
  EXPECT_EQ(coordinator_.open_watches(), kWatchers);
  const int during = Threads();
  std::cout << "threads: " << before << " before, " << during << " with "
            << kWatchers << " watchers\n";
  // gRPC's own pollers and callback executor grow a little with load; a
  // thread per stream would add kWatchers.
  EXPECT_LT(during - before, 64);
  // Job control is served meanwhile, and its news reaches every watcher.
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(job_id);
    v1::Job cancelled;
    ASSERT_TRUE(stub->CancelJob(&context, request, &cancelled).ok());
  }
  for (auto& w : watches) {
    v1::JobEvent event;
    v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
    while (w->reader->Read(&event)) last = event.job().state();
    EXPECT_EQ(last, v1::CANCELLED);
    EXPECT_TRUE(w->reader->Finish().ok());
  }
  for (int i = 0; i < 100 && coordinator_.open_watches() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(coordinator_.open_watches(), 0);
  // A watch of an unknown job ends at once, NOT_FOUND.
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_id("job-999");
  auto unknown = stub->WatchJob(&context, request);
  v1::JobEvent event;
  EXPECT_FALSE(unknown->Read(&event));
  EXPECT_EQ(unknown->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  worker->context.TryCancel();
}

// Worker sessions hold no thread either: a coordinator of 4,096 workers
// spent two threads per session (about 700 MiB) before they moved to the
// callback API. Every session is registered, answered and, when the
// coordinator shuts down, ended.
TEST_F(ManyWatchersServiceTest, WorkerSessionsHoldNoThread) {
  const int before = Threads();
  constexpr int kSessions = 300;
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(Registered(absl::StrCat("w", i)));
    ASSERT_EQ(sessions.back()->reply.kind_case(),
              v1::CoordinatorMessage::kRegistered)
        << i;
  }
  const int during = Threads();
  std::cout << "threads: " << before << " before, " << during << " with "
            << kSessions << " sessions\n";
  EXPECT_LT(during - before, 64);
  EXPECT_EQ(manager_.ListWorkers().size(), static_cast<size_t>(kSessions));
  // Every session still answers: a heartbeat on each keeps it IDLE.
  for (auto& s : sessions) {
    v1::WorkerMessage beat;
    beat.mutable_heartbeat();
    ASSERT_TRUE(s->stream->Write(beat));
  }
  for (auto& s : sessions) ASSERT_TRUE(s->stream->WritesDone());
  for (auto& s : sessions) {
    v1::CoordinatorMessage m;
    while (s->stream->Read(&m)) {
    }
    EXPECT_TRUE(s->stream->Finish().ok());
  }
  for (int i = 0; i < 500 && LostWorkers() < kSessions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(LostWorkers(), kSessions);
}

class AuthServiceTest : public ServiceTest {
 protected:
  AuthServiceTest() : ServiceTest("s3cret-token") {}

  grpc::StatusCode ListJobsWith(const char* metadata) {
    auto stub = v1::Coordinator::NewStub(channel_);
    grpc::ClientContext context;
    if (metadata != nullptr) context.AddMetadata("authorization", metadata);
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response)
        .error_code();
  }
};

TEST_F(AuthServiceTest, CallsWithoutTheRightTokenAreUnauthenticated) {
  EXPECT_EQ(ListJobsWith(nullptr), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListJobsWith("Bearer wrong"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListJobsWith("s3cret-token"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListJobsWith("Bearer s3cret-token"), grpc::StatusCode::OK);
  // The refusal says what is missing, never the token.
  auto stub = v1::Coordinator::NewStub(channel_);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer wrong");
  v1::Job job;
  v1::GetJobRequest request;
  request.set_id("job-1");
  const grpc::Status status = stub->GetJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("a wrong auth token"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("s3cret")));
}

TEST_F(AuthServiceTest, ASessionWithoutTheTokenNeverRegisters) {
  for (const char* metadata :
       {static_cast<const char*>(nullptr), "Bearer wrong"}) {
    auto stub = v1::WorkerSession::NewStub(channel_);
    grpc::ClientContext context;
    if (metadata != nullptr) context.AddMetadata("authorization", metadata);
    auto stream = stub->Session(&context);
    stream->Write(Register(kVersion));
    v1::CoordinatorMessage reply;
    EXPECT_FALSE(stream->Read(&reply));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_TRUE(manager_.ListWorkers().empty());
  auto stub = v1::WorkerSession::NewStub(channel_);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer s3cret-token");
  auto stream = stub->Session(&context);
  ASSERT_TRUE(stream->Write(Register(kVersion)));
  v1::CoordinatorMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.registered().worker_id(), "worker-1");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace conveyor::coordinator
