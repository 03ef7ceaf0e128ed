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
#include "job/config_hash.h"
#include "tests/job/test_jobs.h"

namespace conveyor::checkpoint {
namespace {

using job::JobPlan;
using job::NeedsProfile;
using job::PlanJob;
using job::testing::JobYaml;
using ::testing::HasSubstr;
using ::testing::Not;

job::ResumeSpec Latest() {
  job::ResumeSpec r;
  r.kind = job::ResumeSpec::Kind::kLatest;
  return r;
}
job::ResumeSpec AtPath(const std::string& path) {
  job::ResumeSpec r;
  r.kind = job::ResumeSpec::Kind::kPath;
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
    absl::StatusOr<job::JobSpec> spec = job::ParseJobSpec(yaml, "j.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<JobPlan> plan = PlanJob(*std::move(spec));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *std::move(plan);
  }

  // Writes step `step` of a 2-stage job planned as `plan`, with a manifest
  // when `complete`.
  void WriteStep(const JobPlan& plan, int64_t step, bool complete,
                 const std::string& hash = "00000000000000aa",
                 const std::string& training_hash = "",
                 const std::string& job_yaml = "") {
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
    ASSERT_TRUE(
        WriteManifest(dir_, MakeManifest(plan, "job-1", hash, training_hash,
                                         job_yaml, step, files, 1))
            .ok());
  }

  // Step `step` of the job in `yaml`, its manifest recording the file and
  // its hashes as the coordinator writes them.
  void WriteJobStep(const std::string& yaml, int64_t step) {
    WriteStep(Plan(yaml), step, true, job::JobConfigHash(yaml),
              job::JobTrainingHash(yaml), yaml);
  }

  std::string dir_;
};

TEST_F(CheckpointsTest, FindsLatestOrTheNamedStepAndChecksTheConfig) {
  const JobPlan plan = Plan(JobYaml(2, "mlp", /*steps=*/10));
  WriteStep(plan, 2, true);
  WriteStep(plan, 4, true);
  WriteStep(plan, 6, false);  // Being written, or torn by a crash.

  absl::StatusOr<ResumePoint> latest =
      FindResumePoint(Latest(), dir_, "00000000000000aa", "", "");
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
        FindResumePoint(AtPath(path), "", "00000000000000aa", "", "");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->step, 2);
    EXPECT_EQ(p->step_dir, StepDirPath(dir_, 2));
  }
  absl::StatusOr<ResumePoint> in_dir =
      FindResumePoint(AtPath(dir_), "", "00000000000000aa", "", "");
  ASSERT_TRUE(in_dir.ok()) << in_dir.status();
  EXPECT_EQ(in_dir->step, 4);

  absl::StatusOr<ResumePoint> torn = FindResumePoint(
      AtPath(StepDirPath(dir_, 6)), "", "00000000000000aa", "", "");
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(torn.status().message(),
              HasSubstr("does not start from scratch"));

  absl::StatusOr<ResumePoint> other =
      FindResumePoint(Latest(), dir_, "00000000000000bb", "", "");
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
  for (const job::ResumeSpec& resume : {Latest(), AtPath(dir_)}) {
    absl::StatusOr<ResumePoint> point =
        FindResumePoint(resume, dir_, "00000000000000aa", "", "");
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
  absl::StatusOr<ResumePoint> older = FindResumePoint(
      AtPath(StepDirPath(dir_, 2)), "", "00000000000000aa", "", "");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->step, 2);
}

TEST_F(CheckpointsTest, TheCheckpointMustFitThePlan) {
  const JobPlan two = Plan(JobYaml(2, "mlp", /*steps=*/3));
  WriteStep(two, 2, true);
  absl::StatusOr<ResumePoint> p =
      FindResumePoint(Latest(), dir_, "00000000000000aa", "", "");
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
  absl::StatusOr<job::JobSpec> spec = job::ParseJobSpec(yaml, "j.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ResumePoint point = PointAt(1, {0, 2});
  ASSERT_TRUE(AdoptCheckpointCut(point, *spec).ok());
  EXPECT_FALSE(spec->pipeline.auto_stages);
  absl::StatusOr<JobPlan> plan = PlanJob(*spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(NeedsProfile(*plan));
  EXPECT_EQ(plan->stages[1].first_layer, 2);
  EXPECT_TRUE(CheckResumeFitsPlan(point, *plan).ok());

  absl::StatusOr<job::JobSpec> again = job::ParseJobSpec(yaml, "j.yaml");
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
  absl::StatusOr<ResumePoint> same = FindResumePoint(
      Latest(), dir_, "00000000000000aa", "00000000000000cc", "");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->other_layout);

  absl::StatusOr<ResumePoint> other = FindResumePoint(
      Latest(), dir_, "00000000000000bb", "00000000000000cc", "");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->other_layout);
  EXPECT_EQ(other->stage_begin, (std::vector<int>{0, 1}));
  EXPECT_EQ(other->files.size(), 2u);
  // Kept across a coordinator restart (the state file's CheckpointRef).
  EXPECT_TRUE(FromProto(ToProto(*other)).other_layout);
  EXPECT_FALSE(FromProto(ToProto(*same)).other_layout);

  absl::StatusOr<ResumePoint> retrained = FindResumePoint(
      Latest(), dir_, "00000000000000bb", "00000000000000dd", "");
  EXPECT_EQ(retrained.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(retrained.status().message(),
              HasSubstr("another training configuration (training hash "
                        "00000000000000cc, this job's 00000000000000dd)"));
  EXPECT_THAT(retrained.status().message(),
              HasSubstr("only the pipeline section and the stage boundaries "
                        "may change"));

  // A manifest from before training hashes: only the config hash counts.
  WriteStep(plan, 4, true, "00000000000000aa", "");
  absl::StatusOr<ResumePoint> old = FindResumePoint(
      Latest(), dir_, "00000000000000bb", "00000000000000cc", "");
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("predates training hashes"));
}

