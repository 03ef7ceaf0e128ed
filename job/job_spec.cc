#include "job/job_spec.h"

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "job/config_hash.h"
#include "job/internal/job_parser.h"
#include "job/parsed_job.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {

using engine::DataSource;
using engine::ModelSpec;
using engine::SampleShapes;
using job_internal::DefaultName;
using job_internal::JobParser;
using job_internal::kNoFileLabel;

// DataConfig is filled from the YAML alone. What depends on the model (the
// SampleShapes DataSource::Create validates it against, a tokens job's
// seq_len against input_shape) is the trainer's to check, with the model at
// hand.
absl::StatusOr<ParsedJob> ParseJob(absl::string_view yaml_text,
                                   absl::string_view file_name,
                                   absl::string_view base_dir) {
  const absl::string_view label = file_name.empty() ? kNoFileLabel : file_name;
  return CatchYamlExceptions(
      label, "the job spec", [&]() -> absl::StatusOr<ParsedJob> {
        ASSIGN_OR_RETURN(
            const YAML::Node doc,
            LoadYaml(yaml_text, label, YamlDocuments::kExactlyOne));
        ParsedJob parsed;
        ASSIGN_OR_RETURN(
            parsed.spec,
            JobParser(label, DefaultName(file_name), base_dir).Parse(doc));
        JobHashes hashes = HashJobDocument(&doc, yaml_text);
        parsed.config_hash = std::move(hashes.config);
        parsed.training_hash = std::move(hashes.training);
        parsed.yaml = std::string(yaml_text);
        parsed.file_name = std::string(file_name);
        parsed.base_dir = std::string(base_dir);
        return parsed;
      });
}

absl::StatusOr<ParsedJob> LoadJob(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path, kMaxJobFileBytes));
  return ParseJob(text, path,
                  std::filesystem::path(path).parent_path().string());
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view yaml_text,
                                     absl::string_view file_name,
                                     absl::string_view base_dir) {
  ASSIGN_OR_RETURN(ParsedJob parsed, ParseJob(yaml_text, file_name, base_dir));
  return std::move(parsed.spec);
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(ParsedJob parsed, LoadJob(path));
  return std::move(parsed.spec);
}

absl::StatusOr<std::unique_ptr<DataSource>> CreateEvalDataSource(
    const JobSpec& job) {
  absl::StatusOr<std::unique_ptr<DataSource>> data =
      DataSource::Create(job.eval.data, ModelSampleShapes(job.model));
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("eval.data: ", data.status().message()));
  }
  return data;
}

SampleShapes ModelSampleShapes(const ModelSpec& model) {
  int64_t vocab = 0;
  if (model.token_input && !model.layers.empty() &&
      model.layers.front().vocab_size > 0) {
    vocab = model.layers.front().vocab_size;
  }
  if (model.integer_targets && !model.output_shape.empty() &&
      model.output_shape.back() > 0) {
    vocab = vocab > 0 ? std::min(vocab, model.output_shape.back())
                      : model.output_shape.back();
  }
  return {.input = model.input_shape,
          .token_input = model.token_input,
          .target = model.target_shape,
          .integer_targets = model.integer_targets,
          .vocab = vocab};
}

}  // namespace conveyor::job
