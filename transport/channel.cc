#include "transport/channel.h"

#include "absl/strings/str_cat.h"

namespace conveyor::transport {

std::string ToString(const Tag& tag) {
  if (tag.kind == TensorKind::kPartialSum) {
    return absl::StrCat(
        tag.microbatch == 0
            ? std::string("gradient-norm partial sum")
            : absl::StrCat("partial sum ", tag.microbatch, " (tied parameter)"),
        " of rank ", tag.stage, ", step ", tag.step, " (job ", tag.job, ")");
  }
  if (tag.kind == TensorKind::kEvalActivation) {
    return absl::StrCat("evaluation activation of stage ", tag.stage,
                        " after step ", tag.step, ", microbatch ",
                        tag.microbatch, " (job ", tag.job, ")");
  }
  return absl::StrCat(
      tag.kind == TensorKind::kActivation ? "activation" : "gradient",
      " of stage ", tag.stage, ", step ", tag.step, ", microbatch ",
      tag.microbatch, " (job ", tag.job, ")");
}

}  // namespace conveyor::transport
