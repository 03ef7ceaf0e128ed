#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/printable.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "engine/data.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "hf/model.h"
#include "job/internal/job_parser.h"
#include "job/job_policy.h"
#include "scheduler/schedule.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job::job_internal {

namespace {

constexpr int64_t kMaxVirtualStages = 1024;
constexpr int64_t kMaxDevicesPerStage = 64;
constexpr int64_t kMaxKeepLatest = int64_t{1} << 20;
constexpr absl::string_view kPipelineKeys[] = {
    "schedule",      "virtual_stages",    "stages",          "num_stages",
    "memory_budget", "devices_per_stage", "tensor_parallel", "workers"};
constexpr absl::string_view kStagesModes[] = {"markers", "auto"};
// Largest memory budget accepted (1 EiB): anything above is a typo.
constexpr double kMaxMemoryBudget = 1152921504606846976.0;
constexpr absl::string_view kCheckpointKeys[] = {"dir", "every", "keep_latest"};
constexpr absl::string_view kRestartKeys[] = {"max_restarts", "elastic"};
constexpr absl::string_view kElasticKeys[] = {"min_workers"};
// A pipeline of more workers than this is beyond any cluster we plan for.
constexpr int64_t kMaxElasticWorkers = 4096;
constexpr absl::string_view kEvalKeys[] = {"every", "batches", "data"};
// More restarts than this is a crash loop, not a policy.
constexpr int64_t kMaxRestarts = 1000;

}  // namespace

