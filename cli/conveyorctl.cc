// conveyorctl: the user's command-line interface to Conveyor.
//
// Exit codes: 0 success, 1 the command failed (for watch, submit --watch
// and run: the job did not succeed), 2 invalid arguments or a bad job,
// 128 + signal when run was interrupted.
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "CLI/CLI.hpp"               // defines: CLI::App, CLI::ParseError
#include "absl/strings/str_cat.h"    // defines: absl::StrCat
#include "cli/completion_command.h"  // defines: AddCompletionCommand, Run...
#include "cli/exit_status.h"         // defines: ExitCode, ShouldPrint
#include "cli/export_command.h"      // defines: AddExportCommand, Run...
#include "cli/generate_command.h"    // defines: AddGenerateCommand, Run...
#include "cli/job_commands.h"        // defines: AddJobCommands, RunJobCommand
#include "cli/plot_command.h"        // defines: AddPlotCommand, RunPlot...
#include "cli/run_command.h"         // defines: AddRunCommand, RunRunCommand
#include "cli/schedule_command.h"    // defines: AddScheduleCommand, Run...
#include "cli/tokenize_command.h"    // defines: AddTokenizeCommand, Run...
#include "cli/validate_command.h"    // defines: AddValidateCommand, Run...
#include "common/build_info.h"       // defines: kVersion, kGitRevision, ...
#include "common/command_line.h"
#include "common/logging.h"          // defines: InitLogging
#include "proto/grpc_diagnostics.h"  // defines: RouteGrpcLogs
#ifdef CONVEYOR_HAVE_CUDA
#include "engine/cuda/device_info.h"  // defines: CudaRuntimeVersionString
#endif

namespace {

std::string VersionText() {
  std::string cuda = "not built";
#ifdef CONVEYOR_HAVE_CUDA
  cuda = absl::StrCat("built (runtime ", conveyor::CudaRuntimeVersionString(),
                      ")");
#endif
  return absl::StrCat("conveyorctl ", conveyor::kVersion, " (revision ",
                      conveyor::kGitRevision, ", ", conveyor::kBuildType,
                      ", CUDA ", cuda, ")");
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = conveyor::cli;
  CLI::App app{
      "conveyorctl: the command-line interface to Conveyor, a "
      "pipeline-parallel training executor"};
  app.set_version_flag("--version", VersionText());
  std::string log_level = "warn";
  app.add_option("--log-level", log_level,
                 absl::StrCat("Log level: ", conveyor::kLogLevels))
      ->capture_default_str();
  app.require_subcommand(1);
  // Global flags are taken after the subcommand too
  // (`conveyorctl jobs --log-level debug`).
  app.fallthrough();

  cli::RunCommandOptions run_options;
  CLI::App* run = cli::AddRunCommand(app, run_options);
  cli::JobCommandOptions job_options;
  const cli::JobCommands job_commands = cli::AddJobCommands(app, job_options);
  cli::ValidateCommandOptions validate_options;
  CLI::App* validate = cli::AddValidateCommand(app, validate_options);
  cli::ExportCommandOptions export_options;
  CLI::App* export_cmd = cli::AddExportCommand(app, export_options);
  cli::GenerateCommandOptions generate_options;
  CLI::App* generate = cli::AddGenerateCommand(app, generate_options);
  cli::ScheduleCommandOptions schedule_options;
  CLI::App* schedule = cli::AddScheduleCommand(app, schedule_options);
  cli::PlotCommandOptions plot_options;
  CLI::App* plot = cli::AddPlotCommand(app, plot_options);
  cli::TokenizeCommandOptions tokenize_options;
  CLI::App* tokenize = cli::AddTokenizeCommand(app, tokenize_options);
  cli::CompletionCommandOptions completion_options;
  CLI::App* completion = cli::AddCompletionCommand(app, completion_options);

  // No arguments: what the commands are, rather than an error about one.
  if (argc <= 1) {
    app.name("conveyorctl");
    std::cout << app.help();
    return conveyor::kExitUsage;
  }
  if (std::optional<int> exit = conveyor::ParseCommandLine(
          app, argc, argv, "conveyorctl", &log_level);
      exit.has_value()) {
    return *exit;
  }
  // A failed call's status says what gRPC would also print raw.
  conveyor::proto::RouteGrpcLogs(conveyor::proto::GrpcLogs::kQuiet);

  // The in-place progress bar only for a terminal that can take it: plain
  // lines for a file or pipe, for NO_COLOR (no-color.org: no escape codes)
  // and for TERM=dumb (Emacs shells, some CI logs).
  const char* no_color = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  const bool plain = (no_color != nullptr && no_color[0] != '\0') ||
                     (term != nullptr && std::string_view(term) == "dumb");
  const bool tty = isatty(STDOUT_FILENO) == 1 && !plain;
  // tokenize draws its bar on the error stream, leaving standard output to
  // its summary.
  const bool err_tty = isatty(STDERR_FILENO) == 1 && !plain;
  absl::Status status = absl::OkStatus();
  // Commands return Status; this catch is the last resort for what a library
  // may still throw (std::bad_alloc), so the user gets a message, not abort().
  try {
    if (completion->parsed()) {
      status = cli::RunCompletionCommand(app, "conveyorctl", completion_options,
                                         std::cout);
    } else if (schedule->parsed()) {
      status = cli::RunScheduleCommand(schedule_options, std::cout);
    } else if (run->parsed()) {
      status = cli::RunRunCommand(run_options, tty, std::cout, std::cerr);
    } else if (validate->parsed()) {
      status = cli::RunValidateCommand(validate_options, std::cout);
    } else if (export_cmd->parsed()) {
      status = cli::RunExportCommand(export_options, std::cout);
    } else if (generate->parsed()) {
      status = cli::RunGenerateCommand(generate_options, std::cout, std::cerr);
    } else if (tokenize->parsed()) {
      status = cli::RunTokenizeCommand(tokenize_options, err_tty, std::cout,
                                       std::cerr);
    } else if (plot->parsed()) {
      status = cli::RunPlotCommand(plot_options, std::cout, std::cerr);
    } else if (job_commands.AnyParsed()) {
      status = cli::RunJobCommand(job_commands, job_options, tty, std::cout);
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  std::cout.flush();
  if (cli::ShouldPrint(status)) {
    std::cerr << "conveyorctl: " << status.message() << "\n";
  }
  return cli::ExitCode(status);
}
