#include "coordinator/job_manager.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "common/crc32c.h"
#include "common/yaml_load_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/config_hash.h"
#include "job/rank_program.h"
#include "proto/protocol.h"
#include "tests/coordinator/test_util.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Records what the manager tells its observer (the metrics).
class RecordingObserver final : public JobObserver {
 public:
  void OnSubmitted(const v1::Job& job) override {
    log.push_back("submitted " + job.id());
  }
  void OnStep(const v1::Job& job, const v1::StepSummary& step) override {
    log.push_back(absl::StrCat("step ", job.id(), " ", step.step()));
  }
  void OnFinished(const v1::Job& job) override {
    log.push_back(absl::StrCat("finished ", job.id(), " ",
                               proto::JobStateName(job.state())));
  }
  void OnRestarted(const v1::Job& job, absl::string_view reason,
                   bool layout_changed) override {
    log.push_back(absl::StrCat("restarted ", job.id(), " ", reason,
                               layout_changed ? " relaid out" : ""));
  }
  std::vector<std::string> log;
};

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest()
      : state_file_(OpenStateFile()), manager_(Options(&observer_)) {}

  JobManagerOptions Options(JobObserver* observer) {
    JobManagerOptions options{.heartbeat_timeout = std::chrono::seconds(3),
                              .failure_grace = std::chrono::milliseconds(500),
                              .observer = observer,
                              .state_file = state_file_.get(),
                              .version = kVersion,
                              .clock = [this] { return now_; }};
    options.TEST_before_manifest = [this](int64_t step) {
      if (before_manifest_) before_manifest_(step);
    };
    return options;
  }

  // Every test's manager keeps its records in a state file of its own.
  static std::unique_ptr<StateFile> OpenStateFile() {
    const std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) /
        absl::StrCat(
            "job_manager_state_", getpid(), "_",
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove(path);
    std::filesystem::remove(path.string() + ".journal");
    absl::StatusOr<std::unique_ptr<StateFile>> file =
        StateFile::Open(path.string());
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }

  // Registers a worker with `devices`; returns its id.
  std::string AddWorker(const std::string& name,
                        const std::vector<std::string>& devices = {"cpu:1"}) {
    auto conn = std::make_shared<FakeConnection>();
    v1::RegisterRequest r;
    r.set_protocol_version(proto::kProtocolVersion);
    r.set_version(kVersion);
    r.set_name(name);
    for (const std::string& d : devices) r.add_devices(d);
    r.set_data_address("127.0.0.1:0");
    absl::StatusOr<v1::Registered> reg = manager_.RegisterWorker(r, conn);
    EXPECT_TRUE(reg.ok()) << reg.status();
    connections_[reg->worker_id()] = conn;
    return reg->worker_id();
  }

  absl::StatusOr<v1::Job> Submit(const std::string& yaml) {
    v1::SubmitJobRequest req;
    req.set_yaml(yaml);
    req.set_file_name("job.yaml");
    return manager_.SubmitJob(req);
  }

  void Send(const std::string& worker, const v1::WorkerMessage& m) {
    absl::Status s = manager_.HandleWorkerMessage(worker, m);
    EXPECT_TRUE(s.ok()) << s;
  }
  void Ready(const std::string& worker, const std::string& job, int port) {
    v1::WorkerMessage m;
    m.mutable_ready()->set_job_id(job);
    m.mutable_ready()->set_data_endpoint(absl::StrCat("127.0.0.1:", port));
    Send(worker, m);
  }
  void Step(const std::string& worker, const std::string& job, int64_t step,
            bool has_loss) {
    v1::WorkerMessage m;
    v1::StepReport* s = m.mutable_step();
    s->set_job_id(job);
    s->set_step(step);
    s->set_seconds(0.5);
    s->set_wait_seconds(0.1);
    s->set_has_loss(has_loss);
    s->set_loss(has_loss ? 1.25 : 0);
    Send(worker, m);
  }
  void Ended(const std::string& worker, const std::string& job,
             v1::JobState state, const std::string& message = "",
             absl::StatusCode code = absl::StatusCode::kUnknown) {
    v1::WorkerMessage m;
    m.mutable_ended()->set_job_id(job);
    m.mutable_ended()->set_state(state);
    m.mutable_ended()->set_message(message);
    if (state == v1::FAILED)
      m.mutable_ended()->set_code(static_cast<int>(code));
    Send(worker, m);
  }
  v1::JobState State(const std::string& job) {
    return manager_.GetJob(job)->state();
  }
  v1::WorkerState WorkerState(const std::string& id) {
    for (const v1::Worker& w : manager_.ListWorkers()) {
      if (w.id() == id) return w.state();
    }
    return v1::WORKER_STATE_UNSPECIFIED;
  }
  FakeConnection& Conn(const std::string& id) { return *connections_.at(id); }

  // Runs a 2-stage job on w1, w2 up to RUNNING.
  std::string StartTwoStageJob(const std::string& w1, const std::string& w2) {
    absl::StatusOr<v1::Job> job = Submit(JobYaml(2));
    EXPECT_TRUE(job.ok()) << job.status();
    Ready(w1, job->id(), 5001);
    Ready(w2, job->id(), 5002);
    EXPECT_EQ(State(job->id()), v1::RUNNING);
    return job->id();
  }

  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);
  // Called before each manifest write (JobManagerOptions'
  // TEST_before_manifest), on the writing thread.
  std::function<void(int64_t step)> before_manifest_;
  RecordingObserver observer_;
  std::unique_ptr<StateFile> state_file_;
  JobManager manager_;
  std::map<std::string, std::shared_ptr<FakeConnection>> connections_;
};

// What the watch hub asks each pass: only the jobs with news since the
// count it saw; after Shutdown, any job (nullopt).
TEST_F(JobManagerTest, JobsWithEventsSinceNamesOnlyTheJobsWithNews) {
  AddWorker("a");
  AddWorker("b");
  absl::StatusOr<v1::Job> a = Submit(JobYaml(2));
  absl::StatusOr<v1::Job> b = Submit(JobYaml(2));
  ASSERT_TRUE(a.ok() && b.ok());
  uint64_t seen = 0;
  std::optional<std::vector<std::string>> news =
      manager_.JobsWithEventsSince(0, &seen);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(*news, (std::vector<std::string>{a->id(), b->id()}));
  EXPECT_GT(seen, 0u);

  ASSERT_TRUE(manager_.CancelJob(b->id(), "stop").ok());
  uint64_t after_cancel = 0;
  news = manager_.JobsWithEventsSince(seen, &after_cancel);
  ASSERT_TRUE(news.has_value());
  EXPECT_EQ(*news, (std::vector<std::string>{b->id()}));
  EXPECT_GT(after_cancel, seen);

  uint64_t again = 0;
  news = manager_.JobsWithEventsSince(after_cancel, &again);
  ASSERT_TRUE(news.has_value());
  EXPECT_TRUE(news->empty());
  EXPECT_EQ(again, after_cancel);
  // A count it never gave is not trusted.
  EXPECT_FALSE(manager_.JobsWithEventsSince(again + 5, &again).has_value());

  manager_.Shutdown();
  EXPECT_FALSE(manager_.JobsWithEventsSince(again, &again).has_value());
}

TEST_F(JobManagerTest, RegisterRefusesVersionSkewNamingBothVersions) {
  v1::RegisterRequest r;
  r.set_protocol_version(proto::kProtocolVersion);
  r.set_version("0.0.1");
  r.set_name("old");
  r.add_devices("cpu:1");
  absl::Status s =
      manager_.RegisterWorker(r, std::make_shared<FakeConnection>()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("runs Conveyor 0.0.1"));
  EXPECT_THAT(s.message(), HasSubstr("coordinator runs 9.9.9"));
  r.set_version(kVersion);
  r.set_protocol_version(proto::kProtocolVersion + 1);
  EXPECT_EQ(manager_.RegisterWorker(r, std::make_shared<FakeConnection>())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(manager_.ListWorkers().empty());
}

TEST_F(JobManagerTest, RegisterRepliesFirstWithTheHeartbeatInterval) {
  const std::string w = AddWorker("a");
  EXPECT_EQ(w, "worker-1");
  ASSERT_EQ(Conn(w).sent.size(), 1u);
  EXPECT_EQ(Conn(w).sent[0].registered().worker_id(), "worker-1");
  EXPECT_EQ(Conn(w).sent[0].registered().heartbeat_interval_ms(), 750);
}

TEST_F(JobManagerTest, BadJobIsRejectedWithItsPositionAndNothingIsSent) {
  const std::string w = AddWorker("a");
  absl::Status s = Submit("model: {input_shape: [4], layer: []}\n").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job.yaml:1:"));
  EXPECT_EQ(Conn(w).sent.size(), 1u);  // Only the registration reply.
  EXPECT_TRUE(manager_.ListJobs().empty());
}

TEST_F(JobManagerTest, JobNeedingMoreWorkersThanExistIsRejected) {
  const std::string w = AddWorker("a");
  absl::Status s = Submit(JobYaml(2)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("needs 2 workers"));
  EXPECT_THAT(s.message(), HasSubstr("has 1 live worker"));
  EXPECT_EQ(Conn(w).sent.size(), 1u);
}

// pipeline.devices_per_stage: stages go only to workers with that many
// devices; too few such workers is refused at submission like too few
// workers, naming the setting.
TEST_F(JobManagerTest, StagesGoOnlyToWorkersWithDevicesPerStageDevices) {
  std::string yaml = JobYaml(2);
  yaml = absl::StrReplaceAll(
      yaml, {{"pipeline: {schedule: 1f1b}",
              "pipeline: {schedule: 1f1b, devices_per_stage: 2}"}});
  const std::string small1 = AddWorker("small1");
  const std::string mesh1 = AddWorker("mesh1", {"cuda:0", "cuda:1"});
  absl::Status s = Submit(yaml).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(),
              HasSubstr("needs 2 workers with at least 2 devices each "
                        "(pipeline.devices_per_stage at job.yaml:"));
  EXPECT_THAT(s.message(), HasSubstr("has 1 live worker(s) with that many"));

  const std::string small2 = AddWorker("small2");
  const std::string mesh2 = AddWorker("mesh2", {"cpu:1", "cpu:1", "cpu:1"});
  absl::StatusOr<v1::Job> job = Submit(yaml);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(State(job->id()), v1::PLANNING);
  EXPECT_THAT(manager_.GetJob(job->id())->worker_ids(),
              ::testing::UnorderedElementsAre(mesh1, mesh2));
  EXPECT_EQ(WorkerState(small1), v1::IDLE);
  EXPECT_EQ(WorkerState(small2), v1::IDLE);
  // A job of single-device stages still runs on the others meanwhile.
  absl::StatusOr<v1::Job> plain = Submit(JobYaml(2, "plain"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(manager_.GetJob(plain->id())->worker_ids(),
              ::testing::UnorderedElementsAre(small1, small2));
}

// The coordinator decides the data plane from the JobReady reports, so all
// ranks agree: NCCL when each rank has a GPU of its own with NCCL.
TEST_F(JobManagerTest, StartJobSaysNcclOnlyWhenEveryRankCanUseIt) {
  const std::string w1 = AddWorker("a", {"cuda:0"});
  const std::string w2 = AddWorker("b", {"cuda:1"});
  auto ready = [&](const std::string& w, const std::string& job, int port,
                   const std::string& uuid) {
    v1::WorkerMessage m;
    m.mutable_ready()->set_job_id(job);
    m.mutable_ready()->set_data_endpoint(absl::StrCat("127.0.0.1:", port));
    m.mutable_ready()->set_device_uuid(uuid);
    m.mutable_ready()->set_nccl(true);
    Send(w, m);
  };
  absl::StatusOr<v1::Job> job = Submit(JobYaml(2));
  ASSERT_TRUE(job.ok()) << job.status();
  ready(w2, job->id(), 5002, "GPU-b");
  ready(w1, job->id(), 5001, "GPU-a");
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  EXPECT_EQ(manager_.GetJob(job->id())->data_plane(), "nccl");
  for (const std::string& w : {w1, w2}) {
    auto start = Conn(w).Of(v1::CoordinatorMessage::kStart);
    ASSERT_EQ(start.size(), 1u);
    EXPECT_TRUE(start[0].start().nccl());
  }
  Ended(w1, job->id(), v1::SUCCEEDED);
  Ended(w2, job->id(), v1::SUCCEEDED);

  // Both ranks on one GPU: TCP, and every rank hears so.
  absl::StatusOr<v1::Job> shared = Submit(JobYaml(2, "shared"));
  ASSERT_TRUE(shared.ok()) << shared.status();
  ready(w1, shared->id(), 5001, "GPU-a");
  ready(w2, shared->id(), 5002, "GPU-a");
  ASSERT_EQ(State(shared->id()), v1::RUNNING);
  EXPECT_EQ(manager_.GetJob(shared->id())->data_plane(),
            "tcp (ranks 0 and 1 share GPU GPU-a)");
  for (const std::string& w : {w1, w2}) {
    auto start = Conn(w).Of(v1::CoordinatorMessage::kStart);
    ASSERT_EQ(start.size(), 2u);
    EXPECT_FALSE(start[1].start().nccl());
  }
}

TEST_F(JobManagerTest, RunsAJobThroughEveryStateWithOneEventPerStep) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = Submit(JobYaml(2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(State(job->id()), v1::PLANNING);
  // Each worker gets its program: rank, its stage and names, its actions.
  auto p1 = Conn(w1).Of(v1::CoordinatorMessage::kPrepare);
  auto p2 = Conn(w2).Of(v1::CoordinatorMessage::kPrepare);
  ASSERT_EQ(p1.size(), 1u);
  ASSERT_EQ(p2.size(), 1u);
  const v1::JobProgram& prog = p2[0].prepare().program();
  EXPECT_EQ(prog.rank(), 1);
  EXPECT_EQ(prog.num_ranks(), 2);
  ASSERT_EQ(prog.stages_size(), 1);
  EXPECT_EQ(prog.stages(0).stage(), 1);
  EXPECT_EQ(prog.stages(0).parameter_names(0), "layers.1.weight");
  EXPECT_EQ(prog.actions_size(), 8);  // F and B of 4 microbatches.
  EXPECT_EQ(prog.steps(), 3);
  EXPECT_EQ(prog.secret(), p1[0].prepare().program().secret());
  EXPECT_FALSE(prog.secret().empty());
  EXPECT_EQ(WorkerState(w1), v1::BUSY);

  Ready(w1, job->id(), 5001);
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kStart).empty());
  Ready(w2, job->id(), 5002);
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  auto start = Conn(w1).Of(v1::CoordinatorMessage::kStart);
  ASSERT_EQ(start.size(), 1u);
  EXPECT_THAT(start[0].start().peers(),
              ::testing::ElementsAre("127.0.0.1:5001", "127.0.0.1:5002"));

  int64_t cursor = 0;
  bool done = false;
  auto events = manager_.WaitEvents(job->id(), &cursor, Clock::now(), &done);
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(events->size(), 3u);  // QUEUED, PLANNING, RUNNING.
  EXPECT_FALSE(done);

  Step(w1, job->id(), 1, false);
  EXPECT_EQ(manager_.GetJob(job->id())->steps_done(), 0);
  Step(w2, job->id(), 1, true);
  EXPECT_EQ(manager_.GetJob(job->id())->steps_done(), 1);
  events = manager_.WaitEvents(job->id(), &cursor, Clock::now(), &done);
  ASSERT_EQ(events->size(), 1u);
  const v1::StepSummary& s = (*events)[0].step();
  EXPECT_EQ(s.step(), 1);
  EXPECT_TRUE(s.has_loss());
  EXPECT_DOUBLE_EQ(s.loss(), 1.25);
  EXPECT_DOUBLE_EQ(s.samples_per_second(), 16.0);
  // The reports carry no timeline: the receive wait only.
  EXPECT_DOUBLE_EQ(s.receive_wait_fraction(), 0.2);
  EXPECT_EQ(s.ranks_size(), 2);

  Ended(w1, job->id(), v1::SUCCEEDED);
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  EXPECT_EQ(WorkerState(w1), v1::IDLE);
  Ended(w2, job->id(), v1::SUCCEEDED);
  EXPECT_EQ(State(job->id()), v1::SUCCEEDED);
  events = manager_.WaitEvents(job->id(), &cursor, Clock::now(), &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(events->back().job().state(), v1::SUCCEEDED);
  // Success sends no cancel.
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
}

TEST_F(JobManagerTest, JobsQueueFifoAndStartWhenWorkersFreeUp) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string first = StartTwoStageJob(w1, w2);
  absl::StatusOr<v1::Job> second = Submit(JobYaml(2, "second"));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->state(), v1::QUEUED);
  EXPECT_EQ(second->queue_position(), 1);
  absl::StatusOr<v1::Job> third = Submit(JobYaml(1, "third"));
  // Strict FIFO: the 1-stage job waits behind the 2-stage one.
  EXPECT_EQ(third->queue_position(), 2);
  Ended(w1, first, v1::SUCCEEDED);
  EXPECT_EQ(State(second->id()), v1::QUEUED);  // Needs both workers.
  EXPECT_EQ(State(third->id()), v1::QUEUED);
  Ended(w2, first, v1::SUCCEEDED);
  EXPECT_EQ(State(second->id()), v1::PLANNING);
  EXPECT_EQ(manager_.GetJob(third->id())->queue_position(), 1);
}

