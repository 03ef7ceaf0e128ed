#include "checkpoint/layout.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace conveyor::checkpoint {

std::string StepDirPath(absl::string_view checkpoint_dir, int64_t step) {
  return (std::filesystem::path(std::string(checkpoint_dir)) /
          absl::StrCat("step-", step))
      .string();
}

std::string StageFilePath(absl::string_view checkpoint_dir, int64_t step,
                          int stage) {
  return (std::filesystem::path(StepDirPath(checkpoint_dir, step)) /
          StageFileName(stage))
      .string();
}

std::optional<int64_t> StepOfDirName(absl::string_view name) {
  constexpr absl::string_view kPrefix = "step-";
  if (name.size() <= kPrefix.size() ||
      name.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  const absl::string_view digits = name.substr(kPrefix.size());
  if (digits.size() > 19 || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return std::nullopt;
    }
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(digits, &step)) return std::nullopt;  // Overflow.
  return step;
}

std::string StageFileName(int stage) {
  return absl::StrCat("stage-", stage, ".safetensors");
}

}  // namespace conveyor::checkpoint
