#include "checkpoint/resume.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/job/test_jobs.h"

namespace conveyor::checkpoint {
namespace {

using job::JobPlan;
using job::NeedsProfile;
using job::PlanJob;
using job::testing::JobYaml;
using ::testing::HasSubstr;

engine::ResumeSpec Latest() {
  engine::ResumeSpec r;
  r.kind = engine::ResumeSpec::Kind::kLatest;
  return r;
}
engine::ResumeSpec AtPath(const std::string& path) {
  engine::ResumeSpec r;
  r.kind = engine::ResumeSpec::Kind::kPath;
  r.path = path;
  return r;
}
ResumePoint PointAt(int64_t step, std::vector<int> stage_begin) {
  ResumePoint p;
  p.step = step;
  p.stage_begin = std::move(stage_begin);
  return p;
}

class CheckpointsTest : public ::testing::Test {
 protected:
  CheckpointsTest()
      : dir_((std::filesystem::path(::testing::TempDir()) /
              absl::StrCat("checkpoints_test_", getpid(), "_",
                           ::testing::UnitTest::GetInstance()
                               ->current_test_info()
                               ->name()))
                 .string()) {
    std::filesystem::remove_all(dir_);
  }

  JobPlan Plan(const std::string& yaml) {
    absl::StatusOr<engine::JobSpec> spec = engine::ParseJobSpec(yaml, "j.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<JobPlan> plan = PlanJob(*std::move(spec));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *std::move(plan);
  }

  // Writes step `step` of a 2-stage job planned as `plan`, with a manifest
  // when `complete`.
  void WriteStep(const JobPlan& plan, int64_t step, bool complete,
                 const std::string& hash = "00000000000000aa",
                 const std::string& training_hash = "") {
    std::map<int, v1::StageFile> files;
    for (int stage = 0; stage < plan.num_stages; ++stage) {
      const std::string path = StageFilePath(dir_, step, stage);
      std::filesystem::create_directories(
          std::filesystem::path(path).parent_path());
      std::ofstream(path, std::ios::binary) << "stage " << stage;
      absl::StatusOr<StageFileDigest> d =
          DigestStageFile(StepDirPath(dir_, step), stage);
      ASSERT_TRUE(d.ok()) << d.status();
      v1::StageFile& f = files[stage];
      f.set_stage(stage);
      f.set_file(d->file);
      f.set_bytes(d->bytes);
      f.set_crc32c(d->crc32c);
    }
    if (!complete) return;
    ASSERT_TRUE(WriteManifest(dir_, MakeManifest(plan, "job-1", hash,
                                                 training_hash, step, files, 1))
                    .ok());
  }

  std::string dir_;
};

TEST_F(CheckpointsTest, FindsLatestOrTheNamedStepAndChecksTheConfig) {
  const JobPlan plan = Plan(JobYaml(2, "mlp", /*steps=*/10));
  WriteStep(plan, 2, true);
  WriteStep(plan, 4, true);
  WriteStep(plan, 6, false);  // Being written, or torn by a crash.

  absl::StatusOr<ResumePoint> latest =
      FindResumePoint(Latest(), dir_, "00000000000000aa", "");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 4);
  EXPECT_EQ(latest->step_dir, StepDirPath(dir_, 4));
  EXPECT_EQ(latest->stage_begin, (std::vector<int>{0, 1}));
  ASSERT_EQ(latest->files.size(), 2u);
  EXPECT_EQ(latest->files[1].file(), "stage-1.safetensors");
  EXPECT_TRUE(CheckResumeFitsPlan(*latest, plan).ok());

  // A step directory, with or without a trailing slash; a checkpoint
  // directory means its newest complete step.
  for (const std::string& path :
       {StepDirPath(dir_, 2), StepDirPath(dir_, 2) + "/"}) {
    absl::StatusOr<ResumePoint> p =
        FindResumePoint(AtPath(path), "", "00000000000000aa", "");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->step, 2);
    EXPECT_EQ(p->step_dir, StepDirPath(dir_, 2));
  }
  absl::StatusOr<ResumePoint> in_dir =
      FindResumePoint(AtPath(dir_), "", "00000000000000aa", "");
  ASSERT_TRUE(in_dir.ok()) << in_dir.status();
  EXPECT_EQ(in_dir->step, 4);

  absl::StatusOr<ResumePoint> torn =
      FindResumePoint(AtPath(StepDirPath(dir_, 6)), "", "00000000000000aa", "");
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(torn.status().message(),
              HasSubstr("does not start from scratch"));

  absl::StatusOr<ResumePoint> other =
      FindResumePoint(Latest(), dir_, "00000000000000bb", "");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(),
              HasSubstr("config hash 00000000000000aa, this job's "
                        "00000000000000bb"));
}

// resume: latest once skipped a damaged committed step without a word,
// resumed from the step before it, and then overwrote it.
TEST_F(CheckpointsTest, LatestRefusesADamagedCommittedStepSayingWhatToDo) {
  const JobPlan plan = Plan(JobYaml(2, "mlp", /*steps=*/10));
  WriteStep(plan, 2, true);
  WriteStep(plan, 4, true);
  std::filesystem::resize_file(StageFilePath(dir_, 4, 1), 2);
  for (const engine::ResumeSpec& resume : {Latest(), AtPath(dir_)}) {
    absl::StatusOr<ResumePoint> point =
        FindResumePoint(resume, dir_, "00000000000000aa", "");
    EXPECT_EQ(point.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(point.status().message(),
                HasSubstr(StepDirPath(dir_, 4) +
                          " is a committed checkpoint that fails its checks"));
    EXPECT_THAT(point.status().message(),
                HasSubstr("the newest intact step before it is " +
                          StepDirPath(dir_, 2)));
    EXPECT_THAT(point.status().message(),
                HasSubstr("Resume from an older step by its path"));
  }
  // Named by its path, the older step resumes.
  absl::StatusOr<ResumePoint> older =
      FindResumePoint(AtPath(StepDirPath(dir_, 2)), "", "00000000000000aa", "");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->step, 2);
}

