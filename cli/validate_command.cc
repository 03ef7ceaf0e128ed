#include "cli/validate_command.h"

#include "cli/job_file.h"
#include "common/status_macros.h"
#include "coordinator/planner.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/profiler.h"

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
  return cmd;
}

absl::Status RunValidateCommand(const ValidateCommandOptions& o,
                                std::ostream& out) {
  ASSIGN_OR_RETURN(JobSource source, ReadJobSource(o.job_file, o.overrides));
  ASSIGN_OR_RETURN(engine::JobSpec job, ParseJobSource(source));
  ASSIGN_OR_RETURN(coordinator::JobPlan plan,
                   coordinator::PlanJob(std::move(job)));
  if (coordinator::NeedsProfile(plan)) {
    // The coordinator profiles on the job's first worker; here the local
    // CPU stands in for it, so the figures are this machine's.
    ASSIGN_OR_RETURN(
        std::vector<engine::LayerProfile> profile,
        engine::ProfileLayers(
            engine::CpuBackend::Get(plan.job.training.precision),
            plan.job.model,
            {.microbatch_size = plan.job.training.microbatch_size(),
             .repetitions = o.profile_repetitions}));
    ASSIGN_OR_RETURN(plan, coordinator::ChooseStages(plan, std::move(profile),
                                                     "this machine's CPU",
                                                     /*from_cache=*/false));
  }
  out << coordinator::DescribePlan(plan);
  out << source.file_name << ": valid; needs " << plan.num_ranks
      << " worker(s)\n";
  return absl::OkStatus();
}

}  // namespace conveyor::cli
