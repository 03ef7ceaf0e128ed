#include "cli/export_command.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "checkpoint/manifest.h"
#include "engine/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / "export_test" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "ckpt");
    ckpt_ = (dir_ / "ckpt").string();
    output_ = (dir_ / "out.safetensors").string();
  }

  std::map<std::string, std::string> Metadata(int stage, int num_stages,
                                              int64_t step) {
    return {{"format", checkpoint::kStageFileFormat},
            {"job", "job-7"},
            {"stage", absl::StrCat(stage)},
            {"num_stages", absl::StrCat(num_stages)},
            {"step", absl::StrCat(step)},
            {"optimizer_step", absl::StrCat(step)}};
  }

  // Stage s holds "layers.<s>.weight" [2, 2] = s*10 + {0,1,2,3} and
  // "layers.<s>.bias" [2].
  void WriteStage(int64_t step, int stage, int num_stages,
                  std::map<std::string, std::string> metadata = {},
                  std::string extra_tensor = "") {
    if (metadata.empty()) metadata = Metadata(stage, num_stages, step);
    const fs::path step_dir = fs::path(ckpt_) / absl::StrCat("step-", step);
    fs::create_directories(step_dir);
    weights_[stage] = {stage * 10.0f, stage * 10.0f + 1, stage * 10.0f + 2,
                       stage * 10.0f + 3};
    biases_[stage] = {-1.0f * stage, 0.5f};
    std::vector<engine::TensorToWrite> tensors = {
        {.name = absl::StrCat("layers.", stage, ".weight"),
         .dtype = engine::DType::kF32,
         .shape = {2, 2},
         .data = weights_[stage].data(),
         .bytes = 16},
        {.name = absl::StrCat("layers.", stage, ".bias"),
         .dtype = engine::DType::kF32,
         .shape = {2},
         .data = biases_[stage].data(),
         .bytes = 8}};
    if (!extra_tensor.empty()) {
      tensors.push_back({.name = extra_tensor,
                         .dtype = engine::DType::kF32,
                         .shape = {2},
                         .data = biases_[stage].data(),
                         .bytes = 8});
    }
    ASSERT_TRUE(
        engine::WriteSafetensors(
            (step_dir / absl::StrCat("stage-", stage, ".safetensors")).string(),
            tensors, metadata)
            .ok());
  }

  // Commits `step` as the coordinator does once every stage file is in: a
  // manifest with their sizes and checksums, written last.
  void WriteManifestFor(int64_t step, int num_stages) {
    const std::string step_dir = checkpoint::StepDirPath(ckpt_, step);
    checkpoint::CheckpointManifest m;
    m.job = "mlp";
    m.job_id = "job-7";
    m.step = step;
    m.config_hash = "0123456789abcdef";
    m.num_stages = num_stages;
    for (int s = 0; s < num_stages; ++s) {
      m.stage_begin.push_back(s);
      absl::StatusOr<checkpoint::StageFileDigest> d =
          checkpoint::DigestStageFile(step_dir, s);
      ASSERT_TRUE(d.ok()) << d.status();
      m.stages.push_back(*d);
    }
    m.created_unix_ms = 1;
    absl::Status written = checkpoint::WriteManifest(ckpt_, m);
    ASSERT_TRUE(written.ok()) << written;
  }

  // A complete step: every stage file, then the manifest.
  void WriteStep(int64_t step, int num_stages) {
    for (int s = 0; s < num_stages; ++s) WriteStage(step, s, num_stages);
    WriteManifestFor(step, num_stages);
  }

  std::string StagePath(int64_t step, int stage) {
    return checkpoint::StageFilePath(ckpt_, step, stage);
  }

  fs::path dir_;
  std::string ckpt_;
  std::string output_;
  std::map<int, std::vector<float>> weights_;
  std::map<int, std::vector<float>> biases_;
};

TEST_F(ExportTest, GathersEveryStageByGlobalName) {
  WriteStep(100, 3);
  absl::StatusOr<ExportResult> r =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 100);
  EXPECT_EQ(r->num_stages, 3);
  EXPECT_EQ(r->job, "job-7");
  EXPECT_EQ(r->num_tensors, 6);
  EXPECT_EQ(r->num_elements, 18);
  EXPECT_EQ(r->bytes, 72u);

  absl::StatusOr<engine::SafetensorsReader> file =
      engine::SafetensorsReader::Open(output_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors().size(), 6u);
  for (int s = 0; s < 3; ++s) {
    absl::StatusOr<std::vector<float>> w =
        file->ReadF32(absl::StrCat("layers.", s, ".weight"));
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, weights_[s]);
    EXPECT_EQ(file->Find(absl::StrCat("layers.", s, ".weight"))->shape,
              (std::vector<int64_t>{2, 2}));
    absl::StatusOr<std::vector<float>> b =
        file->ReadF32(absl::StrCat("layers.", s, ".bias"));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*b, biases_[s]);
  }
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("step"), "100");
  EXPECT_EQ(file->metadata().at("job"), "job-7");
}