absl::Status JobParser::ParsePipeline(const YamlMapEntry& entry,
                                      const TrainingSpec& training,
                                      PipelineSpec& pipeline) const {
  ASSIGN_OR_RETURN(const YamlMap map,
                   reader_.ReadMap(entry.value, kPipelineKeys));
  // Where the planner reports schedule errors: the schedule's name, else the
  // section.
  pipeline.where = entry.value.where;
  if (const YamlMapEntry* e = map.Find("schedule"); e != nullptr) {
    ASSIGN_OR_RETURN(pipeline.schedule, reader_.ParseString(e->value));
    pipeline.where = e->value.where;
  }
  pipeline.auto_schedule = pipeline.schedule == "auto";
  if (const YamlMapEntry* e = map.Find("virtual_stages");
      e != nullptr && pipeline.auto_schedule) {
    return reader_.Error(e->value,
                         "schedule: auto chooses virtual_stages; leave it out");
  } else if (e != nullptr) {
    ASSIGN_OR_RETURN(pipeline.virtual_stages,
                     reader_.ParseInt(e->value, 1, kMaxVirtualStages));
  } else if (absl::StatusOr<scheduler::ScheduleKind> kind =
                 scheduler::ParseScheduleKind(pipeline.schedule);
             kind.ok()) {
    // zb-v and dualpipev always hold two stages a rank; saying so is
    // optional. (An unknown name is the planner's to report.)
    pipeline.virtual_stages = scheduler::DefaultVirtualStages(*kind);
  }
  if (const YamlMapEntry* e = map.Find("devices_per_stage"); e != nullptr) {
    ASSIGN_OR_RETURN(pipeline.devices_per_stage,
                     reader_.ParseInt(e->value, 1, kMaxDevicesPerStage));
    pipeline.devices_per_stage_where = e->value.where;
  }
  const YamlMapEntry* tensor_parallel = map.Find("tensor_parallel");
  if (tensor_parallel != nullptr) {
    ASSIGN_OR_RETURN(
        pipeline.tensor_parallel,
        reader_.ParseInt(tensor_parallel->value, 1, kMaxDevicesPerStage));
    pipeline.tensor_parallel_where = tensor_parallel->value.where;
    if (pipeline.devices_per_stage % pipeline.tensor_parallel != 0) {
      return reader_.Error(
          tensor_parallel->value,
          absl::StrCat("a stage's mesh of devices_per_stage (",
                       pipeline.devices_per_stage,
                       ") devices splits into replicas of tensor_parallel "
                       "devices each, so tensor_parallel must divide it; got ",
                       pipeline.tensor_parallel));
    }
  }
  // Each replica of a stage takes an equal share of every microbatch's
  // samples (its tensor-parallel ranks share theirs).
  if (const int64_t replicas =
          pipeline.devices_per_stage / pipeline.tensor_parallel;
      training.microbatch_size() % replicas != 0) {
    const YamlMapEntry* e = map.Find("devices_per_stage");
    return reader_.Error(
        e->value,
        absl::StrCat("each replica of a stage (devices_per_stage / "
                     "tensor_parallel = ",
                     replicas,
                     ") takes an equal share of a microbatch, so it must "
                     "divide the microbatch size (batch_size / microbatches = ",
                     training.microbatch_size(), ")"));
  }
  if (const YamlMapEntry* e = map.Find("stages"); e != nullptr) {
    ASSIGN_OR_RETURN(const int mode, reader_.ParseEnum(e->value, kStagesModes));
    pipeline.auto_stages = mode == 1;
  }
  const YamlMapEntry* num_stages = map.Find("num_stages");
  const YamlMapEntry* budget = map.Find("memory_budget");
  const YamlMapEntry* workers = map.Find("workers");
  if (workers != nullptr && !pipeline.auto_schedule) {
    return reader_.Error(workers->value,
                         "only applies with schedule: auto (otherwise the "
                         "stages and virtual_stages give the workers)");
  }
  if (pipeline.auto_schedule && !pipeline.auto_stages) {
    return reader_.Error(map.Find("schedule")->value,
                         "schedule: auto chooses the cut with the schedule: "
                         "set stages: auto and workers: P");
  }
  if (pipeline.auto_schedule) {
    if (num_stages != nullptr) {
      return reader_.Error(num_stages->value,
                           "schedule: auto chooses num_stages (workers x "
                           "virtual stages); give workers: P instead");
    }
    if (workers == nullptr) {
      return reader_.Error(entry.value,
                           "schedule: auto needs workers (how many pipeline "
                           "ranks to choose a schedule for)");
    }
    ASSIGN_OR_RETURN(pipeline.workers,
                     reader_.ParseInt(workers->value, 1, kMaxAutoStages));
    // The planner's provisional plan: one stage a worker.
    pipeline.num_stages = pipeline.workers;
    pipeline.num_stages_where = workers->value.where;
  }
  if (!pipeline.auto_stages) {
    // Without auto the markers decide; a stage count or budget there would
    // be silently ignored, so it is an error instead.
    for (const YamlMapEntry* e : {num_stages, budget}) {
      if (e != nullptr) {
        return reader_.Error(
            e->value,
            "only applies with stages: auto (the model's boundary "
            "markers define the stages otherwise)");
      }
    }
    return absl::OkStatus();
  }
  if (num_stages == nullptr && !pipeline.auto_schedule) {
    return reader_.Error(entry.value,
                         "stages: auto needs num_stages (how many pipeline "
                         "stages to cut the model into)");
  }
  if (num_stages != nullptr) {
    ASSIGN_OR_RETURN(pipeline.num_stages,
                     reader_.ParseInt(num_stages->value, 1, kMaxAutoStages));
    pipeline.num_stages_where = num_stages->value.where;
  }
  if (budget != nullptr) {
    ASSIGN_OR_RETURN(pipeline.memory_budget_bytes, ParseBytes(budget->value));
    pipeline.memory_budget_where = budget->value.where;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> JobParser::ParseBytes(const YamlValue& value) const {
  constexpr absl::string_view kRule =
      "must be a positive number of bytes, optionally with a unit: KB, MB, "
      "GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)";
  ASSIGN_OR_RETURN(const std::string text, reader_.ParseString(value));
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  // A plain number ("17179869184", "1.6e10") is bytes; otherwise digits and
  // a unit.
  size_t digits = 0;
  double number = 0;
  if (absl::SimpleAtod(trimmed, &number)) digits = trimmed.size();
  while (digits < trimmed.size() &&
         (absl::ascii_isdigit(trimmed[digits]) || trimmed[digits] == '.')) {
    ++digits;
  }
  if (digits == 0 || !absl::SimpleAtod(trimmed.substr(0, digits), &number)) {
    return reader_.Error(value, absl::StrCat(kRule, "; got '", text, "'"));
  }
  const absl::string_view unit =
      absl::StripAsciiWhitespace(trimmed.substr(digits));
  static constexpr std::pair<absl::string_view, double> kUnits[] = {
      {"", 1},          {"B", 1},
      {"KB", 1e3},      {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},
      {"KiB", 1 << 10}, {"MiB", 1 << 20},
      {"GiB", 1 << 30}, {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = number * scale;
    if (!(bytes >= 1) || bytes > kMaxMemoryBudget) {
      return reader_.Error(value,
                           absl::StrCat(kRule,
                                        ", at least 1 byte and at most 1 EiB; "
                                        "got '",
                                        text, "'"));
    }
    return bytes;
  }
  return reader_.Error(value, absl::StrCat(kRule, "; got unit '", unit, "'"));
}

absl::Status JobParser::ParseCheckpoint(const YamlValue& value,
                                        CheckpointSpec& checkpoint) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kCheckpointKeys));
  // A checkpoint section without a directory could only be a mistake: every
  // and keep_latest mean nothing without one, and leaving the section out is
  // how a job says "no checkpoints".
  ASSIGN_OR_RETURN(const YamlMapEntry* dir, reader_.Require(map, "dir"));
  ASSIGN_OR_RETURN(const std::string d, reader_.ParseString(dir->value));
  checkpoint.dir = Resolve(base_dir_, d);
  if (const YamlMapEntry* e = map.Find("every"); e != nullptr) {
    ASSIGN_OR_RETURN(checkpoint.every,
                     reader_.ParseInt(e->value, 0, kMaxSteps));
  }
  if (const YamlMapEntry* e = map.Find("keep_latest"); e != nullptr) {
    ASSIGN_OR_RETURN(checkpoint.keep_latest,
                     reader_.ParseInt(e->value, 0, kMaxKeepLatest));
  }
  return absl::OkStatus();
}

