#include "job/job_spec.h"

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
#include "common/file.h"
#include "common/printable.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "engine/data.h"
#include "engine/model_spec.h"
#include "engine/optimizer.h"
#include "hf/model.h"
#include "job/config_hash.h"
#include "job/parsed_job.h"
#include "scheduler/schedule.h"
#include "yaml-cpp/yaml.h"

namespace conveyor::job {

using engine::DataConfig;
using engine::DataKindName;
using engine::DataSource;
using engine::kMaxModelDimension;
using engine::kPrecisionNames;
using engine::LrSchedule;
using engine::ModelSpec;
using engine::OptimizerConfig;
using engine::ParseDataKind;
using engine::ParseModelSpec;
using engine::Precision;
using engine::SampleShapes;
namespace {

// Bounds that keep later arithmetic in range: a step's sample positions
// [s*B, (s+1)*B) stay below 2^62 for any steps <= 2^38 and batch <= 2^24.
constexpr int64_t kMaxSteps = int64_t{1} << 38;
constexpr int64_t kMaxBatchSize = int64_t{1} << 24;
constexpr int64_t kMaxVirtualStages = 1024;
constexpr int64_t kMaxDevicesPerStage = 64;
constexpr int64_t kMaxKeepLatest = int64_t{1} << 20;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
// Token ids a file can hold: one byte or a little-endian uint16.
constexpr int64_t kByteVocab = 256;
constexpr int64_t kUint16Vocab = 65536;

// Errors of a document given without a file name carry this in its place.
constexpr absl::string_view kNoFileLabel = "<job>";

constexpr absl::string_view kTopKeys[] = {
    "name",     "model",      "data",   "training", "optimizer",
    "pipeline", "checkpoint", "resume", "restart",  "eval"};
constexpr absl::string_view kTrainingKeys[] = {"steps", "batch_size",
                                               "microbatches", "precision"};
constexpr absl::string_view kPipelineKeys[] = {
    "schedule",      "virtual_stages",    "stages", "num_stages",
    "memory_budget", "devices_per_stage", "workers"};
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

// data: every key any source takes, then the keys of each source, so that a
// key of another source is reported as misplaced rather than unknown.
constexpr absl::string_view kDataKeys[] = {
    "source", "seed",       "shuffle", "path",       "seq_len",
    "uint16", "vocab_size", "noise",   "num_samples"};
constexpr absl::string_view kSyntheticKeys[] = {"source", "seed", "shuffle",
                                                "noise", "num_samples"};
constexpr absl::string_view kTensorsKeys[] = {"source", "seed", "shuffle",
                                              "path"};
constexpr absl::string_view kTokensKeys[] = {
    "source", "seed", "shuffle", "path", "seq_len", "uint16", "vocab_size"};

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

// `path` against `base_dir` when it is relative and base_dir is given.
std::string Resolve(absl::string_view base_dir, const std::string& path) {
  if (base_dir.empty() || path.empty() ||
      std::filesystem::path(path).is_absolute()) {
    return path;
  }
  return (std::filesystem::path(std::string(base_dir)) / path).string();
}

// The name of a job that does not give one: the file's stem ("mlp" for
// "jobs/mlp.yaml"), or "job" for text without a file.
// The longest job name: it becomes a metric label and a column.
constexpr size_t kMaxJobNameBytes = 253;

std::string DefaultName(absl::string_view file_name) {
  std::string stem =
      std::filesystem::path(std::string(file_name)).stem().string();
  if (stem.empty()) return "job";
  // A file's name may hold anything; the job's may not (see Parse).
  stem = Printable(stem);
  if (stem.size() > kMaxJobNameBytes) stem.resize(kMaxJobNameBytes);
  return stem;
}

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

  absl::Status ParseData(const YamlValue& value, DataConfig& data) const;
  absl::Status ParseTraining(const YamlValue& value,
                             TrainingSpec& training) const;
  absl::Status ParseOptimizer(const YamlValue& value,
                              const TrainingSpec& training,
                              OptimizerConfig& optimizer) const;
  absl::Status ParseSchedule(const YamlValue& value,
                             const TrainingSpec& training,
                             const OptimizerConfig& optimizer,
                             LrSchedule& schedule) const;
  absl::Status ParseBetas(const YamlValue& value,
                          OptimizerConfig& optimizer) const;
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

  YamlReader reader_;
  std::string default_name_;
  std::string base_dir_;
};

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
  // The data must fit the model. The checks that need no file run here, so a
  // mismatch is reported at the data section rather than when training
  // starts.
  if (absl::Status fits =
          CheckDataShapes(job.data, ModelSampleShapes(job.model));
      !fits.ok()) {
    return reader_.Error(data->value, fits.message());
  }

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
  return job;
}

