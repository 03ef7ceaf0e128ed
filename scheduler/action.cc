#include "scheduler/action.h"

#include "absl/strings/str_cat.h"

namespace conveyor::scheduler {

absl::string_view OpName(Op op) {
  switch (op) {
    case Op::kForward:
      return "F";
    case Op::kBackward:
      return "B";
    case Op::kBackwardInput:
      return "BI";
    case Op::kBackwardWeight:
      return "BW";
  }
  return "?";
}

absl::StatusOr<Op> ParseOp(absl::string_view name) {
  for (Op op :
       {Op::kForward, Op::kBackward, Op::kBackwardInput, Op::kBackwardWeight}) {
    if (OpName(op) == name) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown op '", name, "'; allowed: F, B, BI, BW"));
}

std::string ToString(const Action& action) {
  return absl::StrCat(OpName(action.op), action.stage, ".", action.microbatch);
}

}  // namespace conveyor::scheduler
