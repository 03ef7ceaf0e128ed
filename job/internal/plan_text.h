// Text the planner's errors and plan descriptions share: byte counts and
// the one-line reason of a planning error. Not API.
//
// Thread-safe (pure functions).
#ifndef CONVEYOR_JOB_INTERNAL_PLAN_TEXT_H_
#define CONVEYOR_JOB_INTERNAL_PLAN_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace conveyor::job::job_internal {

// "512 B", "1.5 GiB".
std::string Bytes(double bytes);

// Where the message of a planning error starts: past "file:line:col: " and
// "pipeline...: ", for a one-line reason in a table.
absl::string_view Reason(absl::string_view message);

}  // namespace conveyor::job::job_internal

#endif  // CONVEYOR_JOB_INTERNAL_PLAN_TEXT_H_
