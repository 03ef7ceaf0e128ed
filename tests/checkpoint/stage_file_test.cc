#include "checkpoint/stage_file.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class StageFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) / "stage_file_test" /
            ::testing::UnitTest::GetInstance()->current_test_info()->name())
               .string();
    fs::remove_all(dir_);
  }

  static StageFileInfo Info(int stage = 1, int64_t step = 40) {
    return {.job = "gpt",
            .stage = stage,
            .num_stages = 3,
            .step = step,
            .optimizer_step = step,
            .samples_seen = step * 8};
  }

  // Stage `info.stage`'s weight and its Adam state, as a worker writes them.
  StageFileDigest Write(const StageFileInfo& info) {
    std::vector<engine::TensorToWrite> tensors = {
        {.name = "layers.1.weight",
         .dtype = engine::DType::kF32,
         .shape = {2, 2},
         .data = weight_,
         .bytes = sizeof(weight_)},
        {.name = OptimizerTensorName("exp_avg", "layers.1.weight"),
         .dtype = engine::DType::kF32,
         .shape = {2, 2},
         .data = exp_avg_,
         .bytes = sizeof(exp_avg_)}};
    absl::StatusOr<StageFileDigest> digest =
        WriteStageFile(dir_, info, tensors);
    EXPECT_TRUE(digest.ok()) << digest.status();
    return digest.ok() ? *digest : StageFileDigest{};
  }

  // Writes a file with `metadata` under stage 1's name in step 40, outside
  // WriteStageFile (as a broken or foreign writer would), and returns its
  // true digest, so that only the metadata can be wrong.
  StageFileDigest WriteForeign(
      const std::map<std::string, std::string>& metadata) {
    fs::create_directories(StepDirPath(dir_, 40));
    const std::string path = StageFilePath(dir_, 40, 1);
    EXPECT_TRUE(engine::WriteSafetensors(path, {}, metadata).ok());
    absl::StatusOr<StageFileDigest> d =
        DigestStageFile(StepDirPath(dir_, 40), 1);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : StageFileDigest{};
  }

  static std::map<std::string, std::string> GoodMetadata() {
    return {
        {"format", kStageFileFormat}, {"job", "gpt"}, {"stage", "1"},
        {"num_stages", "3"},          {"step", "40"}, {"optimizer_step", "40"}};
  }

  std::string dir_;
  float weight_[4] = {1.5f, -2.0f, 0.25f, 8.0f};
  float exp_avg_[4] = {0.1f, 0.2f, 0.3f, 0.4f};
};

TEST_F(StageFileTest, NamesOptimizerState) {
  EXPECT_EQ(OptimizerTensorName("exp_avg_sq", "layers.3.bias"),
            "optimizer/exp_avg_sq/layers.3.bias");
  EXPECT_TRUE(IsOptimizerTensor("optimizer/momentum_buffer/w"));
  EXPECT_FALSE(IsOptimizerTensor("layers.0.weight"));
  EXPECT_FALSE(IsOptimizerTensor("my_optimizer/w"));
}

TEST_F(StageFileTest, RoundTripsWhatAWorkerWrites) {
  const StageFileDigest digest = Write(Info());
  EXPECT_EQ(digest.stage, 1);
  EXPECT_EQ(digest.file, "stage-1.safetensors");
  // The digest is the file's, as the manifest will check it.
  absl::StatusOr<StageFileDigest> on_disk =
      DigestStageFile(StepDirPath(dir_, 40), 1);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(*on_disk, digest);

  absl::StatusOr<StageFile> file =
      ReadStageFile(StepDirPath(dir_, 40), digest, {.step = 40});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->info.job, "gpt");
  EXPECT_EQ(file->info.stage, 1);
  EXPECT_EQ(file->info.num_stages, 3);
  EXPECT_EQ(file->info.step, 40);
  EXPECT_EQ(file->info.optimizer_step, 40);
  EXPECT_EQ(file->info.samples_seen, 320);
  absl::StatusOr<std::vector<float>> w =
      file->tensors.ReadF32("layers.1.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, std::vector<float>(weight_, weight_ + 4));
  absl::StatusOr<std::vector<float>> m =
      file->tensors.ReadF32("optimizer/exp_avg/layers.1.weight");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, std::vector<float>(exp_avg_, exp_avg_ + 4));

  // What export sets is checked as well.
  EXPECT_TRUE(ReadStageFile(StepDirPath(dir_, 40), digest,
                            {.step = 40, .num_stages = 3, .job = "gpt"})
                  .ok());
}

