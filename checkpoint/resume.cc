#include "checkpoint/resume.h"

#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/directory.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "engine/profiler.h"
#include "job/config_diff.h"
#include "job/config_hash.h"
#include "job/stage_cut.h"

namespace conveyor::checkpoint {

using job::JobPlan;
using job::StagePlan;
namespace {

// What may differ from a checkpoint's job: with its job file recorded, and
// without (only the hashes can be compared then).
constexpr absl::string_view kOnlyLayoutMayChange =
    "only the pipeline section, the stage boundaries and training.steps may "
    "change on resume";
constexpr absl::string_view kOnlyLayoutMayChangeByHash =
    "only the pipeline section and the stage boundaries may change on resume";

// The note a resume with another training.steps carries.
std::string DescribeStepsChange(const job::StepsChange& c, int64_t step) {
  const bool raised = c.new_steps > c.old_steps;
  std::string note =
      absl::StrCat("training.steps ", raised ? "raised" : "lowered", " from ",
                   c.old_steps, " to ", c.new_steps);
  if (c.schedule_kind != "cosine") {
    absl::StrAppend(&note, "; the learning-rate schedule (", c.schedule_kind,
                    ") does not depend on it");
    return note;
  }
  const std::string schedule = absl::StrCat(
      "the learning-rate schedule (cosine",
      c.warmup_steps > 0 ? absl::StrCat(", ", c.warmup_steps, " warmup steps")
                         : "",
      ")");
  if (c.new_span != c.old_span) {
    absl::StrAppend(&note, ": ", schedule, " now spans ", c.new_span,
                    " steps instead of ", c.old_span, ", so from step ", step,
                    " on the learning rate follows the ",
                    c.new_span > c.old_span ? "longer" : "shorter",
                    " schedule");
  } else {
    absl::StrAppend(&note, ": ", schedule, " still spans its total_steps, ",
                    c.new_span);
    if (c.new_steps > c.new_span) {
      absl::StrAppend(&note, "; the steps after it train at min_lr");
    }
  }
  return note;
}

// A manifest and the checkpoint directory it was found in.
struct FoundManifest {
  CheckpointManifest manifest;
  std::string checkpoint_dir;
};

// The newest committed step of `dir`; a damaged one is refused with what to
// do about it, never passed over for an older one.
absl::StatusOr<LatestCheckpoint> FindLatest(const std::string& dir) {
  absl::StatusOr<LatestCheckpoint> latest =
      FindLatestCompleteCheckpoint(dir, /*verify_checksums=*/false);
  if (absl::IsDataLoss(latest.status())) {
    return absl::DataLossError(absl::StrCat(
        latest.status().message(),
        ". Resume from an older step by its path (resume: DIR/step-N), or "
        "move the damaged step out of the checkpoint directory"));
  }
  return latest;
}

absl::StatusOr<FoundManifest> FindManifest(const job::ResumeSpec& resume,
                                           const std::string& checkpoint_dir) {
  if (resume.kind == job::ResumeSpec::Kind::kLatest) {
    ASSIGN_OR_RETURN(LatestCheckpoint latest, FindLatest(checkpoint_dir));
    return FoundManifest{std::move(latest.manifest), checkpoint_dir};
  }
  const std::filesystem::path path(resume.path);
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("resume: ", resume.path, " is not a directory"));
  }
  // "…/step-N" is one step; any other directory is a checkpoint directory,
  // resumed from its newest complete step.
  const std::filesystem::path normal = path.lexically_normal();
  const std::filesystem::path leaf = normal.has_filename()
                                         ? normal.filename()
                                         : normal.parent_path().filename();
  if (std::optional<int64_t> step = StepOfDirName(leaf.string())) {
    const std::filesystem::path parent =
        normal.has_filename() ? normal.parent_path()
                              : normal.parent_path().parent_path();
    ASSIGN_OR_RETURN(CheckpointManifest manifest,
                     LoadCompleteCheckpoint(parent.string(), *step,
                                            /*verify_checksums=*/false));
    return FoundManifest{std::move(manifest), parent.string()};
  }
  ASSIGN_OR_RETURN(LatestCheckpoint latest, FindLatest(resume.path));
  const std::filesystem::path dir =
      normal.has_filename() ? normal : normal.parent_path();
  return FoundManifest{std::move(latest.manifest), dir.string()};
}

}  // namespace

ResumePoint ResumePointOf(const CheckpointManifest& manifest,
                          const std::string& checkpoint_dir) {
  ResumePoint point;
  point.step = manifest.step;
  point.step_dir = StepDirPath(checkpoint_dir, manifest.step);
  point.stage_begin = manifest.stage_begin;
  for (const StageFileDigest& d : manifest.stages) {
    v1::StageFile& f = point.files.emplace_back();
    f.set_stage(d.stage);
    f.set_file(d.file);
    f.set_bytes(d.bytes);
    f.set_crc32c(d.crc32c);
  }
  return point;
}

