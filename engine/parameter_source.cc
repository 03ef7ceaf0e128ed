#include "engine/parameter_source.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<std::vector<float>> SafetensorsSource::Read(
    const std::string& name, const Shape& shape) const {
  RETURN_IF_ERROR(CheckInitTensor(file_, name, shape));
  return file_.ReadF32(name);
}

absl::Status CheckInitTensor(const SafetensorsReader& file,
                             const std::string& name, const Shape& shape) {
  const TensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.source_name(), ": no tensor '", name,
                     "' (the model needs F32 ", ShapeString(shape), ")"));
  }
  if (info->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.source_name(), ": tensor '", name, "' is ",
        ShapeString(info->shape), " but the model needs ", ShapeString(shape)));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::engine
