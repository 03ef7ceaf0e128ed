#include "common/logging.h"

#include <array>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace conveyor {

absl::Status InitLogging(absl::string_view level) {
  static constexpr std::array<
      std::pair<absl::string_view, spdlog::level::level_enum>, 6>
      kLevels = {{{"trace", spdlog::level::trace},
                  {"debug", spdlog::level::debug},
                  {"info", spdlog::level::info},
                  {"warn", spdlog::level::warn},
                  {"error", spdlog::level::err},
                  {"off", spdlog::level::off}}};
  for (const auto& [name, value] : kLevels) {
    if (name != level) continue;
    auto logger = std::make_shared<spdlog::logger>(
        "conveyor", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    // %s:%# is the source file's basename and line, filled in by the
    // SPDLOG_* macros.
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%f %^%l%$ %s:%# %v");
    logger->set_level(value);
    spdlog::set_default_logger(std::move(logger));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", level, "'; allowed: ", kLogLevels));
}

}  // namespace conveyor
