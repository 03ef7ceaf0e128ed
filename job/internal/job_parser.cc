#include "job/internal/job_parser.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <limits>
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
#include "engine/tensor_parallel_layout.h"
#include "hf/model.h"
#include "scheduler/schedule.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job::job_internal {

using engine::DataSource;
using engine::kMaxModelDimension;
using engine::kPrecisionNames;
using engine::LrSchedule;
using engine::OptimizerConfig;
using engine::ParseModelSpec;
using engine::Precision;

namespace {

constexpr absl::string_view kTopKeys[] = {
    "name",       "model",  "data",    "training", "optimizer", "pipeline",
    "checkpoint", "resume", "restart", "eval",     "priority",  "owner"};
constexpr absl::string_view kTrainingKeys[] = {"steps", "batch_size",
                                               "microbatches", "precision"};

// optimizer: likewise, all keys and then those of each kind.
constexpr absl::string_view kOptimizerKinds[] = {"sgd", "adam", "adamw"};
constexpr absl::string_view kOptimizerKeys[] = {
    "kind",  "lr",  "momentum",     "nesterov",       "dampening",
    "betas", "eps", "weight_decay", "clip_grad_norm", "schedule"};
constexpr absl::string_view kSgdKeys[] = {
    "kind",      "lr",           "momentum",       "nesterov",
    "dampening", "weight_decay", "clip_grad_norm", "schedule"};
constexpr absl::string_view kAdamKeys[] = {
    "kind", "lr", "betas", "eps", "weight_decay", "clip_grad_norm", "schedule"};

// optimizer.schedule, in the order of LrSchedule::Kind.
constexpr absl::string_view kScheduleKinds[] = {"constant", "linear-warmup",
                                                "cosine"};
constexpr absl::string_view kScheduleKeys[] = {"kind", "warmup_steps",
                                               "total_steps", "min_lr"};
constexpr absl::string_view kConstantKeys[] = {"kind"};
constexpr absl::string_view kLinearWarmupKeys[] = {"kind", "warmup_steps"};
constexpr absl::string_view kCosineKeys[] = {"kind", "warmup_steps",
                                             "total_steps", "min_lr"};

}  // namespace

std::string Resolve(absl::string_view base_dir, const std::string& path) {
  if (base_dir.empty() || path.empty() ||
      std::filesystem::path(path).is_absolute()) {
    return path;
  }
  return (std::filesystem::path(std::string(base_dir)) / path).string();
}

std::string DefaultName(absl::string_view file_name) {
  std::string stem =
      std::filesystem::path(std::string(file_name)).stem().string();
  if (stem.empty()) return "job";
  // A file's name may hold anything; the job's may not (see Parse).
  stem = Printable(stem);
  if (stem.size() > kMaxJobNameBytes) stem.resize(kMaxJobNameBytes);
  return stem;
}

absl::Status JobParser::CheckKindKeys(const YamlMap& map, YamlNames allowed,
                                      absl::string_view what) const {
  const YamlMapEntry* entry = YamlReader::FirstUnknownKey(map, allowed);
  if (entry == nullptr) return absl::OkStatus();
  return YamlError(entry->key_where, map.self.path,
                   absl::StrCat("'", entry->key, "' does not apply to ", what,
                                "; it takes: ", absl::StrJoin(allowed, ", ")));
}