// A checkpoint of another training names what differs, key by key, with
// both values.
TEST_F(CheckpointsTest, RefusesAnotherTrainingNamingTheKeys) {
  const std::string yaml = JobYaml(2, "mlp", /*steps=*/10);
  WriteJobStep(yaml, 4);
  const std::string other = absl::StrReplaceAll(
      yaml, {{"lr: 0.1", "lr: 0.05"},
             {"{source: synthetic-regression}",
              "{source: synthetic-regression, shuffle: true}"},
             {"    - boundary\n", ""}});  // Only the cut: not named.
  absl::StatusOr<ResumePoint> point =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(other),
                      job::JobTrainingHash(other), other);
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(point.status().message(),
            absl::StrCat("resume: latest (in ", dir_,
                         "): step 4 was written by job 'mlp' with another "
                         "training configuration: data.shuffle is set in "
                         "this job only (true); optimizer.lr differs (0.1 in "
                         "the checkpoint, 0.05 in this job); only the "
                         "pipeline section, the stage boundaries and "
                         "training.steps may change on resume"));

  // A raised training.steps with another change is refused all the same,
  // naming the change that is refused (it once listed training.steps as a
  // cause, then said it may change).
  const std::string longer_and_wider = absl::StrReplaceAll(
      yaml, {{"steps: 10,", "steps: 20,"},
             {"features: 4}\n    - boundary", "features: 5}\n    - boundary"}});
  point =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(longer_and_wider),
                      job::JobTrainingHash(longer_and_wider), longer_and_wider);
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(point.status().message(),
              HasSubstr("another training configuration: "
                        "model.layers[0].dense.features differs (4 in the "
                        "checkpoint, 5 in this job); only the pipeline "
                        "section, the stage boundaries and training.steps "
                        "may change on resume (training.steps differs too, "
                        "which alone would resume)"));
  EXPECT_THAT(point.status().message(),
              Not(HasSubstr("training.steps differs (")));
}

// Raising training.steps resumes, with a note saying what it changes; the
// steps the job then writes carry its own hashes and file.
TEST_F(CheckpointsTest, ResumesWithRaisedTrainingStepsAndSaysWhatChanges) {
  const std::string yaml = absl::StrReplaceAll(
      JobYaml(2, "mlp", /*steps=*/10),
      {{"{kind: sgd, lr: 0.1}",
        "{kind: sgd, lr: 0.1, schedule: {kind: cosine, warmup_steps: 2}}"}});
  WriteJobStep(yaml, 4);
  const std::string longer =
      absl::StrReplaceAll(yaml, {{"steps: 10,", "steps: 20,"}});
  absl::StatusOr<ResumePoint> point =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(longer),
                      job::JobTrainingHash(longer), longer);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->step, 4);
  EXPECT_FALSE(point->other_layout);  // The same cut: it is adopted.
  EXPECT_THAT(point->notes,
              ::testing::ElementsAre(
                  "training.steps raised from 10 to 20: the learning-rate "
                  "schedule (cosine, 2 warmup steps) now spans 20 steps "
                  "instead of 10, so from step 4 on the learning rate "
                  "follows the longer schedule"));
  const JobPlan plan = Plan(longer);
  EXPECT_TRUE(CheckResumeFitsPlan(*point, plan).ok());

  // The resumed job's next step records its own configuration, so resuming
  // that needs no note.
  WriteStep(plan, 6, true, job::JobConfigHash(longer),
            job::JobTrainingHash(longer), longer);
  absl::StatusOr<CheckpointManifest> written =
      LoadCompleteCheckpoint(dir_, 6, /*verify_checksums=*/true);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->job_yaml, longer);
  absl::StatusOr<ResumePoint> again =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(longer),
                      job::JobTrainingHash(longer), longer);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step, 6);
  EXPECT_THAT(again->notes, ::testing::IsEmpty());
}