TEST_F(CheckpointsTest, TheCheckpointMustFitThePlan) {
  const JobPlan two = Plan(JobYaml(2, "mlp", /*steps=*/3));
  WriteStep(two, 2, true);
  absl::StatusOr<ResumePoint> p =
      FindResumePoint(Latest(), dir_, "00000000000000aa", "");
  ASSERT_TRUE(p.ok()) << p.status();

  // Another cut of the same layers fits: each rank reads the files that
  // hold its parameters.
  const JobPlan one = Plan(
      absl::StrReplaceAll(JobYaml(2, "mlp", 3), {{"    - boundary\n", ""}}));
  ASSERT_EQ(one.num_stages, 1);
  EXPECT_TRUE(CheckResumeFitsPlan(*p, one).ok());
  // A cut past the model's layers does not.
  ResumePoint past = *p;
  past.stage_begin = {0, 2};
  absl::Status stages = CheckResumeFitsPlan(past, one);
  EXPECT_EQ(stages.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stages.message(),
              HasSubstr("holds 2 stages starting at layers [0, 2], which is "
                        "not a cut of this job's 2 layers"));
  absl::Status finished =
      CheckResumeFitsPlan(*p, Plan(JobYaml(2, "mlp", /*steps=*/2)));
  EXPECT_THAT(finished.message(), HasSubstr("nothing left to train"));
}

TEST_F(CheckpointsTest, AnAutoJobResumesWithItsCheckpointsCut) {
  std::string yaml =
      "model:\n  input_shape: [4]\n  init: {seed: 1}\n  layers:\n"
      "    - dense: {features: 4}\n    - dense: {features: 4}\n"
      "    - dense: {features: 4}\n  loss: mse\n"
      "data: {source: synthetic-regression}\n"
      "training: {steps: 3, batch_size: 8, microbatches: 4}\n"
      "optimizer: {kind: sgd, lr: 0.1}\n"
      "pipeline: {schedule: 1f1b, stages: auto, num_stages: 2}\n";
  absl::StatusOr<engine::JobSpec> spec = engine::ParseJobSpec(yaml, "j.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ResumePoint point = PointAt(1, {0, 2});
  ASSERT_TRUE(AdoptCheckpointCut(point, *spec).ok());
  EXPECT_FALSE(spec->pipeline.auto_stages);
  absl::StatusOr<JobPlan> plan = PlanJob(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(NeedsProfile(*plan));
  EXPECT_EQ(plan->stages[1].first_layer, 2);
  EXPECT_TRUE(CheckResumeFitsPlan(point, *plan).ok());

  absl::StatusOr<engine::JobSpec> again = engine::ParseJobSpec(yaml, "j.yaml");
  const ResumePoint bad = PointAt(1, {0, 7});
  EXPECT_THAT(AdoptCheckpointCut(bad, *again).message(),
              HasSubstr("do not fit this model"));

  // A checkpoint of another layout leaves the cut to the job's own
  // pipeline section: it is profiled and cut anew.
  ResumePoint other = PointAt(1, {0, 2});
  other.other_layout = true;
  ASSERT_TRUE(AdoptCheckpointCut(other, *again).ok());
  EXPECT_TRUE(again->pipeline.auto_stages);
}

// The same training on another pipeline layout (an equal training hash)
// resumes; another training, or an older manifest without a training hash,
// does not.
TEST_F(CheckpointsTest, AnotherLayoutResumesByTheTrainingHash) {
  const JobPlan plan = Plan(JobYaml(2, "mlp", /*steps=*/10));
  WriteStep(plan, 2, true, "00000000000000aa", "00000000000000cc");
  absl::StatusOr<ResumePoint> same =
      FindResumePoint(Latest(), dir_, "00000000000000aa", "00000000000000cc");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->other_layout);

  absl::StatusOr<ResumePoint> other =
      FindResumePoint(Latest(), dir_, "00000000000000bb", "00000000000000cc");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->other_layout);
  EXPECT_EQ(other->stage_begin, (std::vector<int>{0, 1}));
  EXPECT_EQ(other->files.size(), 2u);
  // Kept across a coordinator restart (the state file's CheckpointRef).
  EXPECT_TRUE(FromProto(ToProto(*other)).other_layout);
  EXPECT_FALSE(FromProto(ToProto(*same)).other_layout);

  absl::StatusOr<ResumePoint> retrained =
      FindResumePoint(Latest(), dir_, "00000000000000bb", "00000000000000dd");
  EXPECT_EQ(retrained.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(retrained.status().message(),
              HasSubstr("another training configuration (training hash "
                        "00000000000000cc, this job's 00000000000000dd)"));
  EXPECT_THAT(retrained.status().message(),
              HasSubstr("only the pipeline section and the stage boundaries "
                        "may change"));

  // A manifest from before training hashes: only the config hash counts.
  WriteStep(plan, 4, true, "00000000000000aa", "");
  absl::StatusOr<ResumePoint> old =
      FindResumePoint(Latest(), dir_, "00000000000000bb", "00000000000000cc");
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("predates training hashes"));
}

}  // namespace
}  // namespace conveyor::checkpoint