absl::StatusOr<JobSpec> JobParser::Parse(const YAML::Node& doc) const {
  const YamlValue root = reader_.Root(doc);
  ASSIGN_OR_RETURN(const YamlMap top, reader_.ReadMap(root, kTopKeys));
  JobSpec job;

  if (const YamlMapEntry* name = top.Find("name"); name != nullptr) {
    ASSIGN_OR_RETURN(job.name, reader_.ParseString(name->value));
    // Names reach terminals, logs and metric labels: control characters
    // (ESC would rewrite an operator's screen) are refused, as in worker
    // names.
    if (job.name.empty() || job.name.size() > kMaxJobNameBytes ||
        HasControlCharacters(job.name)) {
      return reader_.Error(
          name->value, absl::StrCat("must be 1 to ", kMaxJobNameBytes,
                                    " bytes without control characters; got \"",
                                    Printable(job.name.substr(0, 64)),
                                    job.name.size() > 64 ? "..." : "", "\""));
    }
  } else {
    job.name = default_name_;
  }

  ASSIGN_OR_RETURN(const YamlMapEntry* model, reader_.Require(top, "model"));
  // Checked here because ParseModelSpec sees only the node, and yaml-cpp
  // marks an empty value at the next token rather than at its key.
  if (!model->value.node.IsMap()) {
    return reader_.Error(
        model->value,
        absl::StrCat("must be a map; got ", DescribeYaml(model->value.node)));
  }
  ASSIGN_OR_RETURN(job.model,
                   ParseModelSpec(model->value.node, reader_.file()));
  job.model.init_from = Resolve(base_dir_, job.model.init_from);
  if (!job.model.from_hf.empty()) {
    // The layers come from the checkpoint's config.json, read here (the
    // weights only when training starts), so that a checkpoint the model
    // cannot represent fails at submission, at from_hf's position.
    job.model.from_hf = Resolve(base_dir_, job.model.from_hf);
    absl::StatusOr<hf::HfLlamaConfig> config =
        hf::ReadHfLlamaConfig(job.model.from_hf);
    if (!config.ok()) {
      return YamlError(job.model.from_hf_where, "model.from_hf",
                       config.status().message());
    }
    RETURN_IF_ERROR(hf::ExpandHfModel(*config, &job.model));
  }

  ASSIGN_OR_RETURN(const YamlMapEntry* data, reader_.Require(top, "data"));
  RETURN_IF_ERROR(ParseData(data->value, job.data));
  RETURN_IF_ERROR(
      CheckDataFits(data->value, job.data, ModelSampleShapes(job.model)));

  ASSIGN_OR_RETURN(const YamlMapEntry* training,
                   reader_.Require(top, "training"));
  RETURN_IF_ERROR(ParseTraining(training->value, job.training));

  ASSIGN_OR_RETURN(const YamlMapEntry* optimizer,
                   reader_.Require(top, "optimizer"));
  RETURN_IF_ERROR(
      ParseOptimizer(optimizer->value, job.training, job.optimizer));

  if (const YamlMapEntry* pipeline = top.Find("pipeline");
      pipeline != nullptr) {
    RETURN_IF_ERROR(ParsePipeline(*pipeline, job.training, job.pipeline));
    RETURN_IF_ERROR(CheckTensorParallelFits(job));
  } else {
    job.pipeline.where = SourceLocation{reader_.file(), 0, 0};
  }
  if (const YamlMapEntry* checkpoint = top.Find("checkpoint");
      checkpoint != nullptr) {
    RETURN_IF_ERROR(ParseCheckpoint(checkpoint->value, job.checkpoint));
  }
  if (const YamlMapEntry* resume = top.Find("resume"); resume != nullptr) {
    RETURN_IF_ERROR(ParseResume(resume->value, job.checkpoint, job.resume));
  }
  if (const YamlMapEntry* restart = top.Find("restart"); restart != nullptr) {
    RETURN_IF_ERROR(ParseRestart(restart->value, job.restart));
  }
  if (const YamlMapEntry* eval = top.Find("eval"); eval != nullptr) {
    RETURN_IF_ERROR(ParseEval(eval->value, job, job.eval));
  }
  if (const YamlMapEntry* priority = top.Find("priority");
      priority != nullptr) {
    ASSIGN_OR_RETURN(job.priority, ParsePriority(priority->value));
  }
  if (const YamlMapEntry* owner = top.Find("owner"); owner != nullptr) {
    ASSIGN_OR_RETURN(job.owner, ParseOwner(owner->value));
  }
  return job;
}

absl::Status JobParser::CheckTensorParallelFits(const JobSpec& job) const {
  const int64_t ranks = job.pipeline.tensor_parallel;
  if (ranks <= 1) return absl::OkStatus();
  if (!engine::StageSplits(job.model, -1)) {
    return YamlError(job.pipeline.tensor_parallel_where,
                     "pipeline.tensor_parallel",
                     absl::StrCat("no layer of this model splits over ", ranks,
                                  " ranks (llama_block and transformer_block "
                                  "do; the other kinds run whole on every "
                                  "rank), so every rank "
                                  "would compute the whole model"));
  }
  return engine::CheckTensorParallel(job.model, ranks);
}

