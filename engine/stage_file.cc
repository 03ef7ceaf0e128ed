#include "engine/stage_file.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace conveyor::engine {

std::string StepDirPath(absl::string_view checkpoint_dir, int64_t step) {
  return (std::filesystem::path(std::string(checkpoint_dir)) /
          absl::StrCat("step-", step))
      .string();
}

std::string StageFilePath(absl::string_view checkpoint_dir, int64_t step,
                          int stage) {
  return (std::filesystem::path(StepDirPath(checkpoint_dir, step)) /
          absl::StrCat("stage-", stage, ".safetensors"))
      .string();
}

}  // namespace conveyor::engine