TEST_F(ExportTest, PicksTheHighestCompleteStepAndSaysWhatItSkipped) {
  WriteStep(100, 2);
  WriteStep(200, 2);
  // The job stopped while writing step 300: every stage file is there, but
  // the coordinator never committed it.
  WriteStage(300, 0, 2);
  WriteStage(300, 1, 2);
  fs::create_directories(fs::path(ckpt_) / "step-x");  // Not a step.
  absl::StatusOr<ExportResult> r =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 200);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_THAT(r->skipped[0], HasSubstr("step 300 is incomplete: no manifest"));
}

TEST_F(ExportTest, ADamagedNewestCommittedStepIsRefusedNotSkipped) {
  WriteStep(100, 2);
  WriteStep(200, 2);
  std::fstream(StagePath(200, 1),
               std::ios::in | std::ios::out | std::ios::binary)
      .put('\x7f');  // Step 200 was damaged after it was committed.
  absl::StatusOr<ExportResult> r =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("step-200 is a committed checkpoint that fails its "
                        "checks (" +
                        StagePath(200, 1) + ": CRC-32C"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("the newest intact step before it is"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("use an older step with --step N"));
  EXPECT_FALSE(fs::exists(output_));
  r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 100);
}

TEST_F(ExportTest, StepSelectsAnOlderStep) {
  WriteStep(100, 2);
  WriteStep(200, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 100);
  absl::StatusOr<engine::SafetensorsReader> file =
      engine::SafetensorsReader::Open(output_);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->metadata().at("step"), "100");
}

TEST_F(ExportTest, MissingStepIsNotFoundAndListsTheSteps) {
  WriteStep(100, 1);
  WriteStep(200, 1);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 150, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no step-150; steps: 100, 200"));
}

TEST_F(ExportTest, StepWithoutManifestIsRefusedAndSkipped) {
  WriteStep(100, 2);
  WriteStage(200, 0, 2);
  WriteStage(200, 1, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 200, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("step 200 is incomplete: no manifest"));
  EXPECT_FALSE(fs::exists(output_));

  absl::StatusOr<ExportResult> latest =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 100);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_THAT(latest->skipped[0],
              HasSubstr("step 200 is incomplete: no manifest"));
}

TEST_F(ExportTest, FlippedByteIsDataLoss) {
  WriteStep(100, 2);
  {
    std::fstream f(StagePath(100, 1),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);  // The last byte of a tensor.
    f.put('\x55');
  }
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors: CRC-32C "));
  EXPECT_THAT(r.status().message(), HasSubstr(", the manifest records "));
  EXPECT_FALSE(fs::exists(output_));
  // Without --step: the same damage, and nothing intact to name instead.
  absl::StatusOr<ExportResult> latest =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  ASSERT_FALSE(latest.ok());
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(latest.status().message(), HasSubstr("no older step is intact"));
}

TEST_F(ExportTest, MissingOrTruncatedStageFileIsDataLoss) {
  WriteStep(100, 3);
  fs::remove(StagePath(100, 1));
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("step-100/stage-1.safetensors: missing"));

  WriteStep(200, 2);
  fs::resize_file(StagePath(200, 0), fs::file_size(StagePath(200, 0)) - 4);
  r = ExportCheckpoint(ckpt_, 200, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("the manifest records"));
}

TEST_F(ExportTest, OptimizerStateIsNotExported) {
  for (int s = 0; s < 2; ++s) {
    WriteStage(100, s, 2, {},
               absl::StrCat(checkpoint::kOptimizerTensorPrefix,
                            "exp_avg/layers.", s, ".bias"));
  }
  WriteManifestFor(100, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_tensors, 4);
  EXPECT_EQ(r->num_elements, 12);
  absl::StatusOr<engine::SafetensorsReader> file =
      engine::SafetensorsReader::Open(output_);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const engine::TensorInfo& info : file->tensors()) {
    names.push_back(info.name);
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(
                         "layers.0.weight", "layers.0.bias", "layers.1.weight",
                         "layers.1.bias"));
}

TEST_F(ExportTest, NumStagesDisagreeingWithTheManifestIsAnError) {
  WriteStage(100, 0, 2);
  WriteStage(100, 1, 2, Metadata(1, 3, 100));
  WriteManifestFor(100, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("stage-1.safetensors: num_stages 3 disagrees with "
                        "the manifest (2)"));
}