absl::Status JobParser::ParseTraining(const YamlValue& value,
                                      TrainingSpec& training) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kTrainingKeys));
  // steps and batch_size have no sensible default; microbatches does (1: no
  // pipelining within a step).
  ASSIGN_OR_RETURN(const YamlMapEntry* steps, reader_.Require(map, "steps"));
  ASSIGN_OR_RETURN(training.steps,
                   reader_.ParseInt(steps->value, 1, kMaxSteps));
  ASSIGN_OR_RETURN(const YamlMapEntry* batch,
                   reader_.Require(map, "batch_size"));
  ASSIGN_OR_RETURN(training.batch_size,
                   reader_.ParseInt(batch->value, 1, kMaxBatchSize));
  if (const YamlMapEntry* e = map.Find("microbatches"); e != nullptr) {
    ASSIGN_OR_RETURN(training.microbatches,
                     reader_.ParseInt(e->value, 1, kMaxBatchSize));
  }
  if (const YamlMapEntry* e = map.Find("precision"); e != nullptr) {
    ASSIGN_OR_RETURN(const int index,
                     reader_.ParseEnum(e->value, kPrecisionNames));
    training.precision = static_cast<Precision>(index);
  }
  if (training.batch_size % training.microbatches != 0) {
    return reader_.Error(
        batch->value,
        absl::StrCat(
            "batch_size = ", training.batch_size,
            " is not a multiple of microbatches = ", training.microbatches,
            ": every microbatch must hold the same number of "
            "samples"));
  }
  return absl::OkStatus();
}

absl::Status JobParser::ParseOptimizer(const YamlValue& value,
                                       const TrainingSpec& training,
                                       OptimizerConfig& optimizer) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kOptimizerKeys));
  ASSIGN_OR_RETURN(const YamlMapEntry* kind, reader_.Require(map, "kind"));
  ASSIGN_OR_RETURN(const int kind_index,
                   reader_.ParseEnum(kind->value, kOptimizerKinds));
  static constexpr OptimizerConfig::Kind kKinds[] = {
      OptimizerConfig::Kind::kSgd, OptimizerConfig::Kind::kAdam,
      OptimizerConfig::Kind::kAdamW};
  optimizer.kind = kKinds[kind_index];
  const bool sgd = optimizer.kind == OptimizerConfig::Kind::kSgd;
  RETURN_IF_ERROR(
      CheckKindKeys(map, sgd ? YamlNames(kSgdKeys) : YamlNames(kAdamKeys),
                    absl::StrCat("kind ", kOptimizerKinds[kind_index])));

  if (const YamlMapEntry* e = map.Find("lr"); e != nullptr) {
    ASSIGN_OR_RETURN(optimizer.lr, reader_.ParseNonNegativeDouble(e->value));
  }
  if (const YamlMapEntry* e = map.Find("weight_decay"); e != nullptr) {
    ASSIGN_OR_RETURN(optimizer.weight_decay,
                     reader_.ParseNonNegativeDouble(e->value));
  }
  if (const YamlMapEntry* e = map.Find("clip_grad_norm"); e != nullptr) {
    ASSIGN_OR_RETURN(optimizer.clip_grad_norm,
                     reader_.ParsePositiveDouble(e->value));
  }
  if (sgd) {
    if (const YamlMapEntry* e = map.Find("momentum"); e != nullptr) {
      ASSIGN_OR_RETURN(optimizer.momentum,
                       reader_.ParseNonNegativeDouble(e->value));
    }
    if (const YamlMapEntry* e = map.Find("dampening"); e != nullptr) {
      ASSIGN_OR_RETURN(optimizer.dampening,
                       reader_.ParseNonNegativeDouble(e->value));
    }
    if (const YamlMapEntry* e = map.Find("nesterov"); e != nullptr) {
      ASSIGN_OR_RETURN(optimizer.nesterov, reader_.ParseBool(e->value));
      // torch.optim.SGD's rule; checked here so the error has a position.
      if (optimizer.nesterov &&
          (optimizer.momentum <= 0 || optimizer.dampening != 0)) {
        return reader_.Error(
            e->value, absl::StrCat("nesterov needs momentum > 0 and "
                                   "dampening = 0; got momentum = ",
                                   optimizer.momentum,
                                   ", dampening = ", optimizer.dampening));
      }
    }
  } else {
    if (const YamlMapEntry* e = map.Find("betas"); e != nullptr) {
      RETURN_IF_ERROR(ParseBetas(e->value, optimizer));
    }
    if (const YamlMapEntry* e = map.Find("eps"); e != nullptr) {
      ASSIGN_OR_RETURN(optimizer.eps, reader_.ParseNonNegativeDouble(e->value));
    }
  }
  if (const YamlMapEntry* e = map.Find("schedule"); e != nullptr) {
    RETURN_IF_ERROR(
        ParseSchedule(e->value, training, optimizer, optimizer.schedule));
  }
  return absl::OkStatus();
}