TEST_F(JobManagerTest, CancelStopsTheWorkersAndFreesThemWhenTheyEnd) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  absl::StatusOr<v1::Job> next = Submit(JobYaml(2, "next"));
  absl::StatusOr<v1::Job> c = manager_.CancelJob(job, "cancelled by user");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), v1::CANCELLED);
  EXPECT_EQ(c->message(), "cancelled by user");
  ASSERT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kCancel).size(), 1u);
  ASSERT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kCancel).size(), 1u);
  // Until the workers confirm, they are busy and the next job waits.
  EXPECT_EQ(State(next->id()), v1::QUEUED);
  Ended(w1, job, v1::CANCELLED, "cancelled by user");
  // A worker that reports idle by heartbeat is freed too.
  v1::WorkerMessage hb;
  hb.mutable_heartbeat();
  Send(w2, hb);
  EXPECT_EQ(State(job), v1::CANCELLED);
  EXPECT_EQ(State(next->id()), v1::PLANNING);
  // Cancelling again is harmless; an unknown job is NOT_FOUND.
  EXPECT_EQ(manager_.CancelJob(job, "x")->state(), v1::CANCELLED);
  EXPECT_EQ(manager_.CancelJob("job-99", "x").status().code(),
            absl::StatusCode::kNotFound);
}

// The data plane's bound endpoint, once the worker reports ready, for
// `workers` (which showed the requested 127.0.0.1:0); gone when it is free.
TEST_F(JobManagerTest, WorkersShowTheirJobsBoundDataEndpoint) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  auto endpoint = [&](const std::string& id) {
    for (const v1::Worker& w : manager_.ListWorkers()) {
      if (w.id() == id) return w.data_endpoint();
    }
    return std::string("?");
  };
  EXPECT_EQ(endpoint(w1), "127.0.0.1:5001");
  EXPECT_EQ(endpoint(w2), "127.0.0.1:5002");
  ASSERT_TRUE(manager_.CancelJob(job, "stop").ok());
  Ended(w1, job, v1::CANCELLED);
  EXPECT_EQ(endpoint(w1), "");
}

TEST_F(JobManagerTest, SilentWorkerIsLostAndItsJobFailsNamingIt) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  now_ += std::chrono::seconds(2);
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_job_id(job);
  Send(w1, hb);
  manager_.Tick();
  EXPECT_EQ(State(job), v1::RUNNING);
  now_ += std::chrono::seconds(2);  // w2 silent for 4 s > 3 s.
  manager_.Tick();
  absl::StatusOr<v1::Job> j = manager_.GetJob(job);
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(), HasSubstr("worker-2 (b, rank 1, stages 1) lost"));
  EXPECT_THAT(j->message(), HasSubstr("no heartbeat for 4.0 s"));
  EXPECT_EQ(WorkerState(w2), v1::LOST);
  EXPECT_TRUE(Conn(w2).closed);
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kCancel).size(), 1u);
  // A lost worker's later messages are refused: it must register again.
  EXPECT_EQ(manager_.HandleWorkerMessage(w2, hb).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A read-only checkpoint.dir once failed a job after 2 of 3 steps, losing
// them: the coordinator writes there at submission, and refuses the job.
TEST_F(JobManagerTest, AJobWhoseCheckpointsCannotBeWrittenIsRefused) {
  AddWorker("a");
  AddWorker("b");
  // A directory not even root can create files in, as a read-only mount.
  const std::string dir = "/proc";
  absl::StatusOr<v1::Job> job =
      Submit(absl::StrCat(JobYaml(2), "checkpoint: {dir: ", dir, "}\n"));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job.status().message(),
              HasSubstr("checkpoint.dir " + dir + " cannot be written"));
  EXPECT_TRUE(manager_.ListJobs().empty());
}

// Two live workers of one name could not be told apart, and a name with
// control characters was printed raw into listings and logs.
TEST_F(JobManagerTest, WorkerNamesAreUniqueAmongLiveWorkersAndPrintable) {
  const std::string a = AddWorker("a");
  auto conn = std::make_shared<FakeConnection>();
  v1::RegisterRequest r;
  r.set_protocol_version(proto::kProtocolVersion);
  r.set_version(kVersion);
  r.set_name("a");
  r.add_devices("cpu:1");
  absl::StatusOr<v1::Registered> twin = manager_.RegisterWorker(r, conn);
  EXPECT_EQ(twin.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(
      twin.status().message(),
      HasSubstr("worker name 'a' is taken by " + a + ", which is live"));
  // Once the first is lost its name is free: a restarted worker takes it.
  manager_.WorkerDisconnected(a, "control connection closed");
  EXPECT_TRUE(manager_.RegisterWorker(r, conn).ok());
  r.set_name("evil\x1b[2Jname");
  absl::StatusOr<v1::Registered> control = manager_.RegisterWorker(r, conn);
  EXPECT_EQ(control.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(control.status().message(),
              HasSubstr("without control characters; got evil\\x1b[2Jname"));
  r.set_name(std::string(300, 'n'));
  EXPECT_EQ(manager_.RegisterWorker(r, conn).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// SIGSTOP of the coordinator for 15 s once failed every job with "no
// heartbeat for 15.1 s" on healthy workers: a stall of the coordinator is
// not a loss of workers. After it the workers get a full timeout again.
TEST_F(JobManagerTest, AStalledCoordinatorDoesNotBlameItsWorkers) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  manager_.Tick();
  now_ += std::chrono::seconds(15);  // No Tick ran: the coordinator stalled.
  manager_.Tick();
  EXPECT_EQ(State(job), v1::RUNNING);
  EXPECT_EQ(WorkerState(w1), v1::BUSY);
  EXPECT_EQ(WorkerState(w2), v1::BUSY);
  // Ticking on, a worker that stays silent is lost after the timeout (3 s
  // here), counted from the end of the stall.
  for (int i = 0; i < 20; ++i) {
    now_ += std::chrono::milliseconds(100);
    manager_.Tick();
  }
  EXPECT_EQ(State(job), v1::RUNNING);
  for (int i = 0; i < 12; ++i) {
    now_ += std::chrono::milliseconds(100);
    manager_.Tick();
  }
  EXPECT_EQ(State(job), v1::FAILED);
  EXPECT_THAT(manager_.GetJob(job)->message(), HasSubstr("no heartbeat for"));
}

// On a full disk the coordinator once acknowledged 518 submissions it could
// not record, and after a restart reissued their ids. A submission or a
// cancel is acknowledged only once the state file holds it.
TEST_F(JobManagerTest,
       AStateFileThatCannotBeWrittenRefusesSubmissionsAndCancels) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::filesystem::path path = state_file_->path();
  auto break_writes = [&] {  // The rename onto a directory fails.
    std::filesystem::remove(path);
    std::filesystem::create_directory(path);
  };
  break_writes();
  absl::StatusOr<v1::Job> refused = Submit(JobYaml(2));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the job was not accepted: the coordinator cannot "
                        "write its state file"));
  // Withdrawn before it was placed: no trace, no worker taken.
  EXPECT_TRUE(manager_.ListJobs().empty());
  EXPECT_EQ(WorkerState(w1), v1::IDLE);
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kPrepare).empty());
  EXPECT_THAT(manager_.StateFileError(), HasSubstr(path.string()));

  // Room again: the next write clears the warning; ids are never reused.
  std::filesystem::remove(path);
  manager_.Tick();
  EXPECT_EQ(manager_.StateFileError(), "");
  absl::StatusOr<v1::Job> accepted = Submit(JobYaml(2));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->id(), "job-2");
  EXPECT_EQ(State(accepted->id()), v1::PLANNING);

  break_writes();
  absl::StatusOr<v1::Job> cancel = manager_.CancelJob(accepted->id(), "stop");
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(cancel.status().message(),
              HasSubstr("job-2 was not cancelled: the coordinator could not "
                        "make the change durable"));
  // Not applied either (it once was, while the caller was told it failed):
  // memory, disk and the answer agree.
  EXPECT_EQ(State(accepted->id()), v1::PLANNING);
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
  std::filesystem::remove(path);
  cancel = manager_.CancelJob(accepted->id(), "stop");  // The retry.
  ASSERT_TRUE(cancel.ok()) << cancel.status();
  EXPECT_EQ(cancel->state(), v1::CANCELLED);
}

TEST_F(JobManagerTest, ANeighboursFailureReportDefersToTheLostWorker) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  // w1's data plane sees its peer vanish before the coordinator does.
  Ended(w1, job, v1::FAILED, "peer rank 1 closed the connection");
  EXPECT_EQ(State(job), v1::RUNNING);  // Within the grace.
  manager_.WorkerDisconnected(w2, "its control connection closed");
  absl::StatusOr<v1::Job> j = manager_.GetJob(job);
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(), HasSubstr("worker-2 (b, rank 1, stages 1) lost"));
}

TEST_F(JobManagerTest, AWorkerFailureFailsTheJobAfterTheGrace) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  Ended(w2, job, v1::FAILED, "rank 1 (stages 1): out of memory");
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kCancel).size(), 1u);
  now_ += std::chrono::milliseconds(600);
  manager_.Tick();
  absl::StatusOr<v1::Job> j = manager_.GetJob(job);
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(),
              HasSubstr("worker-2 (b): rank 1 (stages 1): out of memory"));
  EXPECT_THAT(j->message(), HasSubstr("out of memory"));
  EXPECT_EQ(WorkerState(w2), v1::IDLE);
}