TEST_F(ExportTest, InconsistentMetadataIsAnError) {
  struct Case {
    std::map<std::string, std::string> metadata;
    std::string error;
  };
  std::vector<Case> cases = {
      {Metadata(0, 2, 100), "metadata says stage 0, the file name 1"},
      {Metadata(1, 2, 90), "metadata says step 90, the directory step 100"},
      {{{"format", "other"}}, "metadata 'format' is 'other'"},
      {{{"format", checkpoint::kStageFileFormat},
        {"stage", "1"},
        {"step", "100"}},
       "no 'num_stages' in the metadata"},
  };
  Case other_job{Metadata(1, 2, 100), "job 'job-8' disagrees"};
  other_job.metadata["job"] = "job-8";
  cases.push_back(other_job);
  for (const Case& c : cases) {
    fs::remove_all(fs::path(ckpt_) / "step-100");
    WriteStage(100, 0, 2);
    WriteStage(100, 1, 2, c.metadata);
    WriteManifestFor(100, 2);
    absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
    ASSERT_FALSE(r.ok()) << c.error;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.error;
    EXPECT_THAT(r.status().message(), HasSubstr(c.error));
    EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors"));
  }
}

TEST_F(ExportTest, DuplicateTensorNamesAreAnError) {
  WriteStage(100, 0, 2, {}, "layers.1.bias");
  WriteStage(100, 1, 2);
  WriteManifestFor(100, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("tensor 'layers.1.bias' is in both stage-0 and "
                        "stage-1"));
  EXPECT_FALSE(fs::exists(output_));
}

TEST_F(ExportTest, CommittedFileThatIsNotSafetensorsIsDataLoss) {
  // Corrupt before the manifest was written, so the checksums agree: the
  // reader, not the manifest, has to catch it, and it is a state to repair,
  // not a bad argument.
  WriteStage(100, 0, 2);
  fs::create_directories(fs::path(ckpt_) / "step-100");
  std::ofstream(StagePath(100, 1)) << "not safetensors";
  WriteManifestFor(100, 2);
  absl::StatusOr<ExportResult> r = ExportCheckpoint(ckpt_, 100, output_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("stage-1.safetensors"));
}

TEST_F(ExportTest, DirectoryErrors) {
  absl::StatusOr<ExportResult> missing =
      ExportCheckpoint((dir_ / "nope").string(), std::nullopt, output_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no such checkpoint directory"));
  std::ofstream(fs::path(ckpt_) / "params.safetensors") << "x";
  absl::StatusOr<ExportResult> empty =
      ExportCheckpoint(ckpt_, std::nullopt, output_);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr("no step-<N> directories"));
  EXPECT_THAT(empty.status().message(), HasSubstr("run --in-process"));
}

TEST_F(ExportTest, RunPrintsASummaryAndRejectsANegativeStep) {
  WriteStep(100, 2);
  WriteStage(200, 1, 2);
  std::ostringstream out;
  ASSERT_TRUE(
      RunExportCommand({.checkpoint_dir = ckpt_, .output = output_}, out).ok());
  EXPECT_EQ(out.str(),
            absl::StrCat("note: skipped ", checkpoint::StepDirPath(ckpt_, 200),
                         ": step 200 is incomplete: no manifest\n",
                         "exported step 100 of job job-7: 2 stage(s), 4 "
                         "tensors, 12 parameters (0.0 MiB) to ",
                         output_, "\n"));
  EXPECT_EQ(RunExportCommand(
                {.checkpoint_dir = ckpt_, .step = -2, .output = output_}, out)
                .code(),
            absl::StatusCode::kInvalidArgument);

  // --json: the same summary as one object.
  ExportCommandOptions json;
  json.checkpoint_dir = ckpt_;
  json.output = output_;
  json.json = true;
  std::ostringstream summary;
  ASSERT_TRUE(RunExportCommand(json, summary).ok());
  const nlohmann::json parsed = nlohmann::json::parse(summary.str());
  EXPECT_EQ(parsed["step"], 100);
  EXPECT_EQ(parsed["job"], "job-7");
  EXPECT_EQ(parsed["num_stages"], 2);
  EXPECT_EQ(parsed["tensors"], 4);
  EXPECT_EQ(parsed["parameters"], 12);
  EXPECT_EQ(parsed["output"], output_);
  ASSERT_EQ(parsed["skipped"].size(), 1u);
  EXPECT_THAT(parsed["skipped"][0].get<std::string>(),
              HasSubstr("step 200 is incomplete"));
}

}  // namespace
}  // namespace conveyor::cli