v1::CheckpointRef ToProto(const ResumePoint& point) {
  v1::CheckpointRef ref;
  ref.set_step(point.step);
  ref.set_step_dir(point.step_dir);
  for (int b : point.stage_begin) ref.add_stage_begin(b);
  for (const v1::StageFile& f : point.files) *ref.add_files() = f;
  ref.set_other_layout(point.other_layout);
  return ref;
}

ResumePoint FromProto(const v1::CheckpointRef& ref) {
  ResumePoint point;
  point.step = ref.step();
  point.step_dir = ref.step_dir();
  point.stage_begin.assign(ref.stage_begin().begin(), ref.stage_begin().end());
  point.files.assign(ref.files().begin(), ref.files().end());
  point.other_layout = ref.other_layout();
  return point;
}

absl::StatusOr<ResumePoint> FindResumePoint(const job::ResumeSpec& resume,
                                            const std::string& checkpoint_dir,
                                            const std::string& config_hash,
                                            const std::string& training_hash,
                                            absl::string_view job_yaml) {
  absl::StatusOr<FoundManifest> found = FindManifest(resume, checkpoint_dir);
  const std::string what =
      resume.kind == job::ResumeSpec::Kind::kLatest
          ? absl::StrCat("resume: latest (in ", checkpoint_dir, ")")
          : absl::StrCat("resume: ", resume.path);
  if (!found.ok()) {
    // Never a silent fresh start: the job is refused with the reason.
    return absl::Status(
        found.status().code(),
        absl::StrCat(what, ": ", found.status().message(),
                     "; the job was asked to resume, so it does not start "
                     "from scratch"));
  }
  const CheckpointManifest& manifest = found->manifest;
  if (manifest.config_hash == config_hash) {
    return ResumePointOf(manifest, found->checkpoint_dir);
  }
  // Another pipeline layout of the same training: every parameter and its
  // optimizer state is found by its global name, whichever stage file holds
  // it.
  if (!manifest.training_hash.empty() &&
      manifest.training_hash == training_hash) {
    ResumePoint point = ResumePointOf(manifest, found->checkpoint_dir);
    point.other_layout = true;
    return point;
  }
  if (manifest.training_hash.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": step ", manifest.step, " was written by job '", manifest.job,
        "' with another configuration (config hash ", manifest.config_hash,
        ", this job's ", config_hash,
        "): its model, data, optimizer, training or pipeline section differs "
        "(the checkpoint predates training hashes, so its pipeline section "
        "and stage boundaries must match too)"));
  }
  const std::string written_by =
      absl::StrCat(what, ": step ", manifest.step, " was written by job '",
                   manifest.job, "' with another training configuration");
  // What is not known is said as the hashes (the message before manifests
  // recorded their job file).
  auto refuse_by_hash = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        written_by, " (training hash ", manifest.training_hash, ", this job's ",
        training_hash,
        "): its model, data, optimizer or training section differs; ",
        kOnlyLayoutMayChangeByHash, " (", why, ")"));
  };
  if (manifest.job_yaml.empty()) {
    return refuse_by_hash(absl::StrCat(
        "the checkpoint predates recorded configurations, or its job file "
        "was over ",
        kMaxRecordedJobBytes / 1024, " KiB, so what differs is not known"));
  }
  if (job_yaml.empty()) {
    return refuse_by_hash("this job's file was not given to compare");
  }
  // The recorded file decides what may resume, so it must be the one the
  // hashes were taken of: a damaged or edited one is not trusted.
  const job::JobHashes recorded = job::HashJobText(manifest.job_yaml);
  if (recorded.config != manifest.config_hash ||
      recorded.training != manifest.training_hash) {
    return refuse_by_hash(
        "the job file the checkpoint records does not match its hashes, so "
        "what differs is not known");
  }
  absl::StatusOr<job::ConfigDiff> diff = job::DiffJobConfigs(
      manifest.job_yaml, job_yaml, job::ConfigScope::kTraining);
  if (!diff.ok() || diff->empty()) {
    // Cannot be for two job files the parser accepted with other hashes.
    return refuse_by_hash(diff.ok() ? "no key differs"
                                    : std::string(diff.status().message()));
  }
  // A longer (or shorter) run of the same training. Lowering training.steps
  // is allowed as raising is, as long as it stays past the checkpoint's
  // step (CheckResumeFitsPlan refuses the rest): the checkpoint holds the
  // state after its step whatever comes later, and either way the only
  // other change is the length of a cosine schedule that follows
  // training.steps, which the note spells out. Refusing would only make
  // the user shorten a run by cancelling it at the step they want.
  if (std::optional<job::StepsChange> change =
          job::FindStepsChange(*diff, manifest.job_yaml, job_yaml)) {
    ResumePoint point = ResumePointOf(manifest, found->checkpoint_dir);
    // The checkpoint's cut is adopted only when the layout is the job's
    // own: the whole configurations differ in nothing else.
    absl::StatusOr<job::ConfigDiff> whole = job::DiffJobConfigs(
        manifest.job_yaml, job_yaml, job::ConfigScope::kConfig);
    point.other_layout =
        !whole.ok() ||
        !job::FindStepsChange(*whole, manifest.job_yaml, job_yaml).has_value();
    point.notes.push_back(DescribeStepsChange(*change, manifest.step));
    return point;
  }
  // training.steps (and the schedule length that follows it) may change:
  // listing it among the causes and then saying it may change read as a
  // contradiction. What is refused is the rest.
  job::ConfigDiff refused = *diff;
  bool steps_too = false;
  for (const job::ConfigDifference& d : diff->differences) {
    if (d.path == "training.steps" &&
        d.kind == job::ConfigDifference::Kind::kChanged) {
      steps_too = true;
    }
  }
  if (steps_too) {
    std::erase_if(refused.differences, [](const job::ConfigDifference& d) {
      return d.path == "training.steps" ||
             d.path == "optimizer.schedule.total_steps";
    });
    refused.total -= static_cast<int64_t>(diff->differences.size() -
                                          refused.differences.size());
  }
  return absl::FailedPreconditionError(absl::StrCat(
      written_by, ": ", job::DescribeConfigDiff(refused), "; ",
      kOnlyLayoutMayChange,
      steps_too ? " (training.steps differs too, which alone would resume)"
                : ""));
}