TEST_F(JobManagerTest, WorkersThatNeverGetReadyFailThePlanning) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = Submit(JobYaml(2));
  Ready(w1, job->id(), 5001);
  now_ += std::chrono::seconds(121);
  // Keep both alive so only the prepare timeout applies.
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_job_id(job->id());
  Send(w1, hb);
  Send(w2, hb);
  manager_.Tick();
  absl::StatusOr<v1::Job> j = manager_.GetJob(job->id());
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(), HasSubstr("worker-2 did not report ready"));
}

// A 4-layer MLP without markers, cut into 2 stages by the profile.
std::string AutoJobYaml(const std::string& extra = "") {
  return absl::StrReplaceAll(
      JobYaml(1, "auto"),
      {{"    - dense: {features: 4}\n",
        "    - dense: {features: 4}\n    - relu\n    - dense: {features: "
        "4}\n    - relu\n"},
       {"pipeline: {schedule: 1f1b}",
        absl::StrCat("pipeline: {schedule: 1f1b, stages: auto, num_stages: 2",
                     extra, "}")}});
}

// A profile where the first layer costs as much as the other three.
v1::WorkerMessage ProfileAnswer(const std::string& job, int layers = 4) {
  v1::WorkerMessage m;
  v1::ModelProfile* p = m.mutable_profile();
  p->set_job_id(job);
  p->set_device("cpu:1");
  for (int i = 0; i < layers; ++i) {
    v1::LayerCost* c = p->add_layers();
    const double t = i == 0 ? 3e-3 : 1e-3;
    c->set_forward_seconds(t);
    c->set_backward_input_seconds(t);
    c->set_backward_weight_seconds(t);
    c->set_activation_bytes(128);
    c->set_parameter_bytes(80);
  }
  return m;
}

TEST_F(JobManagerTest, AutoStagesProfileOnTheFirstWorkerThenCutAndPrepare) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = Submit(AutoJobYaml());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->has_auto_split());
  EXPECT_FALSE(job->auto_split().chosen());
  EXPECT_EQ(State(job->id()), v1::PLANNING);
  // Only the first worker hears of the job, and only to profile it.
  ASSERT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kProfile).size(), 1u);
  const v1::ProfileModel request =
      Conn(w1).Of(v1::CoordinatorMessage::kProfile)[0].profile();
  EXPECT_EQ(request.job_id(), job->id());
  EXPECT_EQ(request.repetitions(), 3);
  EXPECT_THAT(request.yaml(), HasSubstr("stages: auto"));
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kPrepare).empty());
  EXPECT_TRUE(Conn(w2).sent.size() == 1);  // Registered only.

  Send(w1, ProfileAnswer(job->id()));
  // Layer 0 (3 units) alone, layers 1-3 (1 unit each) together.
  for (const std::string& w : {w1, w2}) {
    ASSERT_EQ(Conn(w).Of(v1::CoordinatorMessage::kPrepare).size(), 1u) << w;
    const v1::JobProgram program =
        Conn(w).Of(v1::CoordinatorMessage::kPrepare)[0].prepare().program();
    EXPECT_THAT(program.stage_begin(), ElementsAre(0, 1));
  }
  const v1::JobProgram second =
      Conn(w2).Of(v1::CoordinatorMessage::kPrepare)[0].prepare().program();
  ASSERT_EQ(second.stages_size(), 1);
  EXPECT_EQ(second.stages(0).first_layer(), 1);
  EXPECT_EQ(second.stages(0).num_layers(), 3);
  const v1::Job planned = *manager_.GetJob(job->id());
  EXPECT_TRUE(planned.auto_split().chosen());
  EXPECT_FALSE(planned.auto_split().from_cache());
  EXPECT_EQ(planned.auto_split().profiled_on(), "cpu:1");
  EXPECT_GT(planned.auto_split().predicted_step_seconds(), 0);
  EXPECT_LT(planned.auto_split().predicted_step_seconds(),
            planned.auto_split().predicted_even_step_seconds());
  EXPECT_EQ(planned.stages(1).first_layer(), 1);
  EXPECT_EQ(planned.stages(1).num_params(), 4 * 4 + 4);
  Ready(w1, job->id(), 5001);
  Ready(w2, job->id(), 5002);
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  Ended(w1, job->id(), v1::SUCCEEDED);
  Ended(w2, job->id(), v1::SUCCEEDED);

  // The same model on the same device: the cached profile, no request.
  absl::StatusOr<v1::Job> again = Submit(AutoJobYaml());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kProfile).size(), 1u);
  EXPECT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kPrepare).size(), 2u);
  const v1::Job cached = *manager_.GetJob(again->id());
  EXPECT_TRUE(cached.auto_split().from_cache());
  EXPECT_EQ(cached.stages(1).first_layer(), 1);
}

TEST_F(JobManagerTest, CancellingWhileProfilingFreesTheOtherWorkersAtOnce) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = Submit(AutoJobYaml());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(manager_.CancelJob(job->id(), "changed my mind").ok());
  EXPECT_EQ(State(job->id()), v1::CANCELLED);
  // w2 never heard of the job; w1 is told and stays busy until it answers.
  EXPECT_EQ(WorkerState(w2), v1::IDLE);
  EXPECT_TRUE(Conn(w2).Of(v1::CoordinatorMessage::kCancel).empty());
  ASSERT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kCancel).size(), 1u);
  EXPECT_EQ(WorkerState(w1), v1::BUSY);
  // A profile that crossed the cancel is ignored; the worker's JobEnded
  // frees it.
  Send(w1, ProfileAnswer(job->id()));
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kPrepare).empty());
  Ended(w1, job->id(), v1::CANCELLED, "changed my mind");
  EXPECT_EQ(WorkerState(w1), v1::IDLE);
}

TEST_F(JobManagerTest, ABadProfileOrAnImpossibleBudgetFailsTheJob) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> short_profile = Submit(AutoJobYaml());
  ASSERT_TRUE(short_profile.ok());
  Send(w1, ProfileAnswer(short_profile->id(), 3));
  absl::StatusOr<v1::Job> j = manager_.GetJob(short_profile->id());
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(), HasSubstr("the layer profile has 3 entries; the "
                                      "model has 4 layers"));
  EXPECT_EQ(WorkerState(w2), v1::IDLE);
  Ended(w1, short_profile->id(), v1::CANCELLED);

  absl::StatusOr<v1::Job> negative = Submit(AutoJobYaml(", memory_budget: 2"));
  ASSERT_TRUE(negative.ok());
  v1::WorkerMessage bad = ProfileAnswer(negative->id());
  bad.mutable_profile()->mutable_layers(2)->set_forward_seconds(-1);
  Send(w1, bad);
  EXPECT_THAT(
      manager_.GetJob(negative->id())->message(),
      HasSubstr("worker-1 (a, rank 0, stages 0) reported a malformed layer "
                "profile"));
  Ended(w1, negative->id(), v1::CANCELLED);

  absl::StatusOr<v1::Job> tight = Submit(AutoJobYaml(", memory_budget: 2"));
  ASSERT_TRUE(tight.ok());
  Send(w1, ProfileAnswer(tight->id()));
  absl::StatusOr<v1::Job> t = manager_.GetJob(tight->id());
  EXPECT_EQ(t->state(), v1::FAILED);
  EXPECT_THAT(t->message(), HasSubstr("choosing the stages failed"));
  EXPECT_THAT(t->message(), HasSubstr("memory_budget"));
}

TEST_F(JobManagerTest, AWorkerThatNeverProfilesFailsThePlanningNamingIt) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> job = Submit(AutoJobYaml());
  ASSERT_TRUE(job.ok());
  now_ += std::chrono::seconds(121);
  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_job_id(job->id());
  Send(w1, hb);
  Send(w2, hb);
  manager_.Tick();
  absl::StatusOr<v1::Job> j = manager_.GetJob(job->id());
  EXPECT_EQ(j->state(), v1::FAILED);
  EXPECT_THAT(j->message(),
              HasSubstr("worker-1 did not report its layer profile"));
  EXPECT_EQ(WorkerState(w2), v1::IDLE);
}

