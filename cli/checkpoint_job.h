// The job a Conveyor checkpoint's model is read with, for `conveyorctl
// generate` and `export --format hf`: a checkpoint holds tensors by name,
// and only a job says what model they make.
//
// Without --job it is the job file the manifest records (CheckpointManifest::
// job_yaml), once its text is checked against the manifest's hashes. With
// --job it is that file, which must describe the same model: equal hashes
// pass at once; otherwise its `model:` section is compared with the
// recorded one's, leaving out what does not make the model (init, remat,
// loss, stage boundaries, and the sequence length of a token model), and any
// difference there is refused, naming the keys (job/config_diff.h). Keys
// outside `model:` never block: training.steps, data, optimizer, pipeline,
// checkpoint, eval. Either way `--set key=value` overrides apply to the job
// first, and are compared the same way.
//
// Relative paths in the recorded job resolve against its job file's
// directory, which the manifest does not record. It is inferred from the
// job's checkpoint.dir, which named this checkpoint from there: with
// `checkpoint.dir: ../build/ckpt` and the checkpoint at /src/build/ckpt, the
// job's directory was a child of /src. Only model.from_hf is read when the
// job is parsed (its config.json makes the layers), so only it must resolve;
// when it cannot, the error says to give --job or --set model.from_hf=DIR.
//
// Two imports (model.from_hf) are the same model when they name the same
// directory or config.json files that parse equal; an import whose
// directory is gone cannot be compared and is left to the tensor check.
// Whatever the job, the checkpoint's tensors must then be exactly its
// model's parameters, name and shape (CheckParamsMatchModel,
// cli/checkpoint_params.h).
//
// Resume's check is another, stricter one (checkpoint/resume.h): a resumed
// job must also train the same way.
// Thread-compatible.
#ifndef CONVEYOR_CLI_CHECKPOINT_JOB_H_
#define CONVEYOR_CLI_CHECKPOINT_JOB_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/checkpoint_params.h"
#include "job/parsed_job.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::cli {

struct CheckpointJobOptions {
  std::string job_file = {};                // --job; empty: the recorded job.
  std::vector<std::string> overrides = {};  // --set key.path=value, in order.
};

struct CheckpointJob {
  job::ParsedJob parsed;
  // What the job is called in messages: the file, or "the job recorded in
  // <dir>/step-<N>/manifest.json".
  std::string name;
  // Lines for the user ("note: ..."), e.g. the keys outside the model in
  // which --job differs from the recorded job.
  std::vector<std::string> notes;
};

// The job for the checkpoint in `dir` loaded as `params`. Errors:
//   InvalidArgument     a bad job file or --set, or no --job for a
//                       checkpoint that records no job (older manifests,
//                       or a job file over 256 KiB);
//   FailedPrecondition  the job differs from the one that wrote the
//                       checkpoint in its model (naming the keys), or where
//                       that cannot be told (a recorded job that does not
//                       match the manifest's hashes, or none recorded and
//                       the hashes differ); a relative model.from_hf in the
//                       recorded job whose directory cannot be inferred;
//   the errors of reading the job file.
absl::StatusOr<CheckpointJob> ResolveCheckpointJob(
    const CheckpointParams& params, const std::string& dir,
    const CheckpointJobOptions& options);

// Where the recorded job's relative paths pointed: the job file's directory
// is `depth` unknown levels below `ancestor` (depth 0: `ancestor` is it).
// Unknown when the job's checkpoint.dir is absent or absolute, or does not
// end the way the checkpoint's path does (the checkpoint was moved).
struct RecordedJobDir {
  bool known = false;
  std::string ancestor;
  int depth = 0;
};

// The directory of the job that wrote the checkpoint in `checkpoint_dir`,
// from `recorded_doc`'s checkpoint.dir, as far as it can be told.
RecordedJobDir InferRecordedJobDir(const YAML::Node& recorded_doc,
                                   const std::string& checkpoint_dir);

// `path` as written in the recorded job, made absolute: itself when
// absolute; nullopt when it is relative and `dir` does not tell where it
// pointed (it climbs fewer levels than `dir.depth`, or `dir` is unknown).
std::optional<std::string> ResolveRecordedPath(const RecordedJobDir& dir,
                                               const std::string& path);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_CHECKPOINT_JOB_H_
