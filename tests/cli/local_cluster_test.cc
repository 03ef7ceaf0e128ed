#include "cli/local_cluster.h"

#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/coordinator_client.h"
#include "cli/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / "local_cluster_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // The cluster's log directory goes under TMPDIR.
    setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("TMPDIR");
    unsetenv("CONVEYOR_FAKE_COORDINATOR_EXIT");
    unsetenv("CONVEYOR_FAKE_WORKER_EXIT");
  }

  std::string Script(const std::string& name, const std::string& body) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    fs::permissions(path, fs::perms::owner_all);
    return path.string();
  }

  // A coordinator that honours the ready-file contract ($4 is the file)
  // and then idles; `exec` so SIGTERM reaches the sleeping process.
  std::string ReadyCoordinator() {
    return Script("coordinator",
                  "echo \"args: $*\"\n"
                  "printf '127.0.0.1:4321\\n' > \"$4.tmp\" && mv \"$4.tmp\" "
                  "\"$4\"\nexec sleep 60");
  }

  fs::path dir_;
};

TEST(SubprocessTest, RunsWithOutputInTheLog) {
  const std::string log = ::testing::TempDir() + "/subprocess_echo.log";
  fs::remove(log);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
      {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, log);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->name(), "sh");
  ASSERT_TRUE((*p)->WaitFor(absl::Seconds(10)));
  EXPECT_EQ((*p)->Poll(), "exited with status 3");
  EXPECT_EQ(TailFile(log, 5), "  out\n  err");
  EXPECT_EQ(TailFile(log, 1), "  err");
}

TEST(SubprocessTest, MissingBinaryFailsAtSpawn) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
      {"/nonexistent/conveyor-worker"}, ::testing::TempDir() + "/missing.log");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("/nonexistent/conveyor-worker"));
}

TEST(SubprocessTest, ChildStartsWithSignalsUnblockedAndDefault) {
  // Block SIGTERM here, as run does, and check that the child still dies
  // of it.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
      {"/bin/sleep", "60"}, ::testing::TempDir() + "/sleep.log");
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE((*p)->Poll().has_value());
  (*p)->Signal(SIGTERM);
  ASSERT_TRUE((*p)->WaitFor(absl::Seconds(10)));
  EXPECT_THAT(*(*p)->Poll(), StartsWith("killed by signal 15"));
}

TEST(SubprocessTest, DestructorKillsARunningChild) {
  pid_t pid = 0;
  {
    absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Spawn(
        {"/bin/sleep", "60"}, ::testing::TempDir() + "/sleep2.log");
    ASSERT_TRUE(p.ok());
    pid = (*p)->pid();
  }
  EXPECT_NE(kill(pid, 0), 0);  // Reaped: no such process.
}

TEST(TailFileTest, HandlesMissingAndEmptyFiles) {
  EXPECT_THAT(TailFile("/nonexistent/log", 3), StartsWith("  (cannot read"));
  const std::string empty = ::testing::TempDir() + "/empty.log";
  std::ofstream(empty).flush();
  EXPECT_EQ(TailFile(empty, 3), "  (empty)");
}

TEST_F(LocalClusterTest, FindDaemonBinarySearchesInOrder) {
  const std::string bin = (dir_ / "bin").string();
  const std::string self = (dir_ / "self").string();
  const std::string path1 = (dir_ / "p1").string();
  for (const std::string& d : {bin, self, path1}) fs::create_directories(d);
  std::ofstream(fs::path(path1) / "conveyor-worker") << "#!/bin/sh\n";
  fs::permissions(fs::path(path1) / "conveyor-worker", fs::perms::owner_all);

  BinarySearch search{.bin_dir = "",
                      .self_dir = self,
                      .path = absl::StrCat("/nonexistent:", path1)};
  EXPECT_EQ(FindDaemonBinary("conveyor-worker", search).value_or(""),
            (fs::path(path1) / "conveyor-worker").string());
  fs::copy_file(fs::path(path1) / "conveyor-worker",
                fs::path(self) / "conveyor-worker");
  EXPECT_EQ(FindDaemonBinary("conveyor-worker", search).value_or(""),
            (fs::path(self) / "conveyor-worker").string());
  // An explicit directory is the only place looked at.
  search.bin_dir = bin;
  absl::StatusOr<std::string> found =
      FindDaemonBinary("conveyor-worker", search);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(), HasSubstr("$CONVEYOR_BIN_DIR"));
  search.bin_dir.clear();
  absl::StatusOr<std::string> none =
      FindDaemonBinary("conveyor-coordinator", search);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(),
              HasSubstr(absl::StrCat("looked in ", self, " and $PATH")));
}

