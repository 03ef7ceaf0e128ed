// JobParser: the parser of one job document (job/job_spec.h ParseJobSpec,
// job/parsed_job.h ParseJob), its sections split over three files:
// job_parser.cc reads the top level, the training loop and the optimizer;
// job_parser_data.cc the data; job_parser_run.cc how the job runs: the
// pipeline, checkpoint, resume, restart and eval sections, and the
// scheduling policy (priority, owner). Not API:
// job_spec.cc is its one user.
//
// Thread-compatible (one parser per document).
#ifndef CONVEYOR_JOB_INTERNAL_JOB_PARSER_H_
#define CONVEYOR_JOB_INTERNAL_JOB_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/yaml_reader.h"
#include "engine/data.h"
#include "engine/optimizer.h"
#include "job/job_spec.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job::job_internal {

// Bounds that keep later arithmetic in range: a step's sample positions
// [s*B, (s+1)*B) stay below 2^62 for any steps <= 2^38 and batch <= 2^24.
inline constexpr int64_t kMaxSteps = int64_t{1} << 38;
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 24;

// Errors of a document given without a file name carry this in its place.
inline constexpr absl::string_view kNoFileLabel = "<job>";

// The longest job name: it becomes a metric label and a column.
inline constexpr size_t kMaxJobNameBytes = 253;

// `path` against `base_dir` when it is relative and base_dir is given.
std::string Resolve(absl::string_view base_dir, const std::string& path);

// The name of a job that does not give one: the file's stem ("mlp" for
// "jobs/mlp.yaml"), or "job" for text without a file.
std::string DefaultName(absl::string_view file_name);

// Parses one job document; one per call, holding the reader and base dir.
class JobParser {
 public:
  // `file` labels errors; `default_name` is the job's name when the YAML
  // gives none.
  JobParser(absl::string_view file, std::string default_name,
            absl::string_view base_dir)
      : reader_(file),
        default_name_(std::move(default_name)),
        base_dir_(base_dir) {}

  absl::StatusOr<JobSpec> Parse(const YAML::Node& doc) const;

 private:
  // Rejects a key of `map` that is one of the section's keys but not one
  // that `what` takes: "'path' does not apply to source synthetic-regression;
  // it takes: ...". ReadMap has already rejected keys of no kind at all.
  absl::Status CheckKindKeys(const YamlMap& map, YamlNames allowed,
                             absl::string_view what) const;

  // job_parser_data.cc: a `data:` section (of the job or of eval), and the
  // checks of it against the model that need no file, each reported at the
  // position of the field it concerns.
  absl::Status ParseData(const YamlValue& value,
                         engine::DataConfig& data) const;
  absl::Status ParseDocuments(const YamlValue& value,
                              engine::DataConfig& data) const;
  absl::Status ParseBlend(const YamlValue& value,
                          engine::DataConfig& data) const;
  absl::Status CheckDataFits(const YamlValue& value,
                             const engine::DataConfig& data,
                             const engine::SampleShapes& shapes) const;
  absl::Status ParseTraining(const YamlValue& value,
                             TrainingSpec& training) const;
  absl::Status ParseOptimizer(const YamlValue& value,
                              const TrainingSpec& training,
                              engine::OptimizerConfig& optimizer) const;
  absl::Status ParseSchedule(const YamlValue& value,
                             const TrainingSpec& training,
                             const engine::OptimizerConfig& optimizer,
                             engine::LrSchedule& schedule) const;
  absl::Status ParseBetas(const YamlValue& value,
                          engine::OptimizerConfig& optimizer) const;
  // pipeline.tensor_parallel against the model: some layer splits, and
  // every split layer's counts divide (errors at the layer or the key).
  absl::Status CheckTensorParallelFits(const JobSpec& job) const;
  absl::Status ParsePipeline(const YamlMapEntry& entry,
                             const TrainingSpec& training,
                             PipelineSpec& pipeline) const;
  absl::StatusOr<double> ParseBytes(const YamlValue& value) const;
  absl::Status ParseCheckpoint(const YamlValue& value,
                               CheckpointSpec& checkpoint) const;
  absl::Status ParseResume(const YamlValue& value,
                           const CheckpointSpec& checkpoint,
                           ResumeSpec& resume) const;
  absl::Status ParseRestart(const YamlValue& value, RestartSpec& restart) const;
  absl::Status ParseEval(const YamlValue& value, const JobSpec& job,
                         EvalSpec& eval) const;
  // priority: a class name or an integer in [kMinPriority, kMaxPriority];
  // owner: a name IsValidOwner takes (job/job_policy.h).
  absl::StatusOr<int> ParsePriority(const YamlValue& value) const;
  absl::StatusOr<std::string> ParseOwner(const YamlValue& value) const;

  YamlReader reader_;
  std::string default_name_;
  std::string base_dir_;
};

}  // namespace conveyor::job::job_internal

#endif  // CONVEYOR_JOB_INTERNAL_JOB_PARSER_H_
