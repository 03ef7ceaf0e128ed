#include "coordinator/job_store.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/coordinator/fake_job_run_context.h"

namespace conveyor::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::filesystem::path TestPath() {
  return std::filesystem::path(::testing::TempDir()) /
         absl::StrCat(
             "job_store_", getpid(), "_",
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

TEST(JobStoreTest, ASnapshotOfTheRecordsRoundTripsThroughRestore) {
  FakeJobRunContext context;
  std::map<uint64_t, JobRun> jobs;
  JobQueue queue;
  JobRun& ended = context.AddJob(jobs, 1, JobYaml(2, "done"));
  ended.job().info.set_state(v1::SUCCEEDED);
  ended.job().info.set_ended_unix_ms(1000);
  JobRun& running = context.AddJob(jobs, 2, JobYaml(2, "running"));
  running.job().info.set_state(v1::RUNNING);
  running.job().info.add_worker_ids("worker-1");
  running.job().info.add_worker_ids("worker-2");
  running.job().attempt = 3;
  running.job().relayout_ranks = 1;
  checkpoint::ResumePoint committed;
  committed.step = 7;
  committed.step_dir = "/ckpt/step-7";
  running.job().committed = committed;
  context.AddJob(jobs, 4, JobYaml(1, "later"));
  context.AddJob(jobs, 5, JobYaml(1, "sooner"));
  queue.Add(5);
  queue.Add(4);

  const v1::CoordinatorState state =
      JobStore::Snapshot(kVersion, 6, jobs, queue);
  EXPECT_EQ(state.version(), kVersion);
  EXPECT_EQ(state.next_job(), 6);
  EXPECT_THAT(state.queue(), ElementsAre(5, 4));

  FakeJobRunContext restored_context;
  std::map<uint64_t, JobRun> restored_jobs;
  absl::StatusOr<JobStore::Restored> restored =
      JobStore::Restore(state, restored_context, restored_jobs);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->next_job, 6u);
  EXPECT_THAT(restored->ended, ElementsAre(1u));
  EXPECT_THAT(restored->interrupted, ElementsAre(2u));
  EXPECT_THAT(restored->queued, ElementsAre(5u, 4u));
  EXPECT_THAT(restored->unparsed, IsEmpty());
  ASSERT_EQ(restored_jobs.size(), 4u);
  for (const auto& [number, run] : jobs) {
    const JobRun::JobRecord& before = run.job();
    const JobRun::JobRecord& after = restored_jobs.at(number).job();
    EXPECT_EQ(after.number, number);
    EXPECT_EQ(after.info.SerializeAsString(), before.info.SerializeAsString());
    EXPECT_EQ(after.parsed.config_hash, before.parsed.config_hash);
    EXPECT_EQ(after.attempt, before.attempt);
    EXPECT_EQ(after.relayout_ranks, before.relayout_ranks);
    // Not ended: parsed again from the saved file; ended: only names kept.
    EXPECT_EQ(after.parsed.yaml, number == 1 ? "" : before.parsed.yaml);
    EXPECT_EQ(after.parsed.spec.name, number == 1 ? "" : before.plan.job.name);
  }
  const JobRun::JobRecord& after = restored_jobs.at(2).job();
  ASSERT_TRUE(after.committed.has_value());
  EXPECT_EQ(after.committed->step, 7);
  EXPECT_EQ(after.committed->step_dir, "/ckpt/step-7");
  // No worker of the new coordinator has heard of it.
  EXPECT_TRUE(after.ranks.all_ended());
  EXPECT_FALSE(after.secret.empty());
}

TEST(JobStoreTest, RestoreRefusesContradictoryRecordsAndKeepsNone) {
  FakeJobRunContext context;
  std::map<uint64_t, JobRun> jobs;
  v1::CoordinatorState state;
  state.add_jobs()->mutable_info()->set_id("job-1");
  state.add_jobs()->mutable_info()->set_id("job-1");
  absl::StatusOr<JobStore::Restored> restored =
      JobStore::Restore(state, context, jobs);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("'job-1'"));
  EXPECT_TRUE(jobs.empty());