absl::Status JobParser::ParseBetas(const YamlValue& value,
                                   OptimizerConfig& optimizer) const {
  if (!value.node.IsSequence() || value.node.size() != 2) {
    return reader_.Error(
        value, absl::StrCat("must be a list of two numbers [beta1, beta2], "
                            "each in [0, 1); got ",
                            value.node.IsSequence()
                                ? absl::StrCat("a list of ", value.node.size())
                                : DescribeYaml(value.node)));
  }
  double betas[2];
  for (size_t i = 0; i < 2; ++i) {
    const YamlValue item = reader_.Element(value, i);
    ASSIGN_OR_RETURN(betas[i], reader_.ParseNumber(item));
    if (!(betas[i] >= 0 && betas[i] < 1)) {
      return reader_.Error(
          item, absl::StrCat("must be in [0, 1); got ", item.node.Scalar()));
    }
  }
  optimizer.beta1 = betas[0];
  optimizer.beta2 = betas[1];
  return absl::OkStatus();
}

absl::Status JobParser::ParseSchedule(const YamlValue& value,
                                      const TrainingSpec& training,
                                      const OptimizerConfig& optimizer,
                                      LrSchedule& schedule) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kScheduleKeys));
  ASSIGN_OR_RETURN(const YamlMapEntry* kind, reader_.Require(map, "kind"));
  ASSIGN_OR_RETURN(const int kind_index,
                   reader_.ParseEnum(kind->value, kScheduleKinds));
  static constexpr LrSchedule::Kind kKinds[] = {LrSchedule::Kind::kConstant,
                                                LrSchedule::Kind::kLinearWarmup,
                                                LrSchedule::Kind::kCosine};
  static constexpr YamlNames kKeys[] = {kConstantKeys, kLinearWarmupKeys,
                                        kCosineKeys};
  schedule.kind = kKinds[kind_index];
  RETURN_IF_ERROR(CheckKindKeys(
      map, kKeys[kind_index],
      absl::StrCat("schedule kind ", kScheduleKinds[kind_index])));

  const YamlMapEntry* warmup = map.Find("warmup_steps");
  if (schedule.kind == LrSchedule::Kind::kLinearWarmup) {
    // Without warmup steps it is the constant schedule under another name.
    ASSIGN_OR_RETURN(warmup, reader_.Require(map, "warmup_steps"));
    ASSIGN_OR_RETURN(schedule.warmup_steps,
                     reader_.ParseInt(warmup->value, 1, kMaxSteps));
  }
  if (schedule.kind != LrSchedule::Kind::kCosine) return absl::OkStatus();

  if (warmup != nullptr) {
    ASSIGN_OR_RETURN(schedule.warmup_steps,
                     reader_.ParseInt(warmup->value, 0, kMaxSteps));
  }
  // Absent total_steps stays 0, "training.steps", and is resolved when the
  // optimizer is built (ResolveSchedule), so a later override of the step
  // count (conveyorctl run --steps) still decays over the whole run. It is
  // checked against training.steps here all the same, to report it in place.
  const YamlMapEntry* total = map.Find("total_steps");
  if (total != nullptr) {
    ASSIGN_OR_RETURN(schedule.total_steps,
                     reader_.ParseInt(total->value, 1, kMaxSteps));
  }
  const int64_t effective_total =
      total != nullptr ? schedule.total_steps : training.steps;
  if (effective_total <= schedule.warmup_steps) {
    // At total_steps when given, else at warmup_steps (the one written).
    const YamlValue& at = total != nullptr    ? total->value
                          : warmup != nullptr ? warmup->value
                                              : value;
    return reader_.Error(
        at, absl::StrCat("cosine needs total_steps > warmup_steps; got "
                         "total_steps = ",
                         effective_total,
                         total != nullptr ? "" : " (training.steps)",
                         ", warmup_steps = ", schedule.warmup_steps));
  }
  if (const YamlMapEntry* e = map.Find("min_lr"); e != nullptr) {
    ASSIGN_OR_RETURN(schedule.min_lr, reader_.ParseNonNegativeDouble(e->value));
    if (schedule.min_lr > optimizer.lr) {
      return reader_.Error(
          e->value, absl::StrCat("must be at most lr = ", optimizer.lr,
                                 " (cosine decays from lr to min_lr); got ",
                                 schedule.min_lr));
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor::job::job_internal
