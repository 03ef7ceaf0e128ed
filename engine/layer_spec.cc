#include "engine/layer_spec.h"

namespace conveyor::engine {

absl::string_view ParamInitName(ParamInit init) {
  switch (init) {
    case ParamInit::kUniform:
      return "uniform";
    case ParamInit::kNormal:
      return "normal";
    case ParamInit::kXavierUniform:
      return "xavier_uniform";
    case ParamInit::kOnes:
      return "ones";
    case ParamInit::kZeros:
      return "zeros";
  }
  return "unknown";
}

int64_t ParamSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace conveyor::engine