  state.Clear();
  state.add_jobs()->mutable_info()->set_id("task-1");
  restored = JobStore::Restore(state, context, jobs);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("is not job-<n>"));
}

TEST(JobStoreTest, AWriteFailureIsReportedUntilTheNextWriteSucceeds) {
  const std::filesystem::path path = TestPath();
  std::filesystem::remove_all(path);
  absl::StatusOr<std::unique_ptr<StateFile>> file =
      StateFile::Open(path.string());
  ASSERT_TRUE(file.ok()) << file.status();
  JobStore store(file->get());
  v1::CoordinatorState state;
  state.set_next_job(2);
  auto snapshot = [&](uint64_t change) {
    return [&, change](uint64_t, bool) -> std::optional<JobStore::Snapshotted> {
      return JobStore::Snapshotted{.change = change, .state = state};
    };
  };

  std::filesystem::create_directory(path);  // The rename onto it fails.
  EXPECT_FALSE(store.Persist(snapshot(1)).ok());
  EXPECT_THAT(store.StateFileError(), HasSubstr(path.string()));
  EXPECT_FALSE(store.PersistedThrough(1));
  EXPECT_FALSE(store.Save(state).ok());  // A write ahead fails the same way.

  std::filesystem::remove(path);
  ASSERT_TRUE(store.Persist(snapshot(1)).ok());
  EXPECT_EQ(store.StateFileError(), "");
  EXPECT_TRUE(store.PersistedThrough(1));
  EXPECT_FALSE(store.PersistedThrough(2));
  absl::StatusOr<std::optional<v1::CoordinatorState>> loaded = (*file)->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->next_job(), 2);
}

TEST(JobStoreTest, PersistWritesOnlyRecordsThatChanged) {
  const std::filesystem::path path = TestPath();
  std::filesystem::remove_all(path);
  absl::StatusOr<std::unique_ptr<StateFile>> file =
      StateFile::Open(path.string());
  ASSERT_TRUE(file.ok()) << file.status();
  JobStore store(file->get());
  std::vector<uint64_t> asked;
  auto unchanged = [&](uint64_t persisted,
                       bool) -> std::optional<JobStore::Snapshotted> {
    asked.push_back(persisted);
    return std::nullopt;
  };
  EXPECT_TRUE(store.Persist(unchanged).ok());
  EXPECT_FALSE(std::filesystem::exists(path));  // Nothing written.
  EXPECT_TRUE(
      store
          .Persist([](uint64_t, bool) -> std::optional<JobStore::Snapshotted> {
            return JobStore::Snapshotted{.change = 3, .state = {}};
          })
          .ok());
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(store.Persist(unchanged).ok());
  // Each call is told the newest change written.
  EXPECT_THAT(asked, ElementsAre(0u, 3u));
}

TEST(JobStoreTest, ChangesHoldOnlyTheChangedRecordsAndTheForgottenOnes) {
  FakeJobRunContext context;
  std::map<uint64_t, JobRun> jobs;
  JobQueue queue;
  for (uint64_t number : {1, 2, 3}) {
    context.AddJob(jobs, number, JobYaml(1, absl::StrCat("job", number)));
  }
  queue.Add(3);
  queue.Add(1);
  jobs.at(2).job().info.set_state(v1::RUNNING);
  std::vector<uint64_t> removed;
  const v1::CoordinatorState changes =
      JobStore::Changes(kVersion, 10, jobs, queue, {2, 9}, &removed);
  EXPECT_EQ(changes.version(), kVersion);
  EXPECT_EQ(changes.next_job(), 10u);
  ASSERT_EQ(changes.jobs_size(), 1);
  // The same record a full snapshot holds.
  EXPECT_EQ(changes.jobs(0).SerializeAsString(),
            JobStore::Snapshot(kVersion, 10, jobs, queue)
                .jobs(1)
                .SerializeAsString());
  EXPECT_THAT(changes.queue(), ElementsAre(3, 1));  // Always all of it.
  EXPECT_THAT(removed, ElementsAre(9u));
}

