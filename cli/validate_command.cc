#include "cli/validate_command.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "checkpoint/directory.h"
#include "cli/job_file.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/data.h"
#include "engine/profiler.h"
#include "engine/safetensors.h"
#include "engine/stage.h"
#include "hf/checkpoint.h"
#include "job/planner.h"
#include "nlohmann/json.hpp"
#include "scheduler/schedule.h"
#include "transport/tcp/loopback_latency.h"

namespace conveyor::cli {

CLI::App* AddValidateCommand(CLI::App& app, ValidateCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Check a job file as the coordinator would, without one, and print its "
      "pipeline plan and the number of workers it needs");
  cmd->add_option("job", o.job_file, "Job YAML file")->required();
  cmd->add_option("--profile-repetitions", o.profile_repetitions,
                  "With stages: auto, timed runs per layer and action when "
                  "profiling on this machine")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--set", o.overrides,
                  "Override a value: key.path=value (the value is YAML; "
                  "repeatable)");
  cmd->add_option_function<std::string>(
         "-o,--output", [&o](const std::string& f) { o.json = f == "json"; },
         "table (the plan as text), or json (docs/cli-json.md)")
      ->check(CLI::IsMember({"table", "json"}));
  return cmd;
}

namespace {

// What a worker and the coordinator would find wrong with the job's files
// only once it runs: the data and the eval data (read and checked against
// the model's shapes, as a worker does), model.init.from (every parameter, with
// its shape), model.from_hf (every tensor of the checkpoint) and checkpoint.dir
// (created if missing, and written to, as the coordinator does at submission).
// Paths resolve as for the daemons, against the job file's directory; on a
// cluster whose machines see other files, the daemons' view is the one that
// counts.
absl::Status CheckJobFiles(const job::JobSpec& job) {
  // Checked, not made: a synthetic W of gigabytes is sized, never drawn.
  RETURN_IF_ERROR(
      engine::DataSource::Check(job.data, job::ModelSampleShapes(job.model)));
  if (job.eval.enabled) {
    if (absl::Status s = engine::DataSource::Check(
            job.eval.data, job::ModelSampleShapes(job.model));
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("eval.data: ", s.message()));
    }
  }
  if (!job.model.init_from.empty()) {
    ASSIGN_OR_RETURN(engine::SafetensorsReader init,
                     engine::SafetensorsReader::Open(job.model.init_from));
    RETURN_IF_ERROR(engine::CheckInitFileFitsModel(init, job.model));
  }
  if (!job.model.from_hf.empty()) {
    // The config was read with the job; the weights are read when it
    // starts: every tensor, shape and dtype is checked here first.
    ASSIGN_OR_RETURN(const hf::HfCheckpoint checkpoint,
                     hf::HfCheckpoint::Open(job.model.from_hf));
    RETURN_IF_ERROR(checkpoint.CheckComplete());
  }
  if (!job.checkpoint.dir.empty()) {
    RETURN_IF_ERROR(checkpoint::CheckCheckpointDirWritable(job.checkpoint.dir));
  }
  return absl::OkStatus();
}

nlohmann::json PlanJson(const std::string& file, const job::JobPlan& plan) {
  const job::JobSpec& job = plan.job;
  nlohmann::json stages = nlohmann::json::array();
  for (const job::StagePlan& s : plan.stages) {
    stages.push_back({{"stage", s.stage},
                      {"rank", s.rank},
                      {"first_layer", s.first_layer},
                      {"num_layers", s.num_layers},
                      {"num_params", s.num_params}});
  }
  nlohmann::json out = {
      {"file", file},
      {"valid", true},
      {"name", job.name},
      {"workers", plan.num_ranks},
      {"num_stages", plan.num_stages},
      {"virtual_stages", plan.virtual_stages},
      {"schedule",
       std::string(scheduler::ScheduleKindName(plan.schedule.kind))},
      {"devices_per_stage", job.pipeline.devices_per_stage},
      {"tensor_parallel", job.pipeline.tensor_parallel},
      {"batch_size", job.training.batch_size},
      {"microbatches", job.training.microbatches},
      {"steps", job.training.steps},
      {"parameters", job.model.NumParams()},
      {"stages", std::move(stages)}};
  if (plan.auto_split.has_value()) {
    const scheduler::StageSearchResult& search = plan.auto_split->search;
    out["auto_split"] = {
        {"profiled_on", plan.auto_split->profiled_on},
        {"predicted_step_seconds", search.makespan},
        {"bubble_fraction", search.bubble_fraction},
        {"even_step_seconds", search.even_makespan.has_value()
                                  ? nlohmann::json(*search.even_makespan)
                                  : nlohmann::json(nullptr)}};
  }
  return out;
}

}  // namespace

absl::Status RunValidateCommand(const ValidateCommandOptions& o,
                                std::ostream& out) {
  ASSIGN_OR_RETURN(JobSource source, ReadJobSource(o.job_file, o.overrides));
  ASSIGN_OR_RETURN(job::ParsedJob parsed, ParseJobSource(source));
  job::JobSpec job = std::move(parsed.spec);
  ASSIGN_OR_RETURN(job::JobPlan plan, job::PlanJob(std::move(job)));
  RETURN_IF_ERROR(CheckJobFiles(plan.job));
  if (job::NeedsProfile(plan)) {
    // The coordinator profiles on the job's first worker; here the local
    // CPU stands in for it, so the figures are this machine's.
    ASSIGN_OR_RETURN(
        std::vector<engine::LayerProfile> profile,
        engine::ProfileLayers(
            engine::CpuBackend::Get(plan.job.training.precision),
            plan.job.model,
            {.microbatch_size = plan.job.training.microbatch_size(),
             .repetitions = o.profile_repetitions}));
    // A transfer's cost as the TCP data plane has it here, as a worker
    // measures it with its profile (0 if it cannot be measured).
    const double transfer =
        transport::MeasureLoopbackLatency(engine::CpuBackend::Get(), 20,
                                          std::chrono::milliseconds(4))
            .value_or(0.0);
    ASSIGN_OR_RETURN(
        plan, job::ChooseStages(plan, std::move(profile), "this machine's CPU",
                                /*from_cache=*/false, transfer));
  }
  if (o.json) {
    out << PlanJson(source.file_name, plan).dump(2) << "\n";
    return absl::OkStatus();
  }
  out << job::DescribePlan(plan);
  out << source.file_name << ": valid; needs " << plan.num_ranks
      << " worker(s)\n";
  return absl::OkStatus();
}

}  // namespace conveyor::cli
