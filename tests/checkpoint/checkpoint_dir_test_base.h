// A fresh checkpoint directory per test, with helpers that write steps
// into it; for the tests of checkpoint/manifest.h and checkpoint/directory.h.
#ifndef CONVEYOR_TESTS_CHECKPOINT_CHECKPOINT_DIR_TEST_BASE_H_
#define CONVEYOR_TESTS_CHECKPOINT_CHECKPOINT_DIR_TEST_BASE_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "gtest/gtest.h"

namespace conveyor::checkpoint {

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / "checkpoint_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ckpt_ = dir_.string();
  }

  static void WriteBytes(const std::filesystem::path& path,
                         const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  std::string StepDir(int64_t step) const { return StepDirPath(ckpt_, step); }

  // Stage files (distinct contents per step and stage) without a manifest.
  void WriteStageFiles(int64_t step, int num_stages) {
    std::filesystem::create_directories(StepDir(step));
    for (int s = 0; s < num_stages; ++s) {
      WriteBytes(StageFilePath(ckpt_, step, s),
                 absl::StrCat("step ", step, " stage ", s, " ",
                              std::string(static_cast<size_t>(s) * 7, 'p')));
    }
  }

  // A complete step: the stage files, then their manifest.
  void WriteCompleteStep(int64_t step, int num_stages = 2) {
    WriteStageFiles(step, num_stages);
    CheckpointManifest m;
    m.job = "mlp";
    m.job_id = "job-1";
    m.step = step;
    m.config_hash = "00000000deadbeef";
    m.num_stages = num_stages;
    for (int s = 0; s < num_stages; ++s) {
      m.stage_begin.push_back(2 * s);
      absl::StatusOr<StageFileDigest> d = DigestStageFile(StepDir(step), s);
      ASSERT_TRUE(d.ok()) << d.status();
      m.stages.push_back(*d);
    }
    m.created_unix_ms = 1000 + step;
    ASSERT_TRUE(WriteManifest(ckpt_, m).ok());
  }

  void FlipByte(const std::string& path, size_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x01));
  }

  std::vector<int64_t> Steps() {
    absl::StatusOr<std::vector<int64_t>> steps = ListCheckpointSteps(ckpt_);
    EXPECT_TRUE(steps.ok()) << steps.status();
    return steps.ok() ? *steps : std::vector<int64_t>{};
  }

  std::filesystem::path dir_;
  std::string ckpt_;
};

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_TESTS_CHECKPOINT_CHECKPOINT_DIR_TEST_BASE_H_