TEST(JobStoreTest, PersistAppendsChangesAndAfterAFailureAsksForAll) {
  const std::filesystem::path path = TestPath();
  std::filesystem::remove_all(path);
  std::filesystem::remove_all(path.string() + ".journal");
  absl::StatusOr<std::unique_ptr<StateFile>> file =
      StateFile::Open(path.string());
  ASSERT_TRUE(file.ok()) << file.status();
  JobStore store(file->get());
  std::vector<bool> asked_full;
  auto write = [&](uint64_t change, bool full, uint64_t job) {
    return [&, change, full, job](
               uint64_t, bool all) -> std::optional<JobStore::Snapshotted> {
      asked_full.push_back(all);
      JobStore::Snapshotted out{.change = change, .full = full || all};
      out.state.set_next_job(job + 1);
      v1::JobRecordState* record = out.state.add_jobs();
      record->mutable_info()->set_id(absl::StrCat("job-", job));
      record->mutable_info()->set_state(v1::QUEUED);
      if (out.full) {  // Every record: this test's jobs are 1 to `job`.
        out.state.clear_jobs();
        for (uint64_t n = 1; n <= job; ++n) {
          out.state.add_jobs()->mutable_info()->set_id(absl::StrCat("job-", n));
        }
      }
      return out;
    };
  };
  ASSERT_TRUE(store.Persist(write(1, true, 1)).ok());
  ASSERT_TRUE(store.Persist(write(2, false, 2)).ok());
  EXPECT_EQ((*file)->stats().appends, 1u);
  EXPECT_EQ((*file)->stats().compactions, 1u);

  std::filesystem::remove(path);
  std::filesystem::create_directory(path);  // The snapshot cannot be written.
  EXPECT_FALSE(store.Persist(write(3, false, 3)).ok());
  EXPECT_FALSE(store.PersistedThrough(3));
  EXPECT_THAT(store.StateFileError(), HasSubstr(path.string()));
  std::filesystem::remove(path);
  // A delta written now would miss job 3's record: all are asked for.
  ASSERT_TRUE(store.Persist(write(4, false, 4)).ok());
  EXPECT_TRUE(store.PersistedThrough(4));
  EXPECT_EQ(store.StateFileError(), "");
  ASSERT_TRUE(store.Persist(write(5, false, 5)).ok());
  EXPECT_THAT(asked_full, ElementsAre(false, false, false, true, false));
  absl::StatusOr<std::optional<v1::CoordinatorState>> loaded = (*file)->Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  EXPECT_EQ((*loaded)->jobs_size(), 5);
  EXPECT_EQ((*loaded)->next_job(), 6u);

  // A failed write ahead asks for all too.
  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  v1::CoordinatorState ahead;
  ahead.add_jobs()->mutable_info()->set_id("job-1");
  EXPECT_FALSE(store.SaveAhead(ahead).ok());
  std::filesystem::remove(path);
  ASSERT_TRUE(store.Persist(write(6, false, 6)).ok());
  EXPECT_TRUE(asked_full.back());
}

TEST(JobStoreTest, WithoutAStateFileNothingIsWrittenAndAllIsDurable) {
  JobStore store(nullptr);
  bool asked = false;
  EXPECT_TRUE(
      store
          .Persist([&](uint64_t, bool) -> std::optional<JobStore::Snapshotted> {
            asked = true;
            return std::nullopt;
          })
          .ok());
  EXPECT_FALSE(asked);
  EXPECT_TRUE(store.Save(v1::CoordinatorState()).ok());
  EXPECT_TRUE(store.SaveAhead(v1::CoordinatorState()).ok());
  EXPECT_TRUE(store.PersistedThrough(1000));
  EXPECT_EQ(store.StateFileError(), "");
}

}  // namespace
}  // namespace conveyor::coordinator