absl::Status JobParser::ParseData(const YamlValue& value,
                                  DataConfig& data) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kDataKeys));
  ASSIGN_OR_RETURN(const YamlMapEntry* source, reader_.Require(map, "source"));
  ASSIGN_OR_RETURN(const std::string source_name,
                   reader_.ParseString(source->value));
  absl::StatusOr<DataConfig::Kind> kind = ParseDataKind(source_name);
  if (!kind.ok()) return reader_.Error(source->value, kind.status().message());
  data.kind = *kind;

  YamlNames keys;
  switch (data.kind) {
    case DataConfig::Kind::kSyntheticRegression:
      keys = kSyntheticKeys;
      break;
    case DataConfig::Kind::kTensors:
      keys = kTensorsKeys;
      break;
    case DataConfig::Kind::kTokens:
      keys = kTokensKeys;
      break;
  }
  RETURN_IF_ERROR(CheckKindKeys(
      map, keys, absl::StrCat("source ", DataKindName(data.kind))));

  if (const YamlMapEntry* e = map.Find("seed"); e != nullptr) {
    ASSIGN_OR_RETURN(data.seed, reader_.ParseUint64(e->value));
  }
  if (const YamlMapEntry* e = map.Find("shuffle"); e != nullptr) {
    ASSIGN_OR_RETURN(data.shuffle, reader_.ParseBool(e->value));
  }
  if (data.kind != DataConfig::Kind::kSyntheticRegression) {
    ASSIGN_OR_RETURN(const YamlMapEntry* path, reader_.Require(map, "path"));
    ASSIGN_OR_RETURN(const std::string p, reader_.ParseString(path->value));
    data.path = Resolve(base_dir_, p);
  }
  if (data.kind == DataConfig::Kind::kTokens) {
    // Required although DataConfig would take it from the model (0): the
    // window length is the one thing a tokens file does not say by itself,
    // so the job states it and DataSource::Create checks it against the
    // model's input_shape.
    ASSIGN_OR_RETURN(const YamlMapEntry* seq_len,
                     reader_.Require(map, "seq_len"));
    ASSIGN_OR_RETURN(data.seq_len,
                     reader_.ParseInt(seq_len->value, 1, kMaxModelDimension));
    if (const YamlMapEntry* e = map.Find("uint16"); e != nullptr) {
      ASSIGN_OR_RETURN(data.uint16_tokens, reader_.ParseBool(e->value));
    }
    if (const YamlMapEntry* e = map.Find("vocab_size"); e != nullptr) {
      const int64_t max = data.uint16_tokens ? kUint16Vocab : kByteVocab;
      absl::StatusOr<int64_t> vocab = reader_.ParseInt(e->value, 1, kInt64Max);
      if (vocab.ok() && *vocab > max) {
        return reader_.Error(
            e->value,
            absl::StrCat("must be at most ", max, " for ",
                         data.uint16_tokens ? "uint16" : "byte",
                         " tokens; got ", *vocab,
                         data.uint16_tokens ? ""
                                            : " (set uint16: true for "
                                              "vocabularies above 256)"));
      }
      ASSIGN_OR_RETURN(data.vocab_size, std::move(vocab));
    }
  }
  if (data.kind == DataConfig::Kind::kSyntheticRegression) {
    if (const YamlMapEntry* e = map.Find("noise"); e != nullptr) {
      ASSIGN_OR_RETURN(data.noise, reader_.ParseNonNegativeDouble(e->value));
    }
    if (const YamlMapEntry* e = map.Find("num_samples"); e != nullptr) {
      ASSIGN_OR_RETURN(data.num_samples,
                       reader_.ParseInt(e->value, 0, kInt64Max));
    }
  }
  return absl::OkStatus();
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
    // Each device takes an equal share of every microbatch's samples.
    if (training.microbatch_size() % pipeline.devices_per_stage != 0) {
      return reader_.Error(
          e->value,
          absl::StrCat("each device of a stage takes an equal share of a "
                       "microbatch, so devices_per_stage must divide the "
                       "microbatch size (batch_size / microbatches = ",
                       training.microbatch_size(), "); got ",
                       pipeline.devices_per_stage));
    }
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

absl::Status JobParser::ParseEval(const YamlValue& value, const JobSpec& job,
                                  EvalSpec& eval) const {
  ASSIGN_OR_RETURN(const YamlMap map, reader_.ReadMap(value, kEvalKeys));
  // Evaluating on the training data would measure nothing a user wants to
  // know, so the validation data is never implied.
  ASSIGN_OR_RETURN(const YamlMapEntry* data, reader_.Require(map, "data"));
  RETURN_IF_ERROR(ParseData(data->value, eval.data));
  if (absl::Status fits =
          CheckDataShapes(eval.data, ModelSampleShapes(job.model));
      !fits.ok()) {
    return reader_.Error(data->value, fits.message());
  }
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

}  // namespace

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
