#include "engine/parameter_source.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace conveyor::engine {

absl::StatusOr<std::vector<float>> SafetensorsSource::Read(
    const std::string& name, const Shape& shape) const {
  RETURN_IF_ERROR(CheckInitTensor(file_, name, shape));
  return file_.ReadF32(name);
}

absl::StatusOr<std::vector<float>> SafetensorsFilesSource::Read(
    const std::string& name, const Shape& shape) const {
  const SafetensorsReader* file = FileOf(name);
  if (file == nullptr) {
    std::vector<std::string> names;
    for (const SafetensorsReader* f : files_) names.push_back(f->source_name());
    return absl::InvalidArgumentError(
        absl::StrCat("no tensor '", name, "' (the model needs F32 ",
                     ShapeString(shape), ") in ", absl::StrJoin(names, ", ")));
  }
  return SafetensorsSource(*file).Read(name, shape);
}

const SafetensorsReader* SafetensorsFilesSource::FileOf(
    const std::string& name) const {
  for (const SafetensorsReader* f : files_) {
    if (f->Find(name) != nullptr) return f;
  }
  return nullptr;
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