TEST_F(StageFileTest, RewritingAStepReplacesTheFileWhole) {
  Write(Info());
  weight_[0] = 99.0f;
  const StageFileDigest digest = Write(Info());
  absl::StatusOr<StageFile> file =
      ReadStageFile(StepDirPath(dir_, 40), digest, {.step = 40});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file->tensors.ReadF32("layers.1.weight"))[0], 99.0f);
  // No temporary file is left beside it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e :
       fs::directory_iterator(StepDirPath(dir_, 40))) {
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(StageFileTest, RefusesBytesThatAreNotWhatTheManifestRecords) {
  const StageFileDigest digest = Write(Info());
  const std::string step_dir = StepDirPath(dir_, 40);

  StageFileDigest longer = digest;
  longer.bytes += 1;
  absl::StatusOr<StageFile> r = ReadStageFile(step_dir, longer, {.step = 40});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("bytes, but the checkpoint's manifest records"));

  StageFileDigest shorter = digest;
  shorter.bytes -= 1;
  r = ReadStageFile(step_dir, shorter, {.step = 40});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("more than"));

  StageFileDigest other_crc = digest;
  other_crc.crc32c ^= 1;
  r = ReadStageFile(step_dir, other_crc, {.step = 40});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("the file is corrupt"));
  EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors"));
}

TEST_F(StageFileTest, ACommittedFileThatIsNotSafetensorsIsDataLoss) {
  fs::create_directories(StepDirPath(dir_, 40));
  std::ofstream(StageFilePath(dir_, 40, 1)) << "not safetensors";
  absl::StatusOr<StageFileDigest> d = DigestStageFile(StepDirPath(dir_, 40), 1);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<StageFile> r =
      ReadStageFile(StepDirPath(dir_, 40), *d, {.step = 40});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors"));
}

TEST_F(StageFileTest, RefusesMetadataThatDescribesAnotherFile) {
  struct Case {
    std::string key, value;  // Replaced in GoodMetadata; empty value: erase.
    std::string error;
    // Whether the reader is told the manifest's num_stages (3) and stage
    // 0's job ("gpt"), as export does.
    bool as_export = false;
  };
  const std::vector<Case> cases = {
      {"format", "other", "metadata 'format' is 'other'"},
      {"stage", "2", "metadata says stage 2, the file name 1"},
      {"step", "39", "metadata says step 39, the directory step 40"},
      {"step", "-1", "metadata 'step' is '-1', not a non-negative"},
      {"stage", "01x", "metadata 'stage' is '01x'"},
      {"optimizer_step", "7", "optimizer_step 7"},
      {"num_stages", "1", "num_stages 1 cannot hold stage 1"},
      {"num_stages", "4", "num_stages 4 disagrees with the manifest (3)", true},
      {"job", "other",
       "job 'other' disagrees with stage-0.safetensors (job 'gpt')", true},
      {"num_stages", "", "no 'num_stages' in the metadata"},
      {"job", "", "no 'job' in the metadata"},
  };
  for (const Case& c : cases) {
    std::map<std::string, std::string> metadata = GoodMetadata();
    if (c.value.empty()) {
      metadata.erase(c.key);
    } else {
      metadata[c.key] = c.value;
    }
    const StageFileDigest digest = WriteForeign(metadata);
    StageFileExpectation expect{.step = 40};
    if (c.as_export) {
      expect.num_stages = 3;
      expect.job = "gpt";
    }
    absl::StatusOr<StageFile> r =
        ReadStageFile(StepDirPath(dir_, 40), digest, expect);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.error;
    EXPECT_THAT(r.status().message(), HasSubstr(c.error));
    EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors"));
  }
  // The good metadata, for contrast: each case above failed on its change.
  EXPECT_TRUE(ReadStageFile(StepDirPath(dir_, 40), WriteForeign(GoodMetadata()),
                            {.step = 40, .num_stages = 3, .job = "gpt"})
                  .ok());
}

TEST_F(StageFileTest, NeverFollowsANameOutsideTheStepDirectory) {
  StageFileDigest digest = Write(Info());
  for (const char* name :
       {"../stage-1.safetensors", "stage-2.safetensors", "/etc/passwd", ""}) {
    digest.file = name;
    EXPECT_EQ(ReadStageFile(StepDirPath(dir_, 40), digest, {.step = 40})
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST_F(StageFileTest, AMissingFileOrADirectoryIsAnErrorNamingThePath) {
  StageFileDigest digest{.stage = 0, .file = "stage-0.safetensors"};
  absl::StatusOr<StageFile> r =
      ReadStageFile(StepDirPath(dir_, 40), digest, {.step = 40});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("stage-0.safetensors"));

  fs::create_directories(StageFilePath(dir_, 40, 0));
  r = ReadStageFile(StepDirPath(dir_, 40), digest, {.step = 40});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("stage-0.safetensors"));
}

TEST_F(StageFileTest, WritingWhereADirectoryCannotBeMadeFailsNamingIt) {
  fs::create_directories(dir_);
  std::ofstream(fs::path(dir_) / "step-40") << "a file, not a directory";
  std::vector<engine::TensorToWrite> none;
  absl::StatusOr<StageFileDigest> r = WriteStageFile(dir_, Info(), none);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("step-40"));
}

}  // namespace
}  // namespace conveyor::checkpoint
