#include "common/command_line.h"

#include <iostream>

#include "absl/status/status.h"
#include "common/logging.h"

namespace conveyor {

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                    absl::string_view program,
                                    const std::string* log_level) {
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
  if (absl::Status s = InitLogging(*log_level); !s.ok()) {
    std::cerr << program << ": --log-level: " << s.message() << "\n";
    return kExitUsage;
  }
  return std::nullopt;
}

}  // namespace conveyor