absl::Status AdoptCheckpointCut(const ResumePoint& point, job::JobSpec& spec) {
  if (!spec.pipeline.auto_stages || point.other_layout) {
    return absl::OkStatus();
  }
  absl::StatusOr<job::StageCut> cut = job::StageCut::Create(
      point.stage_begin, static_cast<int>(spec.model.layers.size()));
  if (absl::Status s = cut.ok() ? cut->ApplyTo(&spec.model) : cut.status();
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume: the checkpoint's stages (first layers ",
                     absl::StrJoin(point.stage_begin, ", "),
                     ") do not fit this model: ", s.message()));
  }
  spec.pipeline.auto_stages = false;
  return absl::OkStatus();
}

absl::Status CheckResumeFitsPlan(const ResumePoint& point,
                                 const JobPlan& plan) {
  // The cut may differ (each rank reads the files holding its parameters,
  // job/rank_program.h), but it must be one of this model: resume maps
  // layers to the checkpoint's stage files by it.
  const size_t layers = plan.job.model.layers.size();
  const std::vector<int>& begin = point.stage_begin;
  if (!job::StageCut::Create(begin, static_cast<int>(layers)).ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume: ", point.step_dir, " holds ", begin.size(),
        " stages starting at layers [", absl::StrJoin(begin, ", "),
        "], which is not a cut of this job's ", layers, " layers"));
  }
  if (point.step >= plan.job.training.steps) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume: ", point.step_dir, " is step ", point.step,
                     " and training.steps is ", plan.job.training.steps,
                     ": the job has nothing left to train"));
  }
  return absl::OkStatus();
}

absl::Status CheckNothingNewer(const std::string& checkpoint_dir,
                               int64_t start_step) {
  absl::StatusOr<std::vector<int64_t>> steps =
      ListCheckpointSteps(checkpoint_dir);
  if (!steps.ok()) {
    return steps.status().code() == absl::StatusCode::kNotFound
               ? absl::OkStatus()
               : steps.status();
  }
  for (auto it = steps->rbegin(); it != steps->rend() && *it > start_step;
       ++it) {
    if (LoadCompleteCheckpoint(checkpoint_dir, *it,
                               /*verify_checksums=*/false)
            .ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", checkpoint_dir,
          " already holds a complete checkpoint of an earlier run (step ", *it,
          "), newer than where this job starts (step ", start_step,
          "); continue that run with 'resume: latest', or use another "
          "checkpoint.dir, or remove the old one (conveyorctl run "
          "--overwrite does)"));
    }
  }
  return absl::OkStatus();
}

CheckpointManifest MakeManifest(const JobPlan& plan, const std::string& job_id,
                                const std::string& config_hash,
                                const std::string& training_hash,
                                absl::string_view job_yaml, int64_t step,
                                const std::map<int, v1::StageFile>& files,
                                int64_t now_unix_ms) {
  CheckpointManifest m;
  m.job = plan.job.name;
  m.job_id = job_id;
  m.step = step;
  m.config_hash = config_hash;
  m.training_hash = training_hash;
  m.num_stages = plan.num_stages;
  for (const StagePlan& s : plan.stages) m.stage_begin.push_back(s.first_layer);
  for (const auto& [stage, f] : files) {
    m.stages.push_back({.stage = stage,
                        .file = f.file(),
                        .bytes = f.bytes(),
                        .crc32c = f.crc32c()});
  }
  m.created_unix_ms = now_unix_ms;
  // A checkpoint without its job file still resumes with an equal hash; one
  // whose manifest could not be read back would not resume at all.
  if (job_yaml.size() <= static_cast<size_t>(kMaxRecordedJobBytes)) {
    m.job_yaml = std::string(job_yaml);
    if (ManifestToJson(m).size() > static_cast<size_t>(kMaxManifestBytes)) {
      m.job_yaml.clear();
    }
  }
  return m;
}

}  // namespace conveyor::checkpoint