TEST_F(CheckpointsTest, ChangedTrainingStepsOnAnotherLayoutOrLowered) {
  const std::string yaml = JobYaml(2, "mlp", /*steps=*/10);
  WriteJobStep(yaml, 4);
  // Another cut as well (one stage): resumes on the other layout.
  const std::string one_stage = absl::StrReplaceAll(
      yaml, {{"    - boundary\n", ""}, {"steps: 10,", "steps: 30,"}});
  absl::StatusOr<ResumePoint> point =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(one_stage),
                      job::JobTrainingHash(one_stage), one_stage);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_TRUE(point->other_layout);
  EXPECT_THAT(point->notes,
              ::testing::ElementsAre("training.steps raised from 10 to 30; the "
                                     "learning-rate schedule (constant) does "
                                     "not depend on it"));

  // Lowered, still past the checkpoint: allowed with a note.
  const std::string shorter =
      absl::StrReplaceAll(yaml, {{"steps: 10,", "steps: 6,"}});
  point = FindResumePoint(Latest(), dir_, job::JobConfigHash(shorter),
                          job::JobTrainingHash(shorter), shorter);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_THAT(
      point->notes,
      ::testing::ElementsAre(HasSubstr("training.steps lowered from 10 to 6")));
  EXPECT_TRUE(CheckResumeFitsPlan(*point, Plan(shorter)).ok());
  // Lowered to the checkpoint's step or below: nothing left to train.
  const std::string done =
      absl::StrReplaceAll(yaml, {{"steps: 10,", "steps: 4,"}});
  point = FindResumePoint(Latest(), dir_, job::JobConfigHash(done),
                          job::JobTrainingHash(done), done);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_THAT(CheckResumeFitsPlan(*point, Plan(done)).message(),
              HasSubstr("nothing left to train"));
}

// A manifest from before recorded configurations, or whose recorded file
// does not match its hashes, is refused by the hashes as before.
TEST_F(CheckpointsTest, WithoutATrustedRecordedFileRefusesByTheHashes) {
  const std::string yaml = JobYaml(2, "mlp", /*steps=*/10);
  const std::string longer =
      absl::StrReplaceAll(yaml, {{"steps: 10,", "steps: 20,"}});
  const JobPlan plan = Plan(yaml);
  WriteStep(plan, 2, true, job::JobConfigHash(yaml), job::JobTrainingHash(yaml),
            /*job_yaml=*/"");
  absl::StatusOr<ResumePoint> point =
      FindResumePoint(Latest(), dir_, job::JobConfigHash(longer),
                      job::JobTrainingHash(longer), longer);
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(point.status().message(),
              HasSubstr(absl::StrCat("another training configuration "
                                     "(training hash ",
                                     job::JobTrainingHash(yaml))));
  EXPECT_THAT(point.status().message(),
              HasSubstr("only the pipeline section and the stage boundaries "
                        "may change on resume (the checkpoint predates "
                        "recorded configurations"));

  // A recorded file edited after the fact (here: to say 20 steps) would
  // let the raised job through; its hashes give it away.
  WriteStep(plan, 4, true, job::JobConfigHash(yaml), job::JobTrainingHash(yaml),
            longer);
  point = FindResumePoint(Latest(), dir_, job::JobConfigHash(longer),
                          job::JobTrainingHash(longer), longer);
  EXPECT_EQ(point.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(point.status().message(),
              HasSubstr("the job file the checkpoint records does not match "
                        "its hashes"));
}

TEST_F(CheckpointsTest, MakeManifestCapsTheRecordedFile) {
  const std::string yaml = JobYaml(2, "mlp", /*steps=*/10);
  const JobPlan plan = Plan(yaml);
  const std::map<int, v1::StageFile> files;
  EXPECT_EQ(MakeManifest(plan, "job-1", "aa", "bb", yaml, 1, files, 1).job_yaml,
            yaml);
  const std::string huge =
      absl::StrCat(yaml, "# ", std::string(kMaxRecordedJobBytes, 'x'), "\n");
  EXPECT_THAT(
      MakeManifest(plan, "job-1", "aa", "bb", huge, 1, files, 1).job_yaml,
      ::testing::IsEmpty());
  // Under the cap, but escaping would make the manifest too large.
  const std::string escaped(kMaxRecordedJobBytes, '\x01');
  EXPECT_THAT(
      MakeManifest(plan, "job-1", "aa", "bb", escaped, 1, files, 1).job_yaml,
      ::testing::IsEmpty());
}

}  // namespace
}  // namespace conveyor::checkpoint
