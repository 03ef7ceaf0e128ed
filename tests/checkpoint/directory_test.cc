#include "checkpoint/directory.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "checkpoint_dir_test_base.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_F(CheckpointDirTest, ListCheckpointStepsIgnoresOtherNames) {
  for (const char* name :
       {"step-10", "step-0", "step-5", "step-01", "step-x", "step-1.tmp",
        "step-", "step--1", "step-+3", "step-1e3", "step-99999999999999999999",
        "Step-4", "other"}) {
    fs::create_directories(dir_ / name);
  }
  WriteBytes(dir_ / "step-7", "a file, not a directory");
  EXPECT_THAT(Steps(), ElementsAre(0, 5, 10));

  absl::StatusOr<std::vector<int64_t>> missing =
      ListCheckpointSteps((dir_ / "nope").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no such checkpoint directory"));
  EXPECT_EQ(ListCheckpointSteps((dir_ / "step-7").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirTest, FindLatestSkipsNewerUncommittedSteps) {
  WriteCompleteStep(10);
  WriteCompleteStep(20);
  WriteStageFiles(30, 2);  // No manifest: a crash while saving.
  WriteStageFiles(40, 1);
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/true);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.step, 20);
  ASSERT_EQ(latest->skipped.size(), 2u);
  EXPECT_THAT(latest->skipped[0],
              HasSubstr("step 40 is incomplete: no manifest"));
  EXPECT_THAT(latest->skipped[1],
              HasSubstr("step 30 is incomplete: no manifest"));
}

// A committed step that fails its checks is not passed over: resuming from
// the step before it would redo the steps between and then overwrite it
// (it once did so without a word).
TEST_F(CheckpointDirTest, FindLatestRefusesADamagedCommittedStepNamingIt) {
  WriteCompleteStep(10);
  WriteCompleteStep(20);
  WriteCompleteStep(30);
  WriteStageFiles(40, 2);                    // Uncommitted: passed over.
  FlipByte(StageFilePath(ckpt_, 30, 1), 0);  // Corrupt.
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(),
              HasSubstr(StepDir(30) +
                        " is a committed checkpoint that fails its checks"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step-30/stage-1.safetensors: CRC-32C"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("the newest intact step before it is " + StepDir(20)));

  // Without checksums the flipped byte goes unseen.
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.step, 30);

  // Truncated, as a full disk or a bad copy leaves it: sizes catch it too.
  std::filesystem::resize_file(StageFilePath(ckpt_, 30, 0), 1);
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  // With no intact step left, it says so.
  fs::remove_all(StepDir(10));
  fs::remove_all(StepDir(20));
  latest = FindLatestCompleteCheckpoint(ckpt_, /*verify_checksums=*/false);
  EXPECT_THAT(latest.status().message(), HasSubstr("no older step is intact"));
}

TEST_F(CheckpointDirTest, FindLatestWithNothingCompleteSaysWhy) {
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(latest.status().message(),
              HasSubstr("no complete checkpoint (no step-<N> directories)"));

  WriteStageFiles(1, 2);
  WriteStageFiles(2, 1);
  latest = FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(latest.status().message(), HasSubstr("no complete checkpoint: "));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step 2 is incomplete: no manifest"));
  EXPECT_THAT(latest.status().message(),
              HasSubstr("step 1 is incomplete: no manifest"));

  // A committed step with a file missing is damaged, not incomplete.
  WriteCompleteStep(3);
  fs::remove(StageFilePath(ckpt_, 3, 0));
  latest = FindLatestCompleteCheckpoint(ckpt_, true);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(),
              HasSubstr("stage-0.safetensors: missing"));
  EXPECT_THAT(latest.status().message(), HasSubstr("no older step is intact"));

  EXPECT_EQ(FindLatestCompleteCheckpoint((dir_ / "nope").string(), true)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, PruneKeepsTheNewestCompleteSteps) {
  for (int64_t step : {1, 2, 3, 4, 5}) WriteCompleteStep(step);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 3));
  EXPECT_THAT(Steps(), ElementsAre(4, 5));
  // Idempotent.
  removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, IsEmpty());
}

