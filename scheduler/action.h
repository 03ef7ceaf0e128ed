// One compute action of a pipeline schedule: forward, full backward, or the two
// halves of a split backward (input gradient, weight gradient) that zero-bubble
// schedules run apart. Plain value type; thread-compatible.
#ifndef CONVEYOR_SCHEDULER_ACTION_H_
#define CONVEYOR_SCHEDULER_ACTION_H_

#include <compare>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace conveyor::scheduler {

enum class Op : unsigned char {
  kForward,         // F: stage forward of one microbatch.
  kBackward,        // B: input and weight gradients together.
  kBackwardInput,   // BI: gradient w.r.t. the stage input only.
  kBackwardWeight,  // BW: gradient w.r.t. the stage parameters only.
};

// "F", "B", "BI", "BW".
absl::string_view OpName(Op op);

// Inverse of OpName. InvalidArgument lists the allowed names.
absl::StatusOr<Op> ParseOp(absl::string_view name);

// True for B and BI: the actions that produce the gradient sent upstream.
inline bool ProducesInputGradient(Op op) {
  return op == Op::kBackward || op == Op::kBackwardInput;
}

struct Action {
  Op op = Op::kForward;
  int stage = 0;
  int microbatch = 0;

  friend auto operator<=>(const Action&, const Action&) = default;
};

// "F2.0", "BI3.7": op, stage, '.', microbatch.
std::string ToString(const Action& action);

}  // namespace conveyor::scheduler

#endif  // CONVEYOR_SCHEDULER_ACTION_H_