TEST_F(JobManagerTest, UnknownJobsAreNotFound) {
  EXPECT_EQ(manager_.GetJob("job-1").status().code(),
            absl::StatusCode::kNotFound);
  int64_t cursor = 0;
  bool done = false;
  EXPECT_EQ(
      manager_.WaitEvents("nope", &cursor, Clock::now(), &done).status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace conveyor::coordinator

namespace conveyor::coordinator {
namespace {

TEST_F(JobManagerTest, KeepsTheNewestStepTimelinesForGetTrace) {
  const std::string w1 = AddWorker("alpha");
  const std::string w2 = AddWorker("beta");
  absl::StatusOr<v1::Job> submitted = Submit(JobYaml(2, "mlp", /*steps=*/30));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->id();
  Ready(w1, job, 5001);
  Ready(w2, job, 5002);
  // Workers learn their peers' names for their metrics' labels.
  const auto starts = Conn(w1).Of(v1::CoordinatorMessage::kStart);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_THAT(starts[0].start().peer_names(),
              ::testing::ElementsAre("alpha", "beta"));

  absl::Status none = manager_.GetTrace(job, 0).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.message(), HasSubstr("no complete step yet"));

  auto report = [&](const std::string& w, int64_t step, int stage) {
    v1::WorkerMessage m;
    v1::StepReport* r = m.mutable_step();
    r->set_job_id(job);
    r->set_step(step);
    r->set_seconds(0.5);
    r->set_start_unix_us(1000 * step + stage);
    v1::Span* span = r->add_spans();
    span->set_kind(v1::Span::FORWARD);
    span->set_stage(stage);
    span->set_duration_us(step);
    Send(w, m);
  };
  report(w1, 1, 0);
  // Half a step is not a timeline yet.
  EXPECT_EQ(manager_.GetTrace(job, 1).status().code(),
            absl::StatusCode::kNotFound);
  report(w2, 1, 1);
  for (int64_t step = 2; step <= 20; ++step) {
    report(w2, step, 1);  // Any order within a step.
    report(w1, step, 0);
  }
  absl::StatusOr<v1::Trace> newest = manager_.GetTrace(job, 0);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step(), 20);
  EXPECT_EQ(newest->num_ranks(), 2);
  EXPECT_EQ(newest->schedule(), "1f1b");
  EXPECT_EQ(newest->microbatches(), 4);
  ASSERT_EQ(newest->ranks_size(), 2);
  for (int r = 0; r < 2; ++r) {
    const v1::RankTrace& rank = newest->ranks(r);
    EXPECT_EQ(rank.rank(), r);
    EXPECT_EQ(rank.worker_id(), r == 0 ? w1 : w2);
    EXPECT_EQ(rank.worker_name(), r == 0 ? "alpha" : "beta");
    EXPECT_THAT(rank.stages(), ::testing::ElementsAre(r));
    EXPECT_EQ(rank.start_unix_us(), 20000 + r);
    ASSERT_EQ(rank.spans_size(), 1);
    EXPECT_EQ(rank.spans(0).stage(), r);
    EXPECT_EQ(rank.spans(0).duration_us(), 20);
  }
  // The default keeps 16 steps: 5 to 20.
  ASSERT_EQ(newest->available_steps_size(), 16);
  EXPECT_EQ(newest->available_steps(0), 5);
  EXPECT_EQ(newest->available_steps(15), 20);
  absl::StatusOr<v1::Trace> fifth = manager_.GetTrace(job, 5);
  ASSERT_TRUE(fifth.ok()) << fifth.status();
  EXPECT_EQ(fifth->ranks(1).spans(0).duration_us(), 5);
  absl::Status gone = manager_.GetTrace(job, 4).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr("kept for steps 5 to 20"));
  EXPECT_EQ(manager_.GetTrace("job-99", 0).status().code(),
            absl::StatusCode::kNotFound);

  // Still there once the job has ended, for a look afterwards.
  ASSERT_TRUE(manager_.CancelJob(job, "stop").ok());
  EXPECT_EQ(State(job), v1::CANCELLED);
  EXPECT_TRUE(manager_.GetTrace(job, 20).ok());
}

// Registers a worker named `name` on a standalone `manager` through
// `connection`; returns its id.
std::string RegisterOn(JobManager& manager, const std::string& name,
                       std::shared_ptr<FakeConnection> connection =
                           std::make_shared<FakeConnection>()) {
  v1::RegisterRequest r;
  r.set_protocol_version(proto::kProtocolVersion);
  r.set_version(kVersion);
  r.set_name(name);
  r.add_devices("cpu:1");
  absl::StatusOr<v1::Registered> reg =
      manager.RegisterWorker(r, std::move(connection));
  EXPECT_TRUE(reg.ok()) << reg.status();
  return reg.ok() ? reg->worker_id() : "";
}

TEST(JobManagerProfileCacheTest, KeepsOnlyTheNewestProfiles) {
  JobManager manager({.max_cached_profiles = 1, .version = kVersion});
  std::vector<std::string> workers;
  std::vector<std::shared_ptr<FakeConnection>> connections;
  for (const char* name : {"a", "b"}) {
    connections.push_back(std::make_shared<FakeConnection>());
    workers.push_back(RegisterOn(manager, name, connections.back()));
  }
  // Runs a job of `yaml` through profiling (when asked) and to its end;
  // returns whether its first worker was asked to profile.
  auto run = [&](const std::string& yaml) {
    const size_t asked_before =
        connections[0]->Of(v1::CoordinatorMessage::kProfile).size();
    v1::SubmitJobRequest request;
    request.set_yaml(yaml);
    request.set_file_name("job.yaml");
    absl::StatusOr<v1::Job> job = manager.SubmitJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    const bool asked =
        connections[0]->Of(v1::CoordinatorMessage::kProfile).size() >
        asked_before;
    if (asked) {
      EXPECT_TRUE(
          manager.HandleWorkerMessage(workers[0], ProfileAnswer(job->id()))
              .ok());
    }
    EXPECT_EQ(manager.GetJob(job->id())->state(), v1::PLANNING);
    EXPECT_TRUE(manager.GetJob(job->id())->auto_split().chosen());
    for (const std::string& w : workers) {
      v1::WorkerMessage m;
      m.mutable_ended()->set_job_id(job->id());
      m.mutable_ended()->set_state(v1::CANCELLED);
      EXPECT_TRUE(manager.HandleWorkerMessage(w, m).ok());
    }
    return asked;
  };
  const std::string a = AutoJobYaml();
  const std::string b =
      absl::StrReplaceAll(a, {{"dense: {features: 4}\n    - relu\n    - "
                               "dense: {features: 4}",
                               "dense: {features: 8}\n    - relu\n    - "
                               "dense: {features: 4}"}});
  ASSERT_NE(a, b);
  EXPECT_TRUE(run(a));
  EXPECT_FALSE(run(a));  // cached
  EXPECT_TRUE(run(b));   // another model; a's profile is dropped
  EXPECT_TRUE(run(a));
}

// A coordinator that runs for months must not grow with its history: an
// ended job keeps only its newest events, and only the newest ended jobs
// are kept at all.
TEST(JobManagerHistoryTest, EndedJobsKeepFewEventsAndOnlyTheNewestAreKept) {
  JobManager manager({.events_per_finished_job = 3,
                      .max_finished_jobs = 2,
                      .version = kVersion});
  std::vector<std::string> workers;
  for (const char* name : {"a", "b"}) {
    workers.push_back(RegisterOn(manager, name));
  }
  auto send = [&](const std::string& w, const v1::WorkerMessage& m) {
    ASSERT_TRUE(manager.HandleWorkerMessage(w, m).ok());
  };
  std::vector<std::string> jobs;
  for (int j = 0; j < 3; ++j) {
    v1::SubmitJobRequest request;
    request.set_yaml(JobYaml(2, "mlp", /*steps=*/10));
    request.set_file_name("job.yaml");
    absl::StatusOr<v1::Job> job = manager.SubmitJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.push_back(job->id());
    for (const std::string& w : workers) {
      v1::WorkerMessage m;
      m.mutable_ready()->set_job_id(job->id());
      m.mutable_ready()->set_data_endpoint("127.0.0.1:1");
      send(w, m);
    }
    for (int step = 1; step <= 10; ++step) {
      for (const std::string& w : workers) {
        v1::WorkerMessage m;
        m.mutable_step()->set_job_id(job->id());
        m.mutable_step()->set_step(step);
        send(w, m);
      }
    }
    for (const std::string& w : workers) {
      v1::WorkerMessage m;
      m.mutable_ended()->set_job_id(job->id());
      m.mutable_ended()->set_state(v1::SUCCEEDED);
      send(w, m);
    }
    ASSERT_EQ(manager.GetJob(job->id())->state(), v1::SUCCEEDED);
  }
  // The oldest of three ended jobs is forgotten.
  EXPECT_EQ(manager.GetJob(jobs[0]).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.ListJobs().size(), 2u);
  // The newest keeps 3 events (of 10 steps and its state changes), the
  // last of them its end; a watcher from the start skips to them.
  int64_t cursor = 0;
  bool done = false;
  absl::StatusOr<std::vector<v1::JobEvent>> events = manager.WaitEvents(
      jobs[2], &cursor, std::chrono::steady_clock::now(), &done);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ(events->back().job().state(), v1::SUCCEEDED);
  EXPECT_EQ((*events)[1].step().step(), 10);
  EXPECT_TRUE(done);
}

TEST(JobManagerTraceTest, OnlyTheNewestEndedJobsKeepTheirTimelines) {
  JobManager manager({.trace_finished_jobs = 2, .version = kVersion});
  std::vector<std::string> workers;
  for (const char* name : {"a", "b"}) {
    workers.push_back(RegisterOn(manager, name));
  }
  std::vector<std::string> jobs;
  for (int j = 0; j < 4; ++j) {
    v1::SubmitJobRequest request;
    request.set_yaml(JobYaml(2));
    request.set_file_name("job.yaml");
    absl::StatusOr<v1::Job> job = manager.SubmitJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    for (int r = 0; r < 2; ++r) {
      v1::WorkerMessage m;
      m.mutable_ready()->set_job_id(job->id());
      m.mutable_ready()->set_data_endpoint("127.0.0.1:1");
      ASSERT_TRUE(manager.HandleWorkerMessage(workers[r], m).ok());
    }
    for (int r = 0; r < 2; ++r) {
      v1::WorkerMessage m;
      m.mutable_step()->set_job_id(job->id());
      m.mutable_step()->set_step(1);
      ASSERT_TRUE(manager.HandleWorkerMessage(workers[r], m).ok());
    }
    ASSERT_TRUE(manager.GetTrace(job->id(), 0).ok());
    ASSERT_TRUE(manager.CancelJob(job->id(), "next").ok());
    for (int r = 0; r < 2; ++r) {
      v1::WorkerMessage m;
      m.mutable_ended()->set_job_id(job->id());
      m.mutable_ended()->set_state(v1::CANCELLED);
      ASSERT_TRUE(manager.HandleWorkerMessage(workers[r], m).ok());
    }
    jobs.push_back(job->id());
  }
  EXPECT_EQ(manager.GetTrace(jobs[0], 0).status().code(),
            absl::StatusCode::kNotFound);
  const absl::Status dropped = manager.GetTrace(jobs[1], 0).status();
  EXPECT_EQ(dropped.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(dropped.message(), HasSubstr("newest 2 ended jobs"));
  EXPECT_TRUE(manager.GetTrace(jobs[2], 0).ok());
  EXPECT_TRUE(manager.GetTrace(jobs[3], 0).ok());
}

TEST_F(JobManagerTest, TellsItsObserverAboutSubmissionsStepsAndEnds) {
  const std::string w1 = AddWorker("a");
  const std::string w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  Step(w1, job, 1, false);
  Step(w2, job, 1, true);
  Step(w1, job, 2, false);  // Incomplete: no event.
  ASSERT_TRUE(manager_.CancelJob(job, "enough").ok());
  ASSERT_TRUE(manager_.CancelJob(job, "again").ok());  // Idempotent.
  EXPECT_THAT(observer_.log,
              ::testing::ElementsAre("submitted " + job, "step " + job + " 1",
                                     "finished " + job + " CANCELLED"));
}

// ---------------------------------------------------------------------------
// Checkpoints, resume and restarts.

class JobManagerCheckpointTest : public JobManagerTest {
 protected:
  JobManagerCheckpointTest()
      : dir_((std::filesystem::path(::testing::TempDir()) /
              absl::StrCat("job_manager_ckpt_", getpid(), "_",
                           ::testing::UnitTest::GetInstance()
                               ->current_test_info()
                               ->name()))
                 .string()) {
    std::filesystem::remove_all(dir_);
  }

  // JobYaml(2) with a checkpoint section and `extra` top-level lines.
  std::string CkptYaml(const std::string& checkpoint,
                       const std::string& extra = "", int steps = 3) {
    return absl::StrCat(JobYaml(2, "mlp", steps), "checkpoint: {dir: ", dir_,
                        checkpoint.empty() ? "" : ", ", checkpoint, "}\n",
                        extra);
  }

  // Writes stage `stage`'s file of `step` as a worker would, and returns
  // what the worker reports of it.
  v1::StageFile WriteStage(int64_t step, int stage) {
    const std::string path = checkpoint::StageFilePath(dir_, step, stage);
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    const std::string bytes = absl::StrCat("stage ", stage, " step ", step);
    std::ofstream(path, std::ios::binary) << bytes;
    v1::StageFile f;
    f.set_stage(stage);
    f.set_file(absl::StrCat("stage-", stage, ".safetensors"));
    f.set_bytes(bytes.size());
    f.set_crc32c(Crc32c(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
    return f;
  }
  void Saved(const std::string& worker, const std::string& job, int64_t step,
             std::vector<v1::StageFile> files) {
    v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job_id(job);
    m.mutable_checkpoint()->set_step(step);
    for (v1::StageFile& f : files) *m.mutable_checkpoint()->add_files() = f;
    Send(worker, m);
  }
  // Both ranks of a 2-stage job run `step` and write its files.
  void StepWithCheckpoint(const std::string& w1, const std::string& w2,
                          const std::string& job, int64_t step) {
    Step(w1, job, step, false);
    Step(w2, job, step, true);
    Saved(w1, job, step, {WriteStage(step, 0)});
    Saved(w2, job, step, {WriteStage(step, 1)});
  }
  // A two-stage job on w1 and w2 that commits step 1 and is cancelled.
  void CommitOneStepAndCancel(const std::string& w1, const std::string& w2) {
    const std::string first = StartJob(CkptYaml("every: 1"), w1, w2);
    StepWithCheckpoint(w1, w2, first, 1);
    ASSERT_TRUE(manager_.CancelJob(first, "stop").ok());
    Ended(w1, first, v1::CANCELLED);
    Ended(w2, first, v1::CANCELLED);
  }
  bool Committed(int64_t step) {
    return std::filesystem::exists(
        std::filesystem::path(checkpoint::StepDirPath(dir_, step)) /
        checkpoint::kManifestFileName);
  }
  std::string StartJob(const std::string& yaml, const std::string& w1,
                       const std::string& w2) {
    absl::StatusOr<v1::Job> job = Submit(yaml);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    Ready(w1, job->id(), 5001);
    Ready(w2, job->id(), 5002);
    EXPECT_EQ(State(job->id()), v1::RUNNING);
    return job->id();
  }
  v1::JobProgram LastProgram(const std::string& worker) {
    auto prepares = Conn(worker).Of(v1::CoordinatorMessage::kPrepare);
    EXPECT_FALSE(prepares.empty());
    return prepares.empty() ? v1::JobProgram()
                            : prepares.back().prepare().program();
  }

  // Step 1 of a two-stage job, its manifest write held in the test hook
  // until Release: the reporter thread that completed the step is inside
  // HandleWorkerMessage, past the manager's lock.
  struct HeldCommit {
    std::promise<void> release;
    std::thread reporter;
    void Release() {
      release.set_value();
      reporter.join();
    }
  };
  HeldCommit HoldCommitOfStepOne(const std::string& w1, const std::string& w2,
                                 const std::string& job) {
    HeldCommit held;
    auto entered = std::make_shared<std::promise<void>>();
    std::shared_future<void> released = held.release.get_future().share();
    before_manifest_ = [entered, released](int64_t) {
      entered->set_value();
      released.wait();
    };
    Step(w1, job, 1, false);
    Step(w2, job, 1, true);
    Saved(w1, job, 1, {WriteStage(1, 0)});
    held.reporter = std::thread([this, w2, job, last = WriteStage(1, 1)] {
      Saved(w2, job, 1, {last});
    });
    entered->get_future().wait();
    return held;
  }

  std::string dir_;
};

TEST_F(JobManagerCheckpointTest, AStepCountsOnlyOnceEveryStageIsInAndIsPruned) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("every: 1, keep_latest: 2"), w1, w2);

  Step(w1, job, 1, false);
  Step(w2, job, 1, true);
  Saved(w1, job, 1, {WriteStage(1, 0)});
  // One stage is not a checkpoint: nothing is committed yet.
  EXPECT_FALSE(Committed(1));
  EXPECT_EQ(manager_.GetJob(job)->last_checkpoint_step(), 0);
  Saved(w2, job, 1, {WriteStage(1, 1)});
  EXPECT_TRUE(Committed(1));
  EXPECT_EQ(manager_.GetJob(job)->last_checkpoint_step(), 1);

  absl::StatusOr<checkpoint::CheckpointManifest> m =
      checkpoint::LoadCompleteCheckpoint(dir_, 1, /*verify_checksums=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->job, "mlp");
  EXPECT_EQ(m->job_id, job);
  EXPECT_EQ(m->num_stages, 2);
  EXPECT_EQ(m->stage_begin, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->config_hash, job::JobConfigHash(CkptYaml("")));

  StepWithCheckpoint(w1, w2, job, 2);
  StepWithCheckpoint(w1, w2, job, 3);
  // keep_latest: 2 keeps steps 2 and 3.
  EXPECT_FALSE(std::filesystem::exists(checkpoint::StepDirPath(dir_, 1)));
  EXPECT_TRUE(Committed(2));
  EXPECT_TRUE(Committed(3));
  Ended(w1, job, v1::SUCCEEDED);
  Ended(w2, job, v1::SUCCEEDED);
  EXPECT_EQ(State(job), v1::SUCCEEDED);
  EXPECT_EQ(manager_.GetJob(job)->last_checkpoint_step(), 3);
}

// A manifest is written without the manager's lock: while one is held
// before its write, the manager answers and handles other workers' messages
// (under the lock, every heartbeat of a fleet waited behind every commit).
// The step counts as committed once its manifest is on disk.
TEST_F(JobManagerCheckpointTest, AManifestIsWrittenWithoutTheManagersLock) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 1"), w1, w2);
  HeldCommit held = HoldCommitOfStepOne(w1, w2, job);

  std::future<v1::Job> answer = std::async(std::launch::async, [&] {
    v1::WorkerMessage beat;
    beat.mutable_heartbeat()->set_job_id(job);
    Send(w1, beat);
    return *manager_.GetJob(job);
  });
  const bool answered =
      answer.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  held.Release();
  ASSERT_TRUE(answered) << "the manager was held through a manifest write";
  EXPECT_EQ(answer.get().last_checkpoint_step(), 0);  // Not yet on disk.
  EXPECT_TRUE(Committed(1));
  EXPECT_EQ(manager_.GetJob(job)->last_checkpoint_step(), 1);
}

// The ranks' JobEnded can overtake the final step's manifest write (another
// handler thread writes it): the job's end waits for it, and so succeeds.
TEST_F(JobManagerCheckpointTest, TheJobsEndWaitsForItsLastManifest) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 1", "", 1), w1, w2);
  HeldCommit held = HoldCommitOfStepOne(w1, w2, job);
  std::thread enders([&] {
    Ended(w1, job, v1::SUCCEEDED);
    Ended(w2, job, v1::SUCCEEDED);
  });
  // Usually the enders are waiting for the write by now; either way the
  // outcome is the same.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  held.Release();
  enders.join();
  EXPECT_EQ(State(job), v1::SUCCEEDED) << manager_.GetJob(job)->message();
  EXPECT_EQ(manager_.GetJob(job)->last_checkpoint_step(), 1);
  EXPECT_TRUE(Committed(1));
}

TEST_F(JobManagerCheckpointTest, SuccessWithoutTheFinalCheckpointIsAFailure) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml(""), w1, w2);
  for (int step = 1; step <= 3; ++step) {
    Step(w1, job, step, false);
    Step(w2, job, step, true);
  }
  Saved(w1, job, 3, {WriteStage(3, 0)});  // Stage 1's report never came.
  Ended(w1, job, v1::SUCCEEDED);
  Ended(w2, job, v1::SUCCEEDED);
  EXPECT_EQ(State(job), v1::FAILED);
  EXPECT_THAT(manager_.GetJob(job)->message(),
              HasSubstr("the final checkpoint (step 3) is incomplete"));
  EXPECT_FALSE(Committed(3));
}

TEST_F(JobManagerCheckpointTest, AFileForAnotherRanksStageFailsTheJob) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 1"), w1, w2);
  Saved(w1, job, 1, {WriteStage(1, 0), WriteStage(1, 1)});
  EXPECT_EQ(State(job), v1::FAILED);
  EXPECT_THAT(manager_.GetJob(job)->message(),
              HasSubstr("reported a checkpoint file for stage 1, which it "
                        "does not hold"));
  EXPECT_FALSE(Committed(1));
}

TEST_F(JobManagerCheckpointTest, ResumeLatestStartsAfterTheNewestCompleteStep) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string first = StartJob(CkptYaml("every: 1"), w1, w2);
  StepWithCheckpoint(w1, w2, first, 1);
  StepWithCheckpoint(w1, w2, first, 2);
  // Step 3's files: only one stage before the job was cancelled.
  Step(w1, first, 3, false);
  Saved(w1, first, 3, {WriteStage(3, 0)});
  ASSERT_TRUE(manager_.CancelJob(first, "interrupted").ok());
  Ended(w1, first, v1::CANCELLED);
  Ended(w2, first, v1::CANCELLED);

  absl::StatusOr<v1::Job> resumed =
      Submit(CkptYaml("every: 1", "resume: latest\n"));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->steps_done(), 2);
  EXPECT_EQ(resumed->resumed_from_step(), 2);
  EXPECT_EQ(resumed->resumed_from(), checkpoint::StepDirPath(dir_, 2));
  for (const std::string& w : {w1, w2}) {
    const v1::JobProgram p = LastProgram(w);
    EXPECT_EQ(p.job_id(), resumed->id());
    EXPECT_EQ(p.resume_step(), 2);
    EXPECT_EQ(p.resume_dir(), checkpoint::StepDirPath(dir_, 2));
    // Each rank is told only of its own stage's file, as the manifest has it.
    ASSERT_EQ(p.resume_files_size(), 1);
    EXPECT_EQ(p.resume_files(0).stage(), p.rank());
    EXPECT_EQ(p.resume_files(0).file(),
              absl::StrCat("stage-", p.rank(), ".safetensors"));
  }

  // One live job per directory: a second would overwrite its steps.
  absl::StatusOr<v1::Job> twice =
      Submit(CkptYaml("every: 1", "resume: latest\n"));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(),
              HasSubstr(absl::StrCat("is in use by ", resumed->id())));
  ASSERT_TRUE(manager_.CancelJob(resumed->id(), "stop").ok());

  // An older step named by its path would write over the newer complete
  // step 2 (and retention would then delete the job's own steps): refused.
  absl::StatusOr<v1::Job> older = Submit(CkptYaml(
      "every: 1",
      absl::StrCat("resume: ", checkpoint::StepDirPath(dir_, 1), "\n")));
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(older.status().message(),
              HasSubstr("already holds a complete checkpoint of an earlier "
                        "run (step 2), newer than where this job starts "
                        "(step 1)"));
  // So is a fresh start there.
  EXPECT_FALSE(Submit(CkptYaml("every: 1")).ok());
  // The newest step named by its path is fine.
  absl::StatusOr<v1::Job> by_path = Submit(CkptYaml(
      "every: 1",
      absl::StrCat("resume: ", checkpoint::StepDirPath(dir_, 2), "\n")));
  ASSERT_TRUE(by_path.ok()) << by_path.status();
  EXPECT_EQ(by_path->resumed_from_step(), 2);
}

TEST_F(JobManagerCheckpointTest, ResumeNeverSilentlyStartsFromScratch) {
  AddWorker("a");
  AddWorker("b");
  // Nothing written yet.
  absl::StatusOr<v1::Job> none = Submit(CkptYaml("", "resume: latest\n"));
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(),
              HasSubstr("the job was asked to resume, so it does not start "
                        "from scratch"));

  // A step directory without a manifest is incomplete.
  const std::string w1 = AddWorker("c"), w2 = AddWorker("d");
  (void)w1;
  (void)w2;
  WriteStage(2, 0);
  WriteStage(2, 1);
  absl::StatusOr<v1::Job> partial = Submit(CkptYaml(
      "", absl::StrCat("resume: ", checkpoint::StepDirPath(dir_, 2), "\n")));
  ASSERT_FALSE(partial.ok());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(partial.status().message(), HasSubstr("step-2"));

  absl::StatusOr<v1::Job> missing =
      Submit(CkptYaml("", absl::StrCat("resume: ", dir_, "/nowhere\n")));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerCheckpointTest, ResumeRefusesAnotherConfiguration) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  CommitOneStepAndCancel(w1, w2);

  std::string other = CkptYaml("every: 1", "resume: latest\n");
  other = absl::StrReplaceAll(other, {{"lr: 0.1", "lr: 0.2"}});
  absl::StatusOr<v1::Job> job = Submit(other);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job.status().message(),
              HasSubstr("another training configuration"));
  // Resuming the finished run is refused too: nothing is left to train.
  absl::StatusOr<v1::Job> done =
      Submit(CkptYaml("every: 1", "resume: latest\n", 1));
  ASSERT_FALSE(done.ok());
}

// The same training without its boundary (one stage, one worker) resumes
// the two-stage checkpoint: the manifest records the training hash, and
// the one rank is sent both stage files and the checkpoint's cut.
TEST_F(JobManagerCheckpointTest, ResumeOnAnotherLayoutSendsTheFilesAndTheCut) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  CommitOneStepAndCancel(w1, w2);
  ASSERT_TRUE(Committed(1));

  const std::string one_stage = absl::StrReplaceAll(
      CkptYaml("every: 1", "resume: latest\n"), {{"    - boundary\n", ""}});
  absl::StatusOr<v1::Job> job = Submit(one_stage);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->num_workers(), 1);
  EXPECT_EQ(job->resumed_from_step(), 1);
  const v1::JobProgram p = LastProgram(w1);
  EXPECT_EQ(p.job_id(), job->id());
  EXPECT_EQ(p.resume_step(), 1);
  EXPECT_THAT(p.resume_stage_begin(), ::testing::ElementsAre(0, 1));
  ASSERT_EQ(p.resume_files_size(), 2);
  EXPECT_EQ(p.resume_files(0).stage(), 0);
  EXPECT_EQ(p.resume_files(1).stage(), 1);
  // What the worker does with it: the same plan and program.
  EXPECT_TRUE(job::PlanOfProgram(p).ok());
}

TEST_F(JobManagerCheckpointTest, ALostWorkerRestartsTheJobFromItsLastCommit) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 1}\n"), w1, w2);
  const uint64_t first_number = LastProgram(w1).job_number();
  StepWithCheckpoint(w1, w2, job, 1);
  const std::string spare = AddWorker("spare");

  manager_.WorkerDisconnected(w2, "control connection closed");
  // Not failed: queued again at the head, the survivor told to stop.
  v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::QUEUED);
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_THAT(info.last_restart_reason(), HasSubstr("lost"));
  EXPECT_EQ(info.steps_done(), 1);
  ASSERT_FALSE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
  // The survivor frees itself; the job is placed on it and the spare.
  Ended(w1, job, v1::CANCELLED);
  EXPECT_EQ(State(job), v1::PLANNING);
  const v1::JobProgram p = LastProgram(spare);
  EXPECT_EQ(p.job_id(), job);
  EXPECT_EQ(p.resume_step(), 1);
  EXPECT_NE(p.job_number(), first_number);  // A new data plane.
  EXPECT_EQ(LastProgram(w1).resume_step(), 1);
  EXPECT_THAT(observer_.log,
              testing::Contains("restarted " + job + " worker_lost"));
  // The same layout, a new attempt: it has its entry, where it resumed and
  // why (it once had none, though `restarts` counted it).
  info = *manager_.GetJob(job);
  ASSERT_EQ(info.layouts_size(), 2);
  EXPECT_EQ(info.layouts(1).from_step(), 1);
  EXPECT_THAT(info.layouts(1).reason(), HasSubstr("lost"));
  EXPECT_THAT(info.layouts(1).reason(), HasSubstr("same layout"));

  // A second loss is past the policy: FAILED, saying so.
  Ready(w1, job, 5003);
  Ready(spare, job, 5004);
  EXPECT_EQ(State(job), v1::RUNNING);
  manager_.WorkerDisconnected(spare, "control connection closed");
  info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.message(), HasSubstr("(after 1 of 1 restarts)"));
}

// A worker of an earlier attempt still winding down when it is lost: the
// loss is that attempt's, not the new one's (it once failed a healthy
// restarted attempt "after 1 of 1 restarts").
TEST_F(JobManagerCheckpointTest,
       ALeftoverWorkerOfAnEarlierAttemptIsNotItsLoss) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 1}\n"), w1, w2);
  StepWithCheckpoint(w1, w2, job, 1);
  const std::string s1 = AddWorker("spare1"), s2 = AddWorker("spare2");
  manager_.WorkerDisconnected(w1, "control connection closed");
  // Restarted on the spares while w2 has not ended its part yet.
  EXPECT_EQ(State(job), v1::PLANNING);
  EXPECT_EQ(LastProgram(s1).job_id(), job);
  EXPECT_EQ(LastProgram(s2).job_id(), job);
  manager_.WorkerDisconnected(w2, "control connection closed");
  v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::PLANNING) << info.message();
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_EQ(WorkerState(w2), v1::LOST);
  Ready(s1, job, 5003);
  Ready(s2, job, 5004);
  EXPECT_EQ(State(job), v1::RUNNING);
}

// A job that kills its workers while preparing (a size no check caught)
// once took four of four workers in 200 ms, one attempt after another. One
// loss before any step is restarted (it may be the machine's); the second
// attempt in a row to lose a worker before a step is not, saying why, and
// the rest of the cluster is spared.
TEST_F(JobManagerCheckpointTest, AttemptsThatKeepLosingWorkersStopRestarting) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string s1 = AddWorker("spare1"), s2 = AddWorker("spare2");
  const std::string job =
      StartJob(CkptYaml("", "restart: {max_restarts: 5}\n"), w1, w2);
  manager_.WorkerDisconnected(w2, "control connection closed");
  EXPECT_EQ(manager_.GetJob(job)->restarts(), 1);
  Ended(w1, job, v1::CANCELLED);
  EXPECT_EQ(State(job), v1::PLANNING);
  // The second attempt loses one of its workers before a step too.
  std::string placed;
  for (const std::string& w : {w1, s1, s2}) {
    if (WorkerState(w) == v1::BUSY) placed = w;
  }
  ASSERT_FALSE(placed.empty());
  manager_.WorkerDisconnected(placed, "control connection closed");
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_THAT(info.message(),
              HasSubstr("not restarted: 2 attempts in a row lost a worker "
                        "before completing a step"));
}

// A loss after a step resets the count: a long job may lose workers now
// and then and go on.
TEST_F(JobManagerCheckpointTest, ALossAfterAStepIsRestartedAsBefore) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string s1 = AddWorker("spare1");
  const std::string job =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 5}\n"), w1, w2);
  manager_.WorkerDisconnected(w2, "control connection closed");  // No step.
  Ended(w1, job, v1::CANCELLED);
  ASSERT_EQ(State(job), v1::PLANNING);
  std::vector<std::string> placed;
  for (const std::string& w : {w1, s1}) {
    if (WorkerState(w) == v1::BUSY) placed.push_back(w);
  }
  ASSERT_EQ(placed.size(), 2u);
  Ready(placed[0], job, 5003);
  Ready(placed[1], job, 5004);
  StepWithCheckpoint(placed[0], placed[1], job, 1);
  AddWorker("spare2");
  manager_.WorkerDisconnected(placed[1], "control connection closed");
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_NE(info.state(), v1::FAILED) << info.message();
  EXPECT_EQ(info.restarts(), 2);
}

TEST_F(JobManagerCheckpointTest, ARestartNeedsEnoughLiveWorkers) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("", "restart: {max_restarts: 3}\n"), w1, w2);
  manager_.WorkerDisconnected(w2, "control connection closed");
  EXPECT_EQ(State(job), v1::FAILED);
  EXPECT_THAT(manager_.GetJob(job)->message(),
              HasSubstr("not restarted: the job needs 2 workers and 1 are "
                        "live"));
}

// A queued job says what it waits for, kept current as workers come and
// go: a queue that cannot move must not look like one that will.
TEST_F(JobManagerTest, AQueuedJobSaysWhatItWaitsFor) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string first = StartTwoStageJob(w1, w2);
  absl::StatusOr<v1::Job> second = Submit(JobYaml(2));
  ASSERT_TRUE(second.ok()) << second.status();
  v1::Job info = *manager_.GetJob(second->id());
  EXPECT_EQ(info.state(), v1::QUEUED);
  const std::string cannot_preempt =
      "needs 2 workers, 0 free; the others run jobs it cannot preempt (of "
      "equal or higher priority, or without checkpoint.dir)";
  EXPECT_EQ(info.queue_reason(), cannot_preempt);
  absl::StatusOr<v1::Job> third = Submit(JobYaml(2));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(manager_.GetJob(third->id())->queue_reason(),
            "needs 2 workers, 0 free; behind job-2 (normal)");
  // A worker is lost: the queue now waits for one to register.
  manager_.WorkerDisconnected(w2, "control connection closed");
  EXPECT_EQ(manager_.GetJob(second->id())->queue_reason(),
            "needs 2 workers; 1 is live: it waits for more to register");
  EXPECT_EQ(manager_.GetJob(third->id())->queue_reason(),
            "needs 2 workers; 1 is live: it waits for more to register");
  EXPECT_EQ(State(first), v1::FAILED);
  // Another registers and the survivor is free: the head is placed, the
  // next one waits for idle workers.
  Ended(w1, first, v1::CANCELLED);
  EXPECT_EQ(manager_.GetJob(second->id())->queue_reason(),
            "needs 2 workers; 1 is live: it waits for more to register");
  AddWorker("c");
  EXPECT_EQ(State(second->id()), v1::PLANNING);
  EXPECT_EQ(manager_.GetJob(second->id())->queue_reason(), "");
  EXPECT_EQ(manager_.GetJob(third->id())->queue_reason(), cannot_preempt);
}

// Two workers lost at once, the job's and a spare's, in either order: the
// restart decided on the first loss counted the second as live, and the
// job then sat QUEUED for good. Every loss re-examines it.
TEST_F(JobManagerCheckpointTest, TwoLossesAtOnceFailARestartThatCannotRun) {
  for (const bool spare_first : {false, true}) {
    SCOPED_TRACE(spare_first ? "the spare first" : "the job's worker first");
    const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
    const std::string spare = AddWorker("spare");
    const std::string job =
        StartJob(CkptYaml("", "restart: {max_restarts: 3}\n"), w1, w2);
    if (spare_first) {
      manager_.WorkerDisconnected(spare, "control connection closed");
      manager_.WorkerDisconnected(w2, "control connection closed");
    } else {
      manager_.WorkerDisconnected(w2, "control connection closed");
      manager_.WorkerDisconnected(spare, "control connection closed");
    }
    const v1::Job info = *manager_.GetJob(job);
    EXPECT_EQ(info.state(), v1::FAILED);
    EXPECT_THAT(info.message(),
                HasSubstr("not restarted: the job needs 2 workers and 1 are "
                          "live"));
    Ended(w1, job, v1::CANCELLED);
    EXPECT_EQ(WorkerState(w1), v1::IDLE);
    manager_.WorkerDisconnected(w1, "control connection closed");
  }
}

TEST_F(JobManagerCheckpointTest, TwoLossesAtOnceShrinkAnElasticRestart) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string spare = AddWorker("spare");
  const std::string job = StartJob(
      CkptYaml("", "restart: {max_restarts: 3, elastic: {min_workers: 1}}\n"),
      w1, w2);
  manager_.WorkerDisconnected(w2, "control connection closed");
  // Counted live when w2's loss was handled; lost right after.
  manager_.WorkerDisconnected(spare, "control connection closed");
  v1::Job info = *manager_.GetJob(job);
  ASSERT_EQ(info.state(), v1::QUEUED) << info.message();
  EXPECT_EQ(info.restarts(), 1);
  // The survivor frees itself and the job runs on it alone.
  Ended(w1, job, v1::CANCELLED);
  info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::PLANNING) << info.message();
  EXPECT_THAT(info.worker_ids(), ElementsAre(w1));
  EXPECT_EQ(LastProgram(w1).job_id(), job);
}

TEST_F(JobManagerCheckpointTest, TwoLossesAtOnceBelowMinWorkersFail) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string spare = AddWorker("spare");
  const std::string job = StartJob(
      CkptYaml("", "restart: {max_restarts: 3, elastic: {min_workers: 2}}\n"),
      w1, w2);
  manager_.WorkerDisconnected(w1, "control connection closed");
  manager_.WorkerDisconnected(spare, "control connection closed");
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.message(),
              HasSubstr("the job needs 2 workers and 1 are live, fewer than "
                        "restart.elastic.min_workers (2)"));
}

// Both silent past the heartbeat timeout: lost in one Tick, one after the
// other, with the same outcome.
TEST_F(JobManagerCheckpointTest, TwoWorkersSilentAtOnceFailARestart) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string spare = AddWorker("spare");
  const std::string job =
      StartJob(CkptYaml("", "restart: {max_restarts: 3}\n"), w1, w2);
  // Only w1 heartbeats; w2 and the spare fall silent together.
  for (int i = 0; i < 40; ++i) {
    now_ += std::chrono::milliseconds(100);
    v1::WorkerMessage hb;
    hb.mutable_heartbeat()->set_job_id(job);
    Send(w1, hb);
    manager_.Tick();
  }
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED) << info.message();
  EXPECT_THAT(info.message(), HasSubstr("needs 2 workers and 1 are live"));
  EXPECT_EQ(WorkerState(spare), v1::LOST);
}

// A damaged newest checkpoint once used up every restart, one attempt
// after another reading the same corrupt file: a DataLoss while preparing
// is not restarted.
TEST_F(JobManagerCheckpointTest, ADamagedCheckpointIsNotWorthARestart) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 3}\n"), w1, w2);
  StepWithCheckpoint(w1, w2, job, 1);
  const std::string spare = AddWorker("spare");
  manager_.WorkerDisconnected(w2, "control connection closed");
  Ended(w1, job, v1::CANCELLED);
  ASSERT_EQ(State(job), v1::PLANNING);
  Ended(w1, job, v1::FAILED, "stage-0.safetensors: CRC-32C differs",
        absl::StatusCode::kDataLoss);
  Ended(spare, job, v1::CANCELLED);
  now_ += std::chrono::seconds(1);  // Past the failure grace.
  manager_.Tick();
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_THAT(info.message(), HasSubstr("not restarted: the checkpoint it "
                                        "resumes from is damaged"));
}

// Interleaved-1f1b with 4 microbatches cannot run on 3 workers: with 3
// live it runs on 2, and says why the third sits idle.
TEST_F(JobManagerCheckpointTest, ALayoutOnFewerWorkersThanAreLiveSaysWhy) {
  std::vector<std::string> w;
  for (const char* name : {"a", "b", "c", "d"}) w.push_back(AddWorker(name));
  const std::string yaml =
      absl::StrCat(absl::StrReplaceAll(
                       JobYaml(8), {{"pipeline: {schedule: 1f1b}",
                                     "pipeline: {schedule: interleaved-1f1b, "
                                     "virtual_stages: 2}"}}),
                   "checkpoint: {dir: ", dir_, "}\n",
                   "restart: {max_restarts: 2, elastic: {min_workers: 1}}\n");
  absl::StatusOr<v1::Job> submitted = Submit(yaml);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->id();
  for (int i = 0; i < 4; ++i) Ready(w[i], job, 5001 + i);
  ASSERT_EQ(State(job), v1::RUNNING);
  manager_.WorkerDisconnected(w[3], "control connection closed");
  for (int i = 0; i < 3; ++i) Ended(w[i], job, v1::CANCELLED);
  const v1::Job info = *manager_.GetJob(job);
  ASSERT_EQ(info.state(), v1::PLANNING) << info.message();
  EXPECT_EQ(info.worker_ids_size(), 2);
  ASSERT_EQ(info.layouts_size(), 2);
  EXPECT_THAT(info.layouts(1).reason(), HasSubstr("laid out on 2 of the 4"));
  EXPECT_THAT(info.layouts(1).reason(), HasSubstr("; not on 3: "));
  EXPECT_THAT(info.layouts(1).reason(), HasSubstr("multiple"));
}

// The reason of a restart after a rank's failure report once came out
// empty: it was passed by reference to the job's own failure text, which
// the next attempt clears before recording it.
TEST_F(JobManagerCheckpointTest, ARestartAfterARanksFailureKeepsItsReason) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 1}\n"), w1, w2);
  StepWithCheckpoint(w1, w2, job, 1);
  Ended(w1, job, v1::FAILED, "rank 0 (stage 0): boom");
  Ended(w2, job, v1::CANCELLED);
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.restarts(), 1);
  EXPECT_THAT(info.last_restart_reason(), HasSubstr("boom"));
}

// ---- Drains (DrainWorker, the worker's DrainRequest) ----

class JobManagerDrainTest : public JobManagerCheckpointTest {
 protected:
  void DrainPoint(const std::string& worker, const std::string& job,
                  int64_t step) {
    v1::WorkerMessage m;
    m.mutable_drain_point()->set_job_id(job);
    m.mutable_drain_point()->set_step(step);
    Send(worker, m);
  }
  void Drained(const std::string& worker, const std::string& job,
               int64_t step) {
    v1::WorkerMessage m;
    m.mutable_ended()->set_job_id(job);
    m.mutable_ended()->set_state(v1::CANCELLED);
    m.mutable_ended()->set_drained_after_step(step);
    Send(worker, m);
  }
  // The DrainJob messages `worker` received: their stop_after_step.
  std::vector<int64_t> DrainSteps(const std::string& worker) {
    std::vector<int64_t> out;
    for (const auto& m : Conn(worker).Of(v1::CoordinatorMessage::kDrain)) {
      out.push_back(m.drain().stop_after_step());
    }
    return out;
  }
  v1::Worker WorkerInfo(const std::string& id) {
    for (const v1::Worker& w : manager_.ListWorkers()) {
      if (w.id() == id) return w;
    }
    return v1::Worker();
  }
};

// The protocol: every rank is asked for its next boundary, the largest
// answer is the step all stop after, that step is checkpointed, and the job
// resumes from it on the spare, not counted as a restart; the drained
// worker is told to leave.
TEST_F(JobManagerDrainTest, ARunningJobMovesAfterTheStepEveryRankAgreesOn) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 4", "", 8), w1, w2);
  const std::string spare = AddWorker("spare");
  Step(w1, job, 1, false);
  Step(w2, job, 1, true);

  absl::StatusOr<v1::Worker> drained = manager_.DrainWorker("b", "repair");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->id(), w2);
  EXPECT_TRUE(drained->draining());
  EXPECT_EQ(drained->drain_reason(), "repair");
  EXPECT_THAT(DrainSteps(w1), ElementsAre(0));
  EXPECT_THAT(DrainSteps(w2), ElementsAre(0));
  // Not yet: one rank has answered.
  DrainPoint(w1, job, 3);
  EXPECT_THAT(DrainSteps(w2), ElementsAre(0));
  DrainPoint(w2, job, 2);
  EXPECT_THAT(DrainSteps(w1), ElementsAre(0, 3));
  EXPECT_THAT(DrainSteps(w2), ElementsAre(0, 3));
  // Draining again changes nothing.
  ASSERT_TRUE(manager_.DrainWorker(w2, "again").ok());
  EXPECT_EQ(DrainSteps(w2).size(), 2u);

  for (int64_t step : {2, 3}) {
    Step(w1, job, step, false);
    Step(w2, job, step, true);
  }
  Saved(w1, job, 3, {WriteStage(3, 0)});
  Saved(w2, job, 3, {WriteStage(3, 1)});
  EXPECT_TRUE(Committed(3));
  Drained(w2, job, 3);
  EXPECT_EQ(State(job), v1::RUNNING);  // w1 has not stopped yet.
  EXPECT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kLeave).size(), 1u);
  Drained(w1, job, 3);
  // Placed again at once, on w1 and the spare, from step 3.
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::PLANNING);
  EXPECT_EQ(info.restarts(), 0);
  EXPECT_EQ(info.steps_done(), 3);
  EXPECT_EQ(LastProgram(spare).resume_step(), 3);
  EXPECT_EQ(LastProgram(w1).resume_step(), 3);
  EXPECT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kPrepare).size(), 1u);
  EXPECT_THAT(observer_.log,
              testing::Contains("restarted " + job + " drained"));
  // The drained worker is idle, draining, and not counted live: a job
  // needing 3 workers is refused.
  EXPECT_EQ(WorkerInfo(w2).state(), v1::IDLE);
  EXPECT_TRUE(WorkerInfo(w2).draining());
  EXPECT_EQ(Submit(JobYaml(3)).status().code(),
            absl::StatusCode::kResourceExhausted);
  v1::WorkerMessage bye;
  bye.mutable_deregister()->set_reason("drained");
  Send(w2, bye);
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_UNSPECIFIED);
  EXPECT_EQ(State(job), v1::PLANNING);
}

TEST_F(JobManagerDrainTest, AnIdleWorkerLeavesAtOnceAndUnknownOnesAreNamed) {
  const std::string w1 = AddWorker("a");
  ASSERT_TRUE(manager_.DrainWorker(w1, "").ok());
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kLeave).size(), 1u);
  EXPECT_EQ(WorkerInfo(w1).drain_reason(), "drained by conveyorctl drain");
  // Given no job while it leaves.
  AddWorker("b");
  EXPECT_EQ(Submit(JobYaml(1)).status().code(), absl::StatusCode::kOk);
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kPrepare).empty());
  absl::StatusOr<v1::Worker> unknown = manager_.DrainWorker("nobody", "");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("no live worker 'nobody'; live workers: worker-1 (a), "
                        "worker-2 (b)"));
}

// No spare and not elastic: nothing is lost, so the job waits in the queue
// for a worker instead of failing, and runs once one registers.
TEST_F(JobManagerDrainTest, WithoutASpareTheDrainedJobWaitsForAWorker) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 4", "", 8), w1, w2);
  // The worker's own SIGTERM.
  v1::WorkerMessage drain;
  drain.mutable_drain()->set_reason("signal 15");
  Send(w1, drain);
  EXPECT_THAT(WorkerInfo(w1).drain_reason(), HasSubstr("signal 15"));
  DrainPoint(w1, job, 1);
  DrainPoint(w2, job, 1);
  Step(w1, job, 1, false);
  Step(w2, job, 1, true);
  Saved(w1, job, 1, {WriteStage(1, 0)});
  Saved(w2, job, 1, {WriteStage(1, 1)});
  Drained(w1, job, 1);
  Drained(w2, job, 1);
  v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::QUEUED) << info.message();
  EXPECT_EQ(info.restarts(), 0);
  const std::string fresh = AddWorker("c");
  EXPECT_EQ(State(job), v1::PLANNING);
  EXPECT_EQ(LastProgram(fresh).resume_step(), 1);
}

TEST_F(JobManagerDrainTest, ARankThatNeverAnswersFailsTheJobNamingIt) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 4", "", 8), w1, w2);
  ASSERT_TRUE(manager_.DrainWorker(w1, "").ok());
  DrainPoint(w1, job, 1);
  v1::WorkerMessage beat;
  beat.mutable_heartbeat()->set_job_id(job);
  now_ += std::chrono::seconds(2);
  Send(w1, beat);
  Send(w2, beat);
  now_ += std::chrono::milliseconds(1500);
  manager_.Tick();
  const v1::Job info = *manager_.GetJob(job);
  EXPECT_EQ(info.state(), v1::FAILED);
  EXPECT_THAT(info.message(), HasSubstr(w2 + " did not answer the drain"));
}

// Without checkpoint.dir there is nothing to resume from elsewhere: the job
// runs to its end on the worker, which then leaves.
TEST_F(JobManagerDrainTest, AJobWithoutCheckpointsEndsBeforeTheWorkerLeaves) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartTwoStageJob(w1, w2);
  ASSERT_TRUE(manager_.DrainWorker(w2, "").ok());
  EXPECT_TRUE(Conn(w2).Of(v1::CoordinatorMessage::kDrain).empty());
  EXPECT_TRUE(Conn(w2).Of(v1::CoordinatorMessage::kLeave).empty());
  Ended(w1, job, v1::SUCCEEDED);
  Ended(w2, job, v1::SUCCEEDED);
  EXPECT_EQ(State(job), v1::SUCCEEDED);
  EXPECT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kLeave).size(), 1u);
}

// Answers past the last step: the job simply runs to its end (its final
// checkpoint as always) and SUCCEEDS; the drained worker leaves then.
TEST_F(JobManagerDrainTest, ADrainAtTheLastStepLetsTheJobEnd) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(CkptYaml("every: 4", "", 3), w1, w2);
  ASSERT_TRUE(manager_.DrainWorker(w2, "").ok());
  DrainPoint(w1, job, 4);  // Already past its last boundary.
  DrainPoint(w2, job, 3);
  EXPECT_THAT(DrainSteps(w1), ElementsAre(0, 3));
  for (int64_t step : {1, 2}) {
    Step(w1, job, step, false);
    Step(w2, job, step, true);
  }
  StepWithCheckpoint(w1, w2, job, 3);
  Ended(w1, job, v1::SUCCEEDED);
  Ended(w2, job, v1::SUCCEEDED);
  EXPECT_EQ(State(job), v1::SUCCEEDED);
  EXPECT_EQ(Conn(w2).Of(v1::CoordinatorMessage::kLeave).size(), 1u);
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kLeave).empty());
}

// Drained while it is still being prepared: no step to keep, so it is
// queued again at once (not a restart) and placed on the others.
TEST_F(JobManagerDrainTest, APlanningJobIsQueuedAgainAtOnce) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  AddWorker("c");
  absl::StatusOr<v1::Job> job = Submit(CkptYaml("every: 1"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(State(job->id()), v1::PLANNING);
  ASSERT_TRUE(manager_.DrainWorker(w1, "").ok());
  EXPECT_FALSE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
  Ended(w1, job->id(), v1::CANCELLED);
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kLeave).size(), 1u);
  EXPECT_EQ(State(job->id()), v1::QUEUED);  // w2 has not ended its part.
  Ended(w2, job->id(), v1::CANCELLED);
  const v1::Job info = *manager_.GetJob(job->id());
  EXPECT_EQ(info.restarts(), 0);
  EXPECT_EQ(info.state(), v1::PLANNING);
  EXPECT_THAT(info.worker_ids(), testing::Not(testing::Contains(w1)));
  EXPECT_THAT(info.worker_ids(), testing::Contains(w2));
}

// Preemption (coordinator/placer.h): a full cluster running a low job, an
// urgent one submitted. The low job is drained at the step every rank
// agrees on, its checkpoint committed, and it is queued again (not a
// restart); the urgent job gets its workers, and once it ends the low job
// resumes from the drained step with nothing redone.
TEST_F(JobManagerDrainTest, AnUrgentJobPreemptsALowOneByDrainingIt) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string low =
      StartJob(CkptYaml("every: 4", "priority: low\n", 8), w1, w2);
  Step(w1, low, 1, false);
  Step(w2, low, 1, true);
  absl::StatusOr<v1::Job> urgent =
      Submit(JobYaml(2, "urgent") + "priority: urgent\n");
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  EXPECT_EQ(urgent->priority(), 300);
  EXPECT_EQ(State(urgent->id()), v1::QUEUED);
  // Asked for their next step boundary, as a drain does; never cancelled.
  EXPECT_THAT(DrainSteps(w1), ElementsAre(0));
  EXPECT_THAT(DrainSteps(w2), ElementsAre(0));
  EXPECT_TRUE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
  v1::Job info = *manager_.GetJob(low);
  EXPECT_EQ(info.preemptions(), 1);
  EXPECT_EQ(info.preempted_by(), urgent->id());
  EXPECT_EQ(manager_.GetJob(urgent->id())->queue_reason(),
            absl::StrCat("needs 2 workers, 0 free; preempting ", low,
                         " (low), draining at the next step boundary"));
  // Ticks meanwhile drain nothing more (and nothing else is there).
  manager_.Tick();
  EXPECT_EQ(DrainSteps(w1).size(), 1u);

  DrainPoint(w1, low, 2);
  DrainPoint(w2, low, 2);
  EXPECT_THAT(DrainSteps(w1), ElementsAre(0, 2));
  Step(w1, low, 2, false);
  Step(w2, low, 2, true);
  Saved(w1, low, 2, {WriteStage(2, 0)});
  Saved(w2, low, 2, {WriteStage(2, 1)});
  EXPECT_TRUE(Committed(2));
  Drained(w1, low, 2);
  EXPECT_EQ(State(urgent->id()), v1::QUEUED);  // w2 still holds its rank.
  Drained(w2, low, 2);
  // The urgent job is placed at once on the freed workers.
  EXPECT_EQ(State(urgent->id()), v1::PLANNING);
  info = *manager_.GetJob(low);
  EXPECT_EQ(info.state(), v1::QUEUED);
  EXPECT_EQ(info.restarts(), 0);
  EXPECT_EQ(info.steps_done(), 2);
  EXPECT_THAT(observer_.log,
              testing::Contains("restarted " + low + " preempted"));
  // Still low: it preempts nothing back.
  EXPECT_EQ(info.queue_reason(),
            "needs 2 workers, 0 free; the others run jobs it cannot preempt "
            "(of equal or higher priority, or without checkpoint.dir)");
  EXPECT_EQ(Conn(w1).Of(v1::CoordinatorMessage::kLeave).size(), 0u);

  Ready(w1, urgent->id(), 5101);
  Ready(w2, urgent->id(), 5102);
  EXPECT_EQ(State(urgent->id()), v1::RUNNING);
  Ended(w1, urgent->id(), v1::SUCCEEDED);
  Ended(w2, urgent->id(), v1::SUCCEEDED);
  EXPECT_EQ(State(urgent->id()), v1::SUCCEEDED);
  // The low job resumes from the drained step on the freed workers.
  EXPECT_EQ(State(low), v1::PLANNING);
  EXPECT_EQ(LastProgram(w1).resume_step(), 2);
  EXPECT_EQ(LastProgram(w2).resume_step(), 2);
}

TEST_F(JobManagerDrainTest, OnlyStrictlyLowerJobsWithCheckpointsArePreempted) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  // A low job without checkpoint.dir: nothing to resume from, so it is
  // never preempted (that would lose its steps).
  const std::string low =
      StartJob(JobYaml(2, "mlp", 8) + "priority: low\n", w1, w2);
  absl::StatusOr<v1::Job> urgent =
      Submit(JobYaml(2, "urgent") + "priority: urgent\n");
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  EXPECT_TRUE(DrainSteps(w1).empty());
  EXPECT_EQ(manager_.GetJob(low)->preemptions(), 0);
  ASSERT_TRUE(manager_.CancelJob(urgent->id(), "").ok());
  ASSERT_TRUE(manager_.CancelJob(low, "").ok());
  Ended(w1, low, v1::CANCELLED);
  Ended(w2, low, v1::CANCELLED);

  // A normal job with checkpoints, and another normal job: equal priority
  // never preempts.
  const std::string normal = StartJob(CkptYaml("every: 4", "", 8), w1, w2);
  absl::StatusOr<v1::Job> other = Submit(JobYaml(2, "other"));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(DrainSteps(w1).empty());
  // Aging raises the waiting job's rank in the queue, never its right to
  // preempt: ten hours later nothing is drained.
  // (A first Tick, so that the second one's gap is the coordinator's
  // stall, not ten hours of silence from the workers.)
  manager_.Tick();
  now_ += std::chrono::hours(10);
  manager_.Tick();
  EXPECT_GT(manager_.GetJob(other->id())->effective_priority(), 600);
  EXPECT_TRUE(DrainSteps(w1).empty());
  EXPECT_EQ(manager_.GetJob(normal)->preemptions(), 0);
  EXPECT_EQ(State(normal), v1::RUNNING);
}

TEST_F(JobManagerDrainTest, APlanningJobIsPreemptedByRequeueingItAtOnce) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  absl::StatusOr<v1::Job> low = Submit(JobYaml(2) + "priority: low\n");
  ASSERT_TRUE(low.ok()) << low.status();
  ASSERT_EQ(State(low->id()), v1::PLANNING);
  absl::StatusOr<v1::Job> high = Submit(JobYaml(2, "h") + "priority: high\n");
  ASSERT_TRUE(high.ok()) << high.status();
  // Nothing of this attempt ran: its workers are told to stop, and it is
  // queued again behind the high job.
  EXPECT_FALSE(Conn(w1).Of(v1::CoordinatorMessage::kCancel).empty());
  EXPECT_EQ(State(low->id()), v1::QUEUED);
  EXPECT_EQ(State(high->id()), v1::QUEUED);
  EXPECT_EQ(manager_.GetJob(high->id())->queue_reason(),
            "needs 2 workers, 0 free; 2 more finishing");
  Ended(w1, low->id(), v1::CANCELLED);
  Ended(w2, low->id(), v1::CANCELLED);
  EXPECT_EQ(State(high->id()), v1::PLANNING);
  EXPECT_EQ(manager_.GetJob(low->id())->queue_position(), 1);
  EXPECT_EQ(manager_.GetJob(low->id())->restarts(), 0);
}

TEST_F(JobManagerDrainTest, TheFewestLowestJobsArePreempted) {
  const std::string a1 = AddWorker("a1"), a2 = AddWorker("a2");
  const std::string b1 = AddWorker("b1"), b2 = AddWorker("b2");
  auto with_dir = [&](const std::string& sub, const std::string& extra) {
    return absl::StrCat(JobYaml(2, sub, 8), "checkpoint: {dir: ", dir_, "/",
                        sub, ", every: 4}\n", extra);
  };
  const std::string normal =
      StartJob(with_dir("n", "priority: normal\n"), a1, a2);
  const std::string low = StartJob(with_dir("l", "priority: low\n"), b1, b2);
  absl::StatusOr<v1::Job> urgent =
      Submit(JobYaml(2, "urgent") + "priority: urgent\n");
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  // Two workers are enough: the low job's, not the normal one's.
  EXPECT_EQ(DrainSteps(b1).size(), 1u);
  EXPECT_TRUE(DrainSteps(a1).empty());
  EXPECT_EQ(manager_.GetJob(low)->preemptions(), 1);
  EXPECT_EQ(manager_.GetJob(normal)->preemptions(), 0);
}

TEST_F(JobManagerTest, RestoredJobsKeepTheirPriorityOwnerAndOrder) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  StartTwoStageJob(w1, w2);
  absl::StatusOr<v1::Job> normal = Submit(JobYaml(2, "normal"));
  absl::StatusOr<v1::Job> high =
      Submit(JobYaml(2, "high") + "priority: high\nowner: team-a\n");
  ASSERT_TRUE(normal.ok() && high.ok());
  EXPECT_EQ(manager_.GetJob(high->id())->queue_position(), 1);
  manager_.Tick();
  absl::StatusOr<std::optional<v1::CoordinatorState>> saved =
      state_file_->Load();
  ASSERT_TRUE(saved.ok() && saved->has_value());
  // As a record written before the fields existed: they come back from
  // the job file, not as priority 0 (low).
  for (v1::JobRecordState& job : *(*saved)->mutable_jobs()) {
    job.mutable_info()->clear_priority();
    job.mutable_info()->clear_owner();
  }
  RecordingObserver observer;
  JobManager restored(Options(&observer));
  ASSERT_TRUE(restored.Restore(**saved).ok());
  const v1::Job h = *restored.GetJob(high->id());
  EXPECT_EQ(h.priority(), 200);
  EXPECT_EQ(h.owner(), "team-a");
  EXPECT_EQ(h.queue_position(), 1);
  EXPECT_EQ(restored.GetJob(normal->id())->priority(), 100);
  EXPECT_EQ(restored.GetJob(normal->id())->queue_position(), 2);
}

TEST_F(JobManagerCheckpointTest, ADeregisteredWorkerIsForgottenAndItsJobFails) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string job = StartJob(JobYaml(2), w1, w2);
  v1::WorkerMessage bye;
  bye.mutable_deregister()->set_reason("the worker is shutting down");
  Send(w2, bye);
  EXPECT_EQ(State(job), v1::FAILED);
  EXPECT_THAT(manager_.GetJob(job)->message(),
              HasSubstr("deregistered (the worker is shutting down)"));
  EXPECT_EQ(WorkerState(w2), v1::WORKER_STATE_UNSPECIFIED);  // Not listed.
  EXPECT_TRUE(Conn(w2).closed);
}

}  // namespace
}  // namespace conveyor::coordinator

namespace conveyor::coordinator {
namespace {

// A coordinator restart: a new manager restores what the old one saved.
TEST_F(JobManagerCheckpointTest, JobRecordsSurviveACoordinatorRestart) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string w3 = AddWorker("c"), w4 = AddWorker("d");
  // Running with a committed step and a restart policy: restarts.
  const std::string restarting =
      StartJob(CkptYaml("every: 1", "restart: {max_restarts: 1}\n", 4), w1, w2);
  StepWithCheckpoint(w1, w2, restarting, 1);
  Step(w1, restarting, 2, false);
  // Running without a restart policy: fails, saying why.
  absl::StatusOr<v1::Job> failing = Submit(JobYaml(2, "plain", 5));
  ASSERT_TRUE(failing.ok()) << failing.status();
  Ready(w3, failing->id(), 5003);
  Ready(w4, failing->id(), 5004);
  Step(w3, failing->id(), 1, false);
  Step(w4, failing->id(), 1, true);
  // Queued: queues again, in order; cancelled: stays so.
  absl::StatusOr<v1::Job> queued = Submit(JobYaml(2, "waiting"));
  absl::StatusOr<v1::Job> cancelled = Submit(JobYaml(2, "cancelled"));
  ASSERT_TRUE(queued.ok() && cancelled.ok());
  ASSERT_TRUE(manager_.CancelJob(cancelled->id(), "by test").ok());
  manager_.Tick();  // Writes what changed since the last write.

  absl::StatusOr<std::optional<v1::CoordinatorState>> saved =
      state_file_->Load();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(saved->has_value());
  // Step 2 is committed after that record was read: a coordinator that died
  // between the manifest and the record. Restore finds it on disk.
  Step(w2, restarting, 2, true);
  Saved(w1, restarting, 2, {WriteStage(2, 0)});
  Saved(w2, restarting, 2, {WriteStage(2, 1)});
  ASSERT_TRUE(Committed(2));
  RecordingObserver observer;
  JobManager restored(Options(&observer));
  ASSERT_TRUE(restored.Restore(**saved).ok());

  v1::Job job = *restored.GetJob(restarting);
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.queue_position(), 1);
  EXPECT_EQ(job.restarts(), 1);
  EXPECT_THAT(job.last_restart_reason(),
              HasSubstr("coordinator restarted while the job was RUNNING"));
  // (The record said step 1; the message reports what the record said.)
  EXPECT_EQ(job.steps_done(), 2);
  EXPECT_EQ(job.resumed_from_step(), 2);
  EXPECT_EQ(job.last_checkpoint_step(), 2);
  job = *restored.GetJob(failing->id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.message(), HasSubstr("coordinator restarted while the job "
                                       "was RUNNING (step 1)"));
  EXPECT_THAT(job.message(), HasSubstr("committed no checkpoint"));
  job = *restored.GetJob(queued->id());
  EXPECT_EQ(job.state(), v1::QUEUED);
  EXPECT_EQ(job.queue_position(), 2);
  EXPECT_EQ(restored.GetJob(cancelled->id())->state(), v1::CANCELLED);
  EXPECT_EQ(restored.GetJob(cancelled->id())->message(), "by test");
  EXPECT_THAT(observer.log, testing::Contains("restarted " + restarting +
                                              " coordinator_restarted"));

  // Ids go on where they stopped; the restarted job still holds its
  // checkpoint directory; it resumes from step 1 on the first workers.
  auto add = [&](const std::string& name) {
    auto conn = std::make_shared<FakeConnection>();
    v1::RegisterRequest r;
    r.set_protocol_version(proto::kProtocolVersion);
    r.set_version(kVersion);
    r.set_name(name);
    r.add_devices("cpu:1");
    r.set_data_address("127.0.0.1:0");
    EXPECT_TRUE(restored.RegisterWorker(r, conn).ok());
    return conn;
  };
  std::shared_ptr<FakeConnection> c1 = add("a"), c2 = add("b");
  EXPECT_EQ(restored.GetJob(restarting)->state(), v1::PLANNING);
  auto prepares = c2->Of(v1::CoordinatorMessage::kPrepare);
  ASSERT_EQ(prepares.size(), 1u);
  EXPECT_EQ(prepares[0].prepare().program().job_id(), restarting);
  EXPECT_EQ(prepares[0].prepare().program().resume_step(), 2);
  v1::SubmitJobRequest request;
  request.set_yaml(CkptYaml("every: 1"));
  request.set_file_name("job.yaml");
  EXPECT_EQ(restored.SubmitJob(request).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Holds a newer step.
  request.set_yaml(CkptYaml("every: 1", "resume: latest\n", 4));
  EXPECT_THAT(std::string(restored.SubmitJob(request).status().message()),
              HasSubstr("is in use by " + restarting));
  request.set_yaml(JobYaml(2, "after"));
  absl::StatusOr<v1::Job> after = restored.SubmitJob(request);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->id(), "job-5");
}

// The coordinator loads a job's YAML once (job::ParseJob) and plans every
// attempt from what it parsed: a restart and an elastic relayout load it no
// more; a restored coordinator (another process) loads it once again.
TEST_F(JobManagerCheckpointTest, AJobFileIsLoadedOncePerProcess) {
  const std::string yaml = CkptYaml(
      "every: 1", "restart: {max_restarts: 3, elastic: {min_workers: 1}}\n", 4);
  TEST_CountYamlLoads(true);
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string spare = AddWorker("spare");
  const std::string job = StartJob(yaml, w1, w2);
  StepWithCheckpoint(w1, w2, job, 1);
  ASSERT_TRUE(Committed(1));
  // A restart on the spare, then an elastic relayout onto w1 alone.
  manager_.WorkerDisconnected(w2, "control connection closed");
  ASSERT_EQ(State(job), v1::QUEUED);
  Ended(w1, job, v1::CANCELLED);
  ASSERT_EQ(State(job), v1::PLANNING);
  manager_.WorkerDisconnected(spare, "control connection closed");
  ASSERT_EQ(State(job), v1::QUEUED);
  Ended(w1, job, v1::CANCELLED);
  v1::Job info = *manager_.GetJob(job);
  ASSERT_EQ(info.state(), v1::PLANNING) << info.message();
  EXPECT_THAT(info.worker_ids(), ElementsAre(w1));
  EXPECT_EQ(info.restarts(), 2);
  EXPECT_EQ(TEST_YamlLoadsOf(yaml), 1);

  manager_.Tick();  // Writes the records.
  absl::StatusOr<std::optional<v1::CoordinatorState>> saved =
      state_file_->Load();
  ASSERT_TRUE(saved.ok() && saved->has_value());
  TEST_CountYamlLoads(true);  // A new process, as far as counting goes.
  JobManager restored(Options(nullptr));
  ASSERT_TRUE(restored.Restore(**saved).ok());
  info = *restored.GetJob(job);
  EXPECT_EQ(info.state(), v1::QUEUED) << info.message();
  EXPECT_EQ(info.resumed_from_step(), 1);
  EXPECT_EQ(TEST_YamlLoadsOf(yaml), 1);
  TEST_CountYamlLoads(false);
}

TEST_F(JobManagerCheckpointTest, RestoreRefusesContradictoryRecords) {
  v1::CoordinatorState state;
  state.add_jobs()->mutable_info()->set_id("job-3");
  state.add_jobs()->mutable_info()->set_id("job-3");
  RecordingObserver observer;
  JobManager restored(Options(&observer));
  absl::Status s = restored.Restore(state);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("job-3"));
  EXPECT_TRUE(restored.ListJobs().empty());
  state.mutable_jobs(1)->mutable_info()->set_id("worker-3");
  EXPECT_THAT(restored.Restore(state).message(), HasSubstr("not job-<n>"));
  // Only before anything else happens.
  AddWorker("a");
  EXPECT_EQ(manager_.Restore(v1::CoordinatorState()).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace conveyor::coordinator

namespace conveyor::coordinator {
namespace {

// A write holds the records that changed, not all of them: one job's
// committed checkpoint appends that job's record to the journal, however
// many jobs the file holds; steps alone write nothing.
TEST_F(JobManagerCheckpointTest, AWriteAppendsOnlyTheRecordsThatChanged) {
  const std::string w1 = AddWorker("a"), w2 = AddWorker("b");
  const std::string running = StartJob(CkptYaml("every: 2", "", 5), w1, w2);
  std::vector<uint64_t> queued;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<v1::Job> job = Submit(JobYaml(2, absl::StrCat("q", i)));
    ASSERT_TRUE(job.ok()) << job.status();
    queued.push_back(i + 2);  // job-2 onwards.
    EXPECT_EQ(job->id(), absl::StrCat("job-", i + 2));
  }
  const StateFile::Stats before = state_file_->stats();
  Step(w1, running, 1, false);
  Step(w2, running, 1, true);
  EXPECT_EQ(state_file_->stats().bytes, before.bytes);  // Not worth a write.
  StepWithCheckpoint(w1, w2, running, 2);
  ASSERT_TRUE(Committed(2));
  const StateFile::Stats after = state_file_->stats();
  EXPECT_EQ(after.compactions, before.compactions);
  EXPECT_EQ(after.appends, before.appends + 1);
  absl::StatusOr<std::optional<v1::CoordinatorState>> saved =
      state_file_->Load();
  ASSERT_TRUE(saved.ok() && saved->has_value()) << saved.status();
  // What rewriting every record would have cost.
  const uint64_t all = EncodeState(**saved).size();
  EXPECT_LT((after.bytes - before.bytes) * 8, all)
      << "one record of " << after.bytes - before.bytes << " bytes; all "
      << all;
  EXPECT_EQ((*saved)->jobs_size(), 21);
  EXPECT_THAT((*saved)->queue(), ::testing::ElementsAreArray(queued));
  for (const v1::JobRecordState& record : (*saved)->jobs()) {
    if (record.info().id() != running) continue;
    EXPECT_EQ(record.info().last_checkpoint_step(), 2);
    EXPECT_EQ(record.info().steps_done(), 2);
    EXPECT_EQ(record.committed().step(), 2);
  }
}

}  // namespace
}  // namespace conveyor::coordinator
