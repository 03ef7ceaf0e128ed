#include "cli/exit_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace conveyor::cli {
namespace {

// A payload rather than a side channel, so the exit code travels with the
// status through RETURN_IF_ERROR.
constexpr absl::string_view kExitCodeUrl = "conveyor.dev/conveyorctl/exit-code";

}  // namespace

absl::Status AlreadyReported(absl::StatusCode code, absl::string_view message,
                             int exit_code) {
  absl::Status status(code, message);
  if (status.ok()) return status;
  status.SetPayload(kExitCodeUrl, absl::Cord(absl::StrCat(exit_code)));
  return status;
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  if (auto payload = status.GetPayload(kExitCodeUrl); payload.has_value()) {
    int code = kExitFailure;
    if (absl::SimpleAtoi(std::string(*payload), &code)) return code;
  }
  return status.code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                             : kExitFailure;
}

bool ShouldPrint(const absl::Status& status) {
  return !status.ok() && !status.GetPayload(kExitCodeUrl).has_value();
}

}  // namespace conveyor::cli