absl::Status JobParser::ParseResume(const YamlValue& value,
                                    const CheckpointSpec& checkpoint,
                                    ResumeSpec& resume) const {
  ASSIGN_OR_RETURN(const std::string text, reader_.ParseString(value));
  resume.where = value.where;
  if (text == "latest") {
    // "latest" of what: without a checkpoint directory there is nothing to
    // look in, and starting from scratch instead would be silent data loss.
    if (checkpoint.dir.empty()) {
      return reader_.Error(value,
                           "'latest' needs checkpoint.dir, where the job's "
                           "checkpoints are; or give the checkpoint's path");
    }
    resume.kind = ResumeSpec::Kind::kLatest;
    return absl::OkStatus();
  }
  resume.kind = ResumeSpec::Kind::kPath;
  resume.path = Resolve(base_dir_, text);
  return absl::OkStatus();
}

absl::Status JobParser::ParseRestart(const YamlValue& value,
                                     RestartSpec& restart) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kRestartKeys));
  ASSIGN_OR_RETURN(const YamlMapEntry* max,
                   reader_.Require(map, "max_restarts"));
  ASSIGN_OR_RETURN(restart.max_restarts,
                   reader_.ParseInt(max->value, 0, kMaxRestarts));
  if (const YamlMapEntry* elastic = map.Find("elastic"); elastic != nullptr) {
    ASSIGN_OR_RETURN(const YamlMap e,
                     reader_.ReadMap(elastic->value, kElasticKeys));
    ASSIGN_OR_RETURN(const YamlMapEntry* min,
                     reader_.Require(e, "min_workers"));
    ASSIGN_OR_RETURN(restart.elastic_min_workers,
                     reader_.ParseInt(min->value, 1, kMaxElasticWorkers));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> JobParser::ParsePriority(const YamlValue& value) const {
  const std::string allowed = absl::StrCat(
      "one of ", absl::StrJoin(kPriorityClasses, ", "), " (", kPriorityLow,
      ", ", kPriorityNormal, ", ", kPriorityHigh, ", ", kPriorityUrgent,
      ") or an integer in [", kMinPriority, ", ", kMaxPriority, "]");
  if (!value.node.IsScalar()) {
    return reader_.Error(value, absl::StrCat("must be ", allowed, "; got ",
                                             DescribeYaml(value.node)));
  }
  const std::string& text = value.node.Scalar();
  if (const std::optional<int> named = PriorityOfClass(text)) return *named;
  int64_t number = 0;
  if (!text.empty() &&
      text.find_first_not_of("0123456789") == std::string::npos &&
      absl::SimpleAtoi(text, &number) && number >= kMinPriority &&
      number <= kMaxPriority) {
    return static_cast<int>(number);
  }
  return reader_.Error(value,
                       absl::StrCat("must be ", allowed, "; got \"",
                                    Printable(text.substr(0, 64)), "\""));
}

absl::StatusOr<std::string> JobParser::ParseOwner(
    const YamlValue& value) const {
  if (value.node.IsScalar() && IsValidOwner(value.node.Scalar())) {
    return value.node.Scalar();
  }
  return reader_.Error(
      value,
      absl::StrCat(
          "must be 1 to ", kMaxOwnerBytes, " characters of ", kOwnerCharacters,
          "; got ",
          value.node.IsScalar()
              ? absl::StrCat("\"", Printable(value.node.Scalar().substr(0, 64)),
                             "\"")
              : DescribeYaml(value.node)));
}

absl::Status JobParser::ParseEval(const YamlValue& value, const JobSpec& job,
                                  EvalSpec& eval) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kEvalKeys));
  // Evaluating on the training data would measure nothing a user wants to
  // know, so the validation data is never implied.
  ASSIGN_OR_RETURN(const YamlMapEntry* data, reader_.Require(map, "data"));
  RETURN_IF_ERROR(ParseData(data->value, eval.data));
  RETURN_IF_ERROR(
      CheckDataFits(data->value, eval.data, ModelSampleShapes(job.model)));
  if (const YamlMapEntry* e = map.Find("every"); e != nullptr) {
    ASSIGN_OR_RETURN(eval.every, reader_.ParseInt(e->value, 0, kMaxSteps));
  }
  if (const YamlMapEntry* e = map.Find("batches"); e != nullptr) {
    ASSIGN_OR_RETURN(eval.batches,
                     reader_.ParseInt(e->value, 1, kMaxEvalMicrobatches));
    // K * M microbatches run as one forward-only schedule.
    const int64_t m = job.training.microbatches;
    if (eval.batches > kMaxEvalMicrobatches / m) {
      return reader_.Error(
          e->value,
          absl::StrCat("batches * training.microbatches (", eval.batches, " * ",
                       m, ") must be at most ", kMaxEvalMicrobatches));
    }
  }
  eval.enabled = true;
  eval.where = value.where;
  return absl::OkStatus();
}

}  // namespace conveyor::job::job_internal