TEST_F(CheckpointDirTest, PruneNeverRemovesTheNewestCompleteStep) {
  WriteCompleteStep(1);
  WriteCompleteStep(2);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1));
  EXPECT_THAT(Steps(), ElementsAre(2));
}

TEST_F(CheckpointDirTest, PruneLeavesNewerIncompleteStepsAndRemovesOlderOnes) {
  WriteStageFiles(1, 2);  // A crash's leftovers.
  WriteCompleteStep(2);
  WriteCompleteStep(3);
  FlipByte(StageFilePath(ckpt_, 3, 0), 0);  // Sizes still match: complete.
  WriteCompleteStep(4);
  fs::remove(StageFilePath(ckpt_, 4, 1));  // Damaged: incomplete.
  WriteCompleteStep(5);
  WriteStageFiles(6, 1);                    // Being written right now.
  fs::create_directories(StepDir(7));       // Just created.
  fs::create_directories(dir_ / "step-x");  // Not a step.
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 4));
  EXPECT_THAT(Steps(), ElementsAre(3, 5, 6, 7));
  EXPECT_TRUE(fs::exists(dir_ / "step-x"));
}

TEST_F(CheckpointDirTest, PruneRemovesNothingWithoutACompleteStep) {
  WriteStageFiles(1, 2);
  WriteStageFiles(2, 2);
  absl::StatusOr<std::vector<int64_t>> removed = PruneCheckpoints(ckpt_, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  EXPECT_THAT(Steps(), ElementsAre(1, 2));
}

TEST_F(CheckpointDirTest, PruneWithKeepZeroRemovesNothing) {
  WriteStageFiles(1, 2);
  for (int64_t step : {2, 3, 4}) WriteCompleteStep(step);
  for (int keep : {0, -1}) {
    absl::StatusOr<std::vector<int64_t>> removed =
        PruneCheckpoints(ckpt_, keep);
    ASSERT_TRUE(removed.ok()) << removed.status();
    EXPECT_THAT(*removed, IsEmpty());
  }
  EXPECT_THAT(Steps(), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(PruneCheckpoints((dir_ / "nope").string(), 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointDirTest, WritableCheckCreatesTheDirectoryAndLeavesNothing) {
  const fs::path nested = dir_ / "a" / "b";
  ASSERT_TRUE(CheckCheckpointDirWritable(nested.string()).ok());
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(fs::is_empty(nested));  // The probe is gone.
  // A file where the directory should be: refused, saying what would fail.
  std::ofstream(dir_ / "file") << "x";
  const absl::Status status =
      CheckCheckpointDirWritable((dir_ / "file").string());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("cannot be written (" + (dir_ / "file").string()));
  EXPECT_THAT(status.message(),
              HasSubstr("the job would fail at its first checkpoint"));
  // A directory no file can be created in (even by root), as a read-only
  // mount.
  EXPECT_EQ(CheckCheckpointDirWritable("/proc").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirTest, RemoveAllRemovesEveryStepAndNothingElse) {
  WriteStageFiles(1, 2);  // Incomplete.
  WriteCompleteStep(2);
  WriteCompleteStep(10);
  fs::create_directories(dir_ / "step-x");  // Not a step.
  fs::create_directories(dir_ / "step-01");
  std::ofstream(dir_ / "params.safetensors") << "kept";
  absl::StatusOr<std::vector<int64_t>> removed = RemoveAllCheckpoints(ckpt_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre(1, 2, 10));
  EXPECT_THAT(Steps(), IsEmpty());
  EXPECT_TRUE(fs::exists(dir_ / "step-x"));
  EXPECT_TRUE(fs::exists(dir_ / "step-01"));
  EXPECT_TRUE(fs::exists(dir_ / "params.safetensors"));
  // Nothing left, and no directory at all: both remove nothing.
  removed = RemoveAllCheckpoints(ckpt_);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  removed = RemoveAllCheckpoints((dir_ / "nope").string());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, IsEmpty());
  // A file where the directory should be is an error, not a no-op.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_EQ(RemoveAllCheckpoints((dir_ / "file").string()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace conveyor::checkpoint
