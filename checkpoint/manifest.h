// CheckpointManifest: the record that commits one step of a pipelined job's
// checkpoint (layout in checkpoint/layout.h). The workers write a stage file
// each; once every stage reported a durable file, the coordinator writes
//
//   <checkpoint_dir>/step-<N>/manifest.json
//
// naming the job, its configuration and training hashes, the stage cut, and
// every stage file's size and CRC-32C. The manifest is written last and
// atomically, so a step directory is complete exactly when it holds a manifest
// that parses and whose files match it; anything else (a crash while writing, a
// worker lost mid-save, a truncated or damaged file) is incomplete, and resume,
// export and pruning treat it as not existing:
//
//   ASSIGN_OR_RETURN(LatestCheckpoint latest,   // checkpoint/directory.h
//                    FindLatestCompleteCheckpoint(dir, /*verify=*/true));
//   // latest.manifest.stages[s].file is stage s's file in
//   // StepDirPath(dir, latest.manifest.step).
//
// The manifest is untrusted input when read back: ParseManifest rejects
// anything it would not have written, including file names that could point
// outside the step directory.
//
// Thread-safety: pure functions over their arguments and the filesystem.
// Concurrent calls are safe; concurrent writers of one step directory are
// not (the coordinator is the only writer of manifests).
#ifndef CONVEYOR_CHECKPOINT_MANIFEST_H_
#define CONVEYOR_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/layout.h"

namespace conveyor::checkpoint {

inline constexpr char kManifestFormat[] = "conveyor-checkpoint-v1";

// Larger manifests are refused unread: a real one is a few hundred bytes per
// stage, and the cap bounds what a hostile file can make the parser allocate.
inline constexpr int64_t kMaxManifestBytes = 1 << 20;
// Far above any pipeline we run.
inline constexpr int kMaxManifestStages = 4096;
// The most job file text a manifest records (CheckpointManifest::job_yaml):
// real job files are a few KiB, and the cap leaves the manifest far below
// kMaxManifestBytes even with every stage and every character escaped.
inline constexpr int64_t kMaxRecordedJobBytes = 256 << 10;

// One stage file as the manifest records it.
struct StageFileDigest {
  int stage = 0;
  // "stage-<stage>.safetensors", relative to the step directory.
  std::string file;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // common/crc32c.h of the whole file.

  friend bool operator==(const StageFileDigest&,
                         const StageFileDigest&) = default;
};

struct CheckpointManifest {
  std::string job;     // The job's name.
  std::string job_id;  // The coordinator's id of the run that wrote it.
  int64_t step = 0;
  // job::JobConfigHash of the job file; resume refuses a different one.
  std::string config_hash;
  // job::JobTrainingHash of the job file: a job whose training hash is equal
  // resumes it on another pipeline layout. Empty in manifests written
  // before it was recorded (they resume only with an equal config hash).
  std::string training_hash;
  // The job file as submitted, so that resume can name what differs from
  // another job's (job/config_diff.h) and allow a changed training.steps.
  // Empty in manifests written before it was recorded, and when the file
  // is over kMaxRecordedJobBytes; ParseManifest refuses a longer one.
  std::string job_yaml;
  int num_stages = 0;
  // The first layer of every stage: 0, then strictly increasing.
  std::vector<int> stage_begin;
  // One per stage; ParseManifest returns them sorted by stage, so
  // stages[s].stage == s.
  std::vector<StageFileDigest> stages;
  int64_t created_unix_ms = 0;

  friend bool operator==(const CheckpointManifest&,
                         const CheckpointManifest&) = default;
};

// The manifest as pretty-printed JSON with a fixed key order ("format" first)
// and the CRCs as 8 lowercase hex digits. Never fails: strings that are not
// UTF-8 have their bad bytes replaced (U+FFFD), so such a manifest does not
// parse back as equal.
std::string ManifestToJson(const CheckpointManifest& manifest);

// Parses and validates a manifest; `source` (a path) prefixes every error.
// Never throws or crashes whatever `json` holds. Returns InvalidArgument
// "source: field: problem" for: a text over kMaxManifestBytes, malformed or
// too deeply nested JSON, duplicate or unknown keys, a missing field or one
// of the wrong type, a format other than kManifestFormat, step < 0,
// created_unix_ms < 0, num_stages outside [1, kMaxManifestStages], stages
// that are not 0..num_stages-1 once each, a file name other than
// StageFileName(stage), stage_begin not num_stages layers strictly
// increasing from 0, a crc32c not 8 lowercase hex digits, an empty
// config_hash, a job_yaml that is present but empty or over
// kMaxRecordedJobBytes. (That the job_yaml is the one the hashes were taken
// of is for its reader to check: checkpoint/resume.h does.)
absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view json,
                                                 absl::string_view source);

// The size and CRC-32C of stage `stage`'s file in `step_dir`, read in chunks
// (files can be gigabytes). Returns the errno-derived code (NotFound,
// PermissionDenied, ...) with the path, or InvalidArgument if the path is
// not a regular file.
absl::StatusOr<StageFileDigest> DigestStageFile(const std::string& step_dir,
                                                int stage);

// Commits `manifest.step`: writes the manifest to
// <checkpoint_dir>/step-<N>/manifest.json atomically and durably (temporary
// file, fsync, rename, fsync of the directory), so a reader sees no
// manifest or the whole one, also after a crash. Call it only once every
// stage file is durable. Returns InvalidArgument for a manifest
// ParseManifest would reject (nothing is written), NotFound if the step
// directory does not exist, or the errno-derived code of the failed call.
absl::Status WriteManifest(const std::string& checkpoint_dir,
                           const CheckpointManifest& manifest);

// The manifest of step `step` in `checkpoint_dir`, if that step is complete:
// the manifest parses, names step `step`, and every stage file exists with
// the recorded size and, when `verify_checksums`, CRC-32C (which reads every
// file whole; sizes alone catch a crash mid-write). Returns:
//   NotFound            the step directory does not exist;
//   FailedPrecondition  "step N is incomplete: no manifest", or the step
//                       path is not a directory;
//   DataLoss            a manifest that does not parse or names another
//                       step; a stage file missing, of another size or
//                       checksum (naming the file and both values);
//   the errno-derived code when a file cannot be read.
absl::StatusOr<CheckpointManifest> LoadCompleteCheckpoint(
    const std::string& checkpoint_dir, int64_t step, bool verify_checksums);

}  // namespace conveyor::checkpoint

#endif  // CONVEYOR_CHECKPOINT_MANIFEST_H_