TEST_F(LocalClusterTest, StartsByTheReadyFileContractAndStops) {
  LocalClusterOptions options;
  options.num_workers = 2;
  options.coordinator_binary = ReadyCoordinator();
  options.worker_binary = Script("worker", "echo \"args: $*\"\nexec sleep 60");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ((*cluster)->coordinator_address(), "127.0.0.1:4321");
  EXPECT_TRUE((*cluster)->CheckDaemons().ok());
  const std::string logs = (*cluster)->log_dir();
  EXPECT_THAT(logs, StartsWith((dir_ / "conveyorctl-").string()));
  ASSERT_EQ((*cluster)->LogPaths().size(), 3u);
  // Let the scripts print their arguments before they are stopped.
  for (const std::string& log : (*cluster)->LogPaths()) {
    for (int i = 0; i < 500 && fs::file_size(log) == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  (*cluster)->Stop();
  EXPECT_THAT(TailFile(logs + "/coordinator.log", 1),
              HasSubstr("args: --listen 127.0.0.1:0 --ready-file " + logs +
                        "/coordinator.addr --heartbeat-timeout 5"));
  EXPECT_THAT(TailFile(logs + "/worker-1.log", 1),
              HasSubstr("args: --coordinator 127.0.0.1:4321 --data-address "
                        "127.0.0.1:0 --name local-1"));
  (*cluster)->RemoveLogs();
  EXPECT_FALSE(fs::exists(logs));
}

TEST_F(LocalClusterTest, CoordinatorThatExitsFailsWithItsLog) {
  LocalClusterOptions options;
  options.coordinator_binary =
      Script("coordinator", "echo 'bind: address in use' >&2\nexit 1");
  options.worker_binary = "/bin/true";
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cluster.status().message(),
              HasSubstr("exited with status 1 before writing its address"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("bind: address in use"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("coordinator.log"));
}

TEST_F(LocalClusterTest, CoordinatorThatNeverGetsReadyTimesOut) {
  LocalClusterOptions options;
  options.coordinator_binary = Script("coordinator", "exec sleep 60");
  options.worker_binary = "/bin/true";
  options.ready_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(cluster.status().message(),
              HasSubstr("did not write its address"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // Stopped, not waited.
}

TEST_F(LocalClusterTest, InterruptStopsTheWait) {
  LocalClusterOptions options;
  options.coordinator_binary = Script("coordinator", "exec sleep 60");
  options.worker_binary = "/bin/true";
  options.interrupted = [] { return true; };
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kCancelled);
}

#ifdef CONVEYOR_FAKE_BIN_DIR
// With the fake daemons, which speak gRPC: the workers register and show up
// IDLE.
TEST_F(LocalClusterTest, WaitsForTheWorkersToRegister) {
  LocalClusterOptions options;
  options.num_workers = 3;
  options.coordinator_binary =
      std::string(CONVEYOR_FAKE_BIN_DIR) + "/conveyor-coordinator";
  options.worker_binary =
      std::string(CONVEYOR_FAKE_BIN_DIR) + "/conveyor-worker";
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Create((*cluster)->coordinator_address(),
                                absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*cluster)->WaitForWorkers(**client).ok());
  absl::StatusOr<std::vector<v1::Worker>> workers = (*client)->ListWorkers();
  ASSERT_TRUE(workers.ok());
  std::set<std::string> names;
  for (const v1::Worker& w : *workers) names.insert(w.name());
  EXPECT_THAT(names, ElementsAre("local-0", "local-1", "local-2"));
  const absl::Time start = absl::Now();
  (*cluster)->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // SIGTERM sufficed.
}

TEST_F(LocalClusterTest, WorkerThatExitsFailsTheWait) {
  setenv("CONVEYOR_FAKE_WORKER_EXIT", "1", 1);
  LocalClusterOptions options;
  options.num_workers = 2;
  options.coordinator_binary =
      std::string(CONVEYOR_FAKE_BIN_DIR) + "/conveyor-coordinator";
  options.worker_binary =
      std::string(CONVEYOR_FAKE_BIN_DIR) + "/conveyor-worker";
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
      CoordinatorClient::Create((*cluster)->coordinator_address(),
                                absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  absl::Status status = (*cluster)->WaitForWorkers(**client);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("conveyor-worker (pid"));
  EXPECT_THAT(status.message(), HasSubstr("exited with status 3"));
  EXPECT_THAT(status.message(), HasSubstr("exiting as asked"));
}
#endif

}  // namespace
}  // namespace conveyor::cli
