// The fleet simulator's StateFileWatcher against a real StateFile: every
// journal record it counts is one the file appended (with its frame's
// bytes), and every new snapshot a compaction.
#include "bench/fleet_probe.h"

#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "conveyor/v1/conveyor.pb.h"
#include "coordinator/state_file.h"
#include "coordinator/state_journal.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace conveyor::bench {
namespace {

using coordinator::StateFile;

v1::CoordinatorState OneJob(uint64_t job, int64_t steps) {
  v1::CoordinatorState state;
  state.set_next_job(job + 1);
  v1::JobRecordState* record = state.add_jobs();
  record->mutable_info()->set_id(absl::StrCat("job-", job));
  record->mutable_info()->set_state(v1::RUNNING);
  record->mutable_info()->set_steps_done(steps);
  // Records of different sizes, so that a frame read at the wrong length
  // would miscount the bytes.
  record->mutable_request()->set_yaml(
      absl::StrCat("name: job", job, "\n", std::string(job * 37 % 500, '#')));
  return state;
}

// Waits (bounded) until the watcher's poll has seen `appends` records.
StateFileWatcher::Seen SeenOnce(const StateFileWatcher& watcher,
                                int64_t appends) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (watcher.seen().appends < appends &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // One more poll, for anything counted wrongly beyond `appends`.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return watcher.seen();
}

TEST(StateFileWatcherTest, CountsEveryAppendAndCompaction) {
  const std::string path =
      (testing_util::FreshTestDir("fleet_probe") / "state.pb").string();
  // A small journal bound, so that the writes below compact several times.
  auto file =
      StateFile::Open(path, {.compact_ratio = 1, .min_journal_bytes = 4096});
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Save(v1::CoordinatorState()).ok());
  const StateFile::Stats before = (*file)->stats();
  StateFileWatcher watcher(path);
  int64_t frames = 0;  // Of the records appended (not compacted).
  for (uint64_t i = 1; i <= 60; ++i) {
    const v1::CoordinatorState changed = OneJob(i % 7 + 1, i);
    const StateFile::Stats was = (*file)->stats();
    ASSERT_TRUE((*file)->Append(changed, {}).ok());
    if ((*file)->stats().appends > was.appends) {
      frames += static_cast<int64_t>((*file)->stats().bytes - was.bytes);
    }
    // Bursts of appends with no wait: the watcher reads them from the
    // journal whatever their number. A compaction is seen as a new
    // snapshot inode, so two need a poll between them.
    if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const StateFile::Stats after = (*file)->stats();
  const StateFileWatcher::Seen seen =
      SeenOnce(watcher, static_cast<int64_t>(after.appends - before.appends));
  ASSERT_GT(after.compactions - before.compactions, 1u);
  EXPECT_EQ(seen.appends, static_cast<int64_t>(after.appends - before.appends));
  EXPECT_EQ(seen.appended_bytes, frames);
  EXPECT_EQ(seen.compactions,
            static_cast<int64_t>(after.compactions - before.compactions));
  // Each compaction wrote a snapshot and a journal header; the rest of the
  // file's bytes are the appended frames.
  EXPECT_EQ(seen.compacted_bytes +
                seen.compactions *
                    static_cast<int64_t>(coordinator::kJournalHeaderBytes),
            static_cast<int64_t>(after.bytes - before.bytes) - frames);
}

TEST(StateFileWatcherTest, NoFilesNoCounts) {
  const std::string path =
      (testing_util::FreshTestDir("fleet_probe") / "state.pb").string();
  StateFileWatcher watcher(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const StateFileWatcher::Seen seen = watcher.seen();
  EXPECT_EQ(seen.appends, 0);
  EXPECT_EQ(seen.compactions, 0);
  EXPECT_EQ(seen.snapshot_size, 0);
}

}  // namespace
}  // namespace conveyor::bench
