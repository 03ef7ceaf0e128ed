// ParameterSource: where a stage's initial parameter values come from, by
// global name: a safetensors file in Conveyor's names (model.init.from, a
// resume file) or a HuggingFace checkpoint (model.from_hf,
// hf/parameter_source.h). Stages load through it (PipelineStage::LoadFrom),
// so every source is checked the same way. Implementations are thread-safe
// for concurrent Read calls unless they say otherwise.
#ifndef CONVEYOR_ENGINE_PARAMETER_SOURCE_H_
#define CONVEYOR_ENGINE_PARAMETER_SOURCE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/safetensors.h"
#include "engine/tensor.h"

namespace conveyor::engine {

class ParameterSource {
 public:
  virtual ~ParameterSource() = default;

  // The values of parameter `name`, which the model shapes `shape`, as
  // float in row-major order. InvalidArgument naming the source and the
  // tensor when it is missing, not floating point, or shaped otherwise (with
  // both shapes); the source's I/O errors as they come.
  virtual absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                                  const Shape& shape) const = 0;
};

// A safetensors file in Conveyor's names. `file` must outlive the source.
class SafetensorsSource final : public ParameterSource {
 public:
  explicit SafetensorsSource(const SafetensorsReader& file) : file_(file) {}

  absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                          const Shape& shape) const override;

 private:
  const SafetensorsReader& file_;
};

// Several safetensors files in Conveyor's names (a checkpoint's stage
// files), each parameter read from the first file that holds it. The files
// must outlive the source.
class SafetensorsFilesSource final : public ParameterSource {
 public:
  explicit SafetensorsFilesSource(std::vector<const SafetensorsReader*> files)
      : files_(std::move(files)) {}

  // InvalidArgument naming every file when none holds `name`; otherwise as
  // SafetensorsSource reads from the one that does.
  absl::StatusOr<std::vector<float>> Read(const std::string& name,
                                          const Shape& shape) const override;
  // The first file holding tensor `name`, or nullptr.
  const SafetensorsReader* FileOf(const std::string& name) const;

 private:
  std::vector<const SafetensorsReader*> files_;
};

// InvalidArgument, naming the file, the tensor and both shapes, unless
// `file` holds tensor `name` with `shape`: what a stage needs of an init
// file, for each parameter.
absl::Status CheckInitTensor(const SafetensorsReader& file,
                             const std::string& name, const Shape& shape);

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_PARAMETER_SOURCE_H_
