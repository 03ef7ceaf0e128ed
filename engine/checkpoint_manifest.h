// CheckpointManifest: the record that commits one step of a pipelined job's
// checkpoint (layout in engine/stage_file.h). The workers write a stage file
// each; once every stage reported a durable file, the coordinator writes
//
//   <checkpoint_dir>/step-<N>/manifest.json
//
// naming the job, its configuration hash, the stage cut, and every stage
// file's size and CRC-32C. The manifest is written last and atomically, so a
// step directory is complete exactly when it holds a manifest that parses and
// whose files match it; anything else (a crash while writing, a worker lost
// mid-save, a truncated or damaged file) is incomplete, and resume, export
// and pruning treat it as not existing:
//
//   ASSIGN_OR_RETURN(LatestCheckpoint latest,
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
#ifndef CONVEYOR_ENGINE_CHECKPOINT_MANIFEST_H_
#define CONVEYOR_ENGINE_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/stage_file.h"

namespace conveyor::engine {

inline constexpr char kManifestFormat[] = "conveyor-checkpoint-v1";

// Larger manifests are refused unread: a real one is a few hundred bytes per
// stage, and the cap bounds what a hostile file can make the parser allocate.
inline constexpr int64_t kMaxManifestBytes = 1 << 20;
// Far above any pipeline we run.
inline constexpr int kMaxManifestStages = 4096;

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
  // JobConfigHash of the job file; resume refuses a different one.
  std::string config_hash;
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
// config_hash.
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

// The N of every step-<N> directory in `checkpoint_dir`, ascending. Only
// canonical non-negative decimals count ("step-01", "step-x", "step-1.tmp"
// and files are ignored). Returns NotFound "no such checkpoint directory"
// if it does not exist, FailedPrecondition if it is not a directory, the
// errno-derived code if it cannot be listed.
absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(
    const std::string& checkpoint_dir);

struct LatestCheckpoint {
  CheckpointManifest manifest;
  // Why each newer (uncommitted) step was passed over, newest first.
  std::vector<std::string> skipped;
};

// The newest step that LoadCompleteCheckpoint accepts, passing over newer
// steps that were never committed (no manifest: a crash while saving).
// Returns ListCheckpointSteps' errors; DataLoss when the newest committed
// step fails its checks (a truncated or altered file, a damaged manifest),
// naming it and the newest intact step before it, since resuming from an
// older step must be the caller's choice; the error of a step whose state
// cannot be read (e.g. PermissionDenied); or FailedPrecondition "no
// complete checkpoint" with the reasons (the first few) when no step is
// committed.
absl::StatusOr<LatestCheckpoint> FindLatestCompleteCheckpoint(
    const std::string& checkpoint_dir, bool verify_checksums);

// Deletes old step directories and returns the steps removed, ascending.
// Keeps the newest `keep_latest` complete steps (complete: the manifest and
// file sizes check out; checksums are not read) and removes older complete
// ones and every incomplete step directory older than the newest complete
// step (leftovers of a crash). Never removes the newest complete step and
// never touches a step newer than it, which may be being written; so with no
// complete step, or keep_latest <= 0, it removes nothing. Returns
// ListCheckpointSteps' errors, the error of a step whose completeness cannot
// be decided (e.g. PermissionDenied), or the errno-derived code of a failed
// removal (steps removed before it stay removed).
absl::StatusOr<std::vector<int64_t>> PruneCheckpoints(
    const std::string& checkpoint_dir, int keep_latest);

// Creates `checkpoint_dir` if it is missing and writes, fsyncs and removes
// a probe file there, so that a job whose checkpoints cannot be written is
// refused when it is submitted rather than failing at its first checkpoint
// (a read-only directory once failed a job after 2 of 3 steps, losing
// them). FailedPrecondition naming the directory and the cause (read-only
// file system, permission, not a directory, full disk).
absl::Status CheckCheckpointDirWritable(const std::string& checkpoint_dir);

// Deletes every step-<N> directory in `checkpoint_dir`, complete or not,
// newest first (so a failure part way leaves only older steps), and returns
// the steps removed, ascending: a fresh start over an earlier run's
// checkpoints (`conveyorctl run --overwrite`). Nothing else in the directory
// is touched. A missing directory has nothing to remove. Returns
// ListCheckpointSteps' other errors, or the errno-derived code of a failed
// removal (steps removed before it stay removed).
absl::StatusOr<std::vector<int64_t>> RemoveAllCheckpoints(
    const std::string& checkpoint_dir);

// A 16-hex-digit hash (64-bit FNV-1a) of what a job file says about the
// training itself, recorded in every manifest so that a job is refused
// resuming from a checkpoint of a different model, data, optimizer,
// training or pipeline configuration. The YAML is hashed in a canonical
// form (maps by sorted key, sequences in order, scalars by their text,
// every item length-prefixed) without the top-level name, checkpoint,
// resume and restart sections: comments, layout, key order, renaming the
// job or moving its checkpoints do not change the hash. Text that does not
// parse as one YAML document is hashed as is (callers pass job files the
// job parser accepted).
std::string JobConfigHash(absl::string_view yaml_text);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CHECKPOINT_MANIFEST_H_
