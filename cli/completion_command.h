// `conveyorctl completion bash|zsh`: a shell completion script generated from
// the command tree itself (every subcommand and its flags, as CLI11 holds
// them), so it cannot fall behind the commands. Install it with
//   conveyorctl completion bash > /etc/bash_completion.d/conveyorctl
//   source <(conveyorctl completion zsh)     # in ~/.zshrc
// It completes subcommands, and flags after a `-`; elsewhere (job files,
// checkpoint directories, flag values) the shell's own file completion.
// Thread-compatible.
#ifndef CONVEYOR_CLI_COMPLETION_COMMAND_H_
#define CONVEYOR_CLI_COMPLETION_COMMAND_H_

#include <ostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace conveyor::cli {

struct CompletionCommandOptions {
  std::string shell;  // "bash" or "zsh"
};

CLI::App* AddCompletionCommand(CLI::App& app,
                               CompletionCommandOptions& options);

// The script for options.shell, generated from `app` (the whole command
// tree, `program` its name). InvalidArgument for another shell.
absl::Status RunCompletionCommand(const CLI::App& app,
                                  const std::string& program,
                                  const CompletionCommandOptions& options,
                                  std::ostream& out);

}  // namespace conveyor::cli

#endif  // CONVEYOR_CLI_COMPLETION_COMMAND_H_
