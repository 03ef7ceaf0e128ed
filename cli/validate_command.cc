#include "cli/validate_command.h"

#include "cli/job_file.h"
#include "common/status_macros.h"
#include "coordinator/planner.h"

namespace conveyor::cli {

CLI::App* AddValidateCommand(CLI::App& app, ValidateCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Check a job file as the coordinator would, without one, and print its "
      "pipeline plan and the number of workers it needs");
  cmd->add_option("job", o.job_file, "Job YAML file")->required();
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
  out << coordinator::DescribePlan(plan);
  out << source.file_name << ": valid; needs " << plan.num_ranks
      << " worker(s)\n";
  return absl::OkStatus();
}

}  // namespace conveyor::cli
