// A job's configuration hashes: what a checkpoint records of the job that
// wrote it, so that resume refuses a checkpoint of another model, data,
// optimizer or training configuration, and knows when only the pipeline
// layout differs.
//
// Thread-safe (a pure function).
#ifndef CONVEYOR_JOB_CONFIG_HASH_H_
#define CONVEYOR_JOB_CONFIG_HASH_H_

#include <string>

#include "absl/strings/string_view.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {

// A 16-hex-digit hash (64-bit FNV-1a) of what a job file says about the
// training itself, recorded in every manifest so that a job is refused
// resuming from a checkpoint of a different model, data, optimizer,
// training or pipeline configuration. The YAML is hashed in a canonical
// form (maps by sorted key, sequences in order, scalars by their text,
// every item length-prefixed) without the top-level name, checkpoint,
// resume, restart, eval, priority and owner keys: comments, layout, key
// order, renaming the job, moving its checkpoints or scheduling it
// otherwise do not change the hash. Text that does not
// parse as one YAML document is hashed as is (callers pass job files the
// job parser accepted). The rule for what is left out is ConfigScope's
// (job/config_scope.h).
std::string JobConfigHash(absl::string_view yaml_text);

// JobConfigHash without what only says how the model is cut and run: the
// pipeline section and the model's stage boundaries (`- boundary` items,
// `boundary_every` and `boundaries`). Two jobs with equal training hashes
// train the same parameters from the same data in the same order, so a
// checkpoint of one resumes the other on any stage layout (checkpoint/
// resume.h). A different tag keeps it from ever equalling a config hash.
std::string JobTrainingHash(absl::string_view yaml_text);

struct JobHashes {
  std::string config;    // JobConfigHash
  std::string training;  // JobTrainingHash
};

// Both hashes of `yaml_text` from one YAML load.
JobHashes HashJobText(absl::string_view yaml_text);

// Both hashes of `yaml_text`, whose document `doc` the caller has already
// loaded (job::ParseJob; null: the text did not load, and is hashed as is).
JobHashes HashJobDocument(const YAML::Node* doc, absl::string_view yaml_text);

}  // namespace conveyor::job

#endif  // CONVEYOR_JOB_CONFIG_HASH_H_
