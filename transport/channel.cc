#include "transport/channel.h"

#include "absl/strings/str_cat.h"

namespace conveyor::transport {

std::string ToString(const Tag& tag) {
  return absl::StrCat(
      tag.kind == TensorKind::kActivation ? "activation" : "gradient",
      " of stage ", tag.stage, ", step ", tag.step, ", microbatch ",
      tag.microbatch, " (job ", tag.job, ")");
}

}  // namespace conveyor::transport
