// conveyorctl: the user's command-line interface to Conveyor.
//
// Exit codes: 0 success, 1 the command failed, 2 invalid arguments.
#include <exception>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"             // defines: CLI::App, CLI::ParseError
#include "absl/strings/str_cat.h"  // defines: absl::StrCat
#include "cli/run_command.h"       // defines: AddRunCommand, RunRunCommand
#include "cli/schedule_command.h"  // defines: AddScheduleCommand, Run...
#include "common/build_info.h"     // defines: kVersion, kGitRevision, ...
#include "common/logging.h"        // defines: InitLogging
#ifdef CONVEYOR_HAVE_CUDA
#include "engine/cuda/device_info.h"  // defines: CudaRuntimeVersionString
#endif

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

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
  CLI::App app{
      "conveyorctl: the command-line interface to Conveyor, a "
      "pipeline-parallel training executor"};
  app.set_version_flag("--version", VersionText());
  std::string log_level = "warn";
  app.add_option("--log-level", log_level,
                 absl::StrCat("Log level: ", conveyor::kLogLevels))
      ->capture_default_str();
  app.require_subcommand(1);

  conveyor::cli::ScheduleCommandOptions schedule_options;
  CLI::App* schedule = conveyor::cli::AddScheduleCommand(app, schedule_options);
  conveyor::cli::RunCommandOptions run_options;
  CLI::App* run = conveyor::cli::AddRunCommand(app, run_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  if (absl::Status s = conveyor::InitLogging(log_level); !s.ok()) {
    std::cerr << "conveyorctl: --log-level: " << s.message() << "\n";
    return kExitUsage;
  }

  absl::Status status = absl::OkStatus();
  // Commands return Status; this catch is the last resort for what a library
  // may still throw (std::bad_alloc), so the user gets a message, not abort().
  try {
    if (schedule->parsed()) {
      status = conveyor::cli::RunScheduleCommand(schedule_options, std::cout);
    } else if (run->parsed()) {
      status = conveyor::cli::RunRunCommand(run_options, std::cout);
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  if (status.ok()) return 0;
  std::cerr << "conveyorctl: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                             : kExitFailure;
}
