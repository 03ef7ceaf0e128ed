// CheckpointCommits: manifests written in the order queued, each followed by
// its pruning; a writer leaves what is queued meanwhile to the one already
// writing; Flush waits for the write in progress and writes the rest; a
// failed write is reported and does not stop the ones after it.
#include "coordinator/checkpoint_commits.h"

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_dir_test_base.h"

namespace conveyor::coordinator {
namespace {

class CheckpointCommitsTest : public checkpoint::CheckpointDirTest {
 protected:
  // Step `step`'s stage files, written as the ranks would, and the commit
  // of their manifest.
  CheckpointCommits::Commit CommitOf(int64_t step, int keep_latest = 0) {
    constexpr int kStages = 2;
    WriteStageFiles(step, kStages);
    CheckpointCommits::Commit c{
        .job_id = "job-1", .dir = ckpt_, .keep_latest = keep_latest};
    c.manifest.job = "mlp";
    c.manifest.job_id = "job-1";
    c.manifest.step = step;
    c.manifest.config_hash = "00000000deadbeef";
    c.manifest.num_stages = kStages;
    for (int s = 0; s < kStages; ++s) {
      c.manifest.stage_begin.push_back(2 * s);
      absl::StatusOr<checkpoint::StageFileDigest> d =
          checkpoint::DigestStageFile(StepDir(step), s);
      EXPECT_TRUE(d.ok()) << d.status();
      if (d.ok()) c.manifest.stages.push_back(*d);
    }
    c.manifest.created_unix_ms = 1000 + step;
    return c;
  }

  bool Complete(int64_t step) {
    return checkpoint::LoadCompleteCheckpoint(ckpt_, step, true).ok();
  }

  static std::vector<int64_t> StepsOf(
      const std::vector<CheckpointCommits::Written>& written) {
    std::vector<int64_t> steps;
    for (const auto& w : written) steps.push_back(w.step);
    return steps;
  }
};

TEST_F(CheckpointCommitsTest, WritesInOrderAndPrunesAfterEach) {
  CheckpointCommits commits;
  for (int64_t step = 1; step <= 4; ++step) {
    commits.Enqueue(CommitOf(step, /*keep_latest=*/2));
  }
  int after_each = 0;
  commits.WriteQueued([&] { ++after_each; });
  EXPECT_EQ(after_each, 4);
  const std::vector<CheckpointCommits::Written> written = commits.TakeWritten();
  EXPECT_EQ(StepsOf(written), (std::vector<int64_t>{1, 2, 3, 4}));
  for (const auto& w : written) {
    ASSERT_TRUE(w.status.ok()) << w.step << ": " << w.status;
    ASSERT_TRUE(w.point.has_value());
    EXPECT_EQ(w.point->step, w.step);
    EXPECT_EQ(w.point->stage_begin, (std::vector<int>{0, 2}));
  }
  EXPECT_EQ(Steps(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(Complete(4));
  EXPECT_TRUE(commits.TakeWritten().empty());
}

TEST_F(CheckpointCommitsTest, AFailedWriteIsReportedAndTheNextStillWritten) {
  CheckpointCommits commits;
  commits.Enqueue(CommitOf(1));
  CheckpointCommits::Commit gone = CommitOf(2);
  std::filesystem::remove_all(StepDir(2));  // Its directory vanished.
  commits.Enqueue(std::move(gone));
  commits.Enqueue(CommitOf(3));
  commits.WriteQueued([] {});
  const std::vector<CheckpointCommits::Written> written = commits.TakeWritten();
  ASSERT_EQ(StepsOf(written), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(written[0].status.ok());
  EXPECT_EQ(written[1].status.code(), absl::StatusCode::kNotFound)
      << written[1].status;
  EXPECT_FALSE(written[1].point.has_value());
  EXPECT_TRUE(written[2].status.ok());
  EXPECT_TRUE(Complete(3));
}

// A write held in its hook: another writer returns at once and leaves what
// it queued to the first, which writes it next; Flush waits for both.
TEST_F(CheckpointCommitsTest, OneWriterAtATimeAndFlushWaitsForIt) {
  CheckpointCommits commits;
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> let_go{false};
  CheckpointCommits::Commit first = CommitOf(1);
  first.before_write = [&](int64_t) {
    entered.set_value();
    released.wait();
  };
  commits.Enqueue(std::move(first));
  std::thread writer([&] { commits.WriteQueued([] {}); });
  entered.get_future().wait();

  commits.Enqueue(CommitOf(2));
  int second_writer_after_each = 0;
  commits.WriteQueued([&] { ++second_writer_after_each; });
  EXPECT_EQ(second_writer_after_each, 0);  // Returned without writing.
  EXPECT_FALSE(Complete(1));

  commits.Enqueue(CommitOf(3));
  std::atomic<bool> flushed{false};
  bool flushed_before_release = false;
  std::thread flusher([&] {
    commits.Flush();
    flushed_before_release = !let_go.load();
    flushed.store(true);
  });
  let_go.store(true);
  release.set_value();
  writer.join();
  flusher.join();
  EXPECT_FALSE(flushed_before_release);
  EXPECT_EQ(StepsOf(commits.TakeWritten()), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(Complete(1));
  EXPECT_TRUE(Complete(2));
  EXPECT_TRUE(Complete(3));
}

}  // namespace
}  // namespace conveyor::coordinator
