// Checkpoints as the coordinator uses them: where a job resumes from, and
// the manifest that commits a step once every stage's file is in.
//
// Workers write the stage files (checkpoint/stage_file.h); the coordinator is
// the only writer of manifests (checkpoint/manifest.h), so a step
// counts as complete exactly when every stage reported a durable file and
// the manifest naming their sizes and CRC-32C was written after them.
//
// Thread-safe (pure functions over the filesystem).
#ifndef CONVEYOR_CHECKPOINT_RESUME_H_
#define CONVEYOR_CHECKPOINT_RESUME_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "conveyor/v1/conveyor.pb.h"
#include "job/job_spec.h"
#include "job/planner.h"

namespace conveyor::checkpoint {

// A complete checkpoint step a job starts after.
struct ResumePoint {
  int64_t step = 0;
  std::string step_dir;
  std::vector<int> stage_begin;      // The cut the checkpoint was taken with.
  std::vector<v1::StageFile> files;  // By stage.
  // Written by a job with another pipeline layout (an equal training hash,
  // another config hash): its cut is not adopted, and each rank reads the
  // files that hold its parameters (job/rank_program.h).
  bool other_layout = false;
  // What resuming changes, for the job's log, e.g. "training.steps raised
  // from 100 to 200: the learning-rate schedule (cosine, 10 warmup steps)
  // now spans 200 steps instead of 100 ...". Said once, when the job is
  // submitted: not kept in the state file's CheckpointRef.
  std::vector<std::string> notes;
};

// Resolves `resume` for a job whose file is `job_yaml` and whose hashes
// are `config_hash` and `training_hash` (job/config_hash.h of `job_yaml`):
//   kLatest: the newest complete step in `checkpoint_dir`;
//   kPath:   the step directory at resume.path ("…/step-N"), or, when the
//            path is a checkpoint directory, its newest complete step.
// The step resumes when its config hash is the job's, or, with
// other_layout set, when its training hash is (only the pipeline section
// or the stage boundaries differ), or, when its manifest records its job
// file, when training.steps is all that differs besides those (with a
// note saying what that changes; a cosine schedule's total_steps may change
// along with it). Sizes are checked, checksums are left to the workers that
// read the files. Errors say what was found: NotFound for a missing path;
// FailedPrecondition for no complete step (with why each was passed over),
// an incomplete step, or a checkpoint of another training configuration
// (naming the keys that differ with both values, job/config_diff.h, or,
// for a manifest that does not record its job file, both hashes); DataLoss
// for a stage file whose size differs from its manifest.
absl::StatusOr<ResumePoint> FindResumePoint(const job::ResumeSpec& resume,
                                            const std::string& checkpoint_dir,
                                            const std::string& config_hash,
                                            const std::string& training_hash,
                                            absl::string_view job_yaml);

// A stages: auto job resumes with the cut its checkpoint was written with,
// so the model is not profiled again: cuts `spec` there and makes it a
// markers job for the planner. No-op for other jobs and for a checkpoint of
// another layout (the job's own pipeline section decides its cut).
// FailedPrecondition when the cut does not fit the model.
absl::Status AdoptCheckpointCut(const ResumePoint& point, job::JobSpec& spec);

// FailedPrecondition unless the checkpoint fits `plan`: its cut is one of
// the plan's model (the plan's own cut may differ), and its step is before
// training.steps (a finished job has nothing left to resume).
absl::Status CheckResumeFitsPlan(const ResumePoint& point,
                                 const job::JobPlan& plan);

// FailedPrecondition when `checkpoint_dir` holds a complete step newer than
// `start_step` (where a job starts: 0, or its resume step): the job would
// overwrite another run's checkpoints, and retention, which keeps the newest
// complete steps, would delete the job's own as it wrote them. OK when the
// directory does not exist or holds nothing newer.
absl::Status CheckNothingNewer(const std::string& checkpoint_dir,
                               int64_t start_step);

// The manifest committing `step` of a job from its stages' reported files
// (by stage; all of plan.num_stages present). The hashes and `job_yaml` are
// the running job's own, also when it resumed a checkpoint of another
// training.steps, so its steps resume with its file. `job_yaml` is left out
// when it is over kMaxRecordedJobBytes or would make the manifest too large.
CheckpointManifest MakeManifest(const job::JobPlan& plan,
                                const std::string& job_id,
                                const std::string& config_hash,
                                const std::string& training_hash,
                                absl::string_view job_yaml, int64_t step,
                                const std::map<int, v1::StageFile>& files,
                                int64_t now_unix_ms);

// The resume point a restart uses: the step `manifest` committed.
ResumePoint ResumePointOf(const CheckpointManifest& manifest,
                          const std::string& checkpoint_dir);

// A resume point as the coordinator's state file keeps it, and back.
v1::CheckpointRef ToProto(const ResumePoint& point);
ResumePoint FromProto(const v1::CheckpointRef& ref);

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_CHECKPOINT_RESUME_H_
