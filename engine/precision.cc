#include "engine/precision.h"

namespace conveyor::engine {

absl::string_view PrecisionName(Precision precision) {
  return kPrecisionNames[static_cast<int>(precision)];
}

}  // namespace conveyor::engine
