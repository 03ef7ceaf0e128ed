#include "engine/layer_spec.h"

#include "engine/tensor.h"

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

int64_t ParamSpec::NumElements() const { return engine::NumElements(shape); }

}  // namespace conveyor::engine
