// WriteHfCheckpoint (declared in hf/checkpoint.h).
#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "hf/checkpoint.h"

namespace conveyor::hf {
namespace {

namespace fs = std::filesystem;

// `value` rounded to the nearest bfloat16 (ties to even), as its bits.
// Adding 0x7fff plus the lowest kept bit and truncating rounds to nearest
// even, and carries into the exponent, up to infinity, where it should.
// NaN is truncated with its quiet bit set, so a NaN whose payload lies only
// in the dropped bits stays a NaN instead of becoming an infinity.
uint16_t FloatToBf16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// One tensor's stored bytes, kept until the file is written.
struct Buffer {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

absl::StatusOr<bool> Exists(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoError(ec.value(), path, "stat");
  }
  return fs::exists(status);
}

// Creates `dir` if needed and checks that writing there replaces nothing
// it should not.
absl::Status PrepareDirectory(const std::string& dir, bool overwrite) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    // A file in the way is better reported as "not a directory" than by
    // the errno create_directories happens to give.
    const absl::Status is_dir = CheckDirectory(dir, "checkpoint directory");
    if (absl::IsFailedPrecondition(is_dir)) return is_dir;
    if (!is_dir.ok()) return ErrnoError(ec.value(), dir, "create directories");
  }
  RETURN_IF_ERROR(CheckDirectory(dir, "checkpoint directory"));
  ASSIGN_OR_RETURN(const bool has_index,
                   Exists((fs::path(dir) / kHfIndexFile).string()));
  if (has_index) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": holds a sharded checkpoint (", kHfIndexFile,
                     "); remove it first: writing ", kHfWeightsFile,
                     " would leave its shards behind"));
  }
  if (overwrite) return absl::OkStatus();
  for (const char* file : {kHfConfigFile, kHfWeightsFile}) {
    const std::string path = (fs::path(dir) / file).string();
    ASSIGN_OR_RETURN(const bool exists, Exists(path));
    if (exists) {
      return absl::AlreadyExistsError(absl::StrCat(
          path, ": already exists; set overwrite to replace the checkpoint"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteHfCheckpoint(const std::string& dir,
                               const HfLlamaConfig& config,
                               const HfTensorSource& tensor,
                               const HfWriteOptions& options) {
  const std::string config_path = (fs::path(dir) / kHfConfigFile).string();
  RETURN_IF_ERROR(ValidateHfLlamaConfig(config, config_path));
  RETURN_IF_ERROR(PrepareDirectory(dir, options.overwrite));

  const TensorShapes expected = ExpectedLlamaTensors(config);
  // Reserved up front: TensorToWrite points into the buffers.
  std::vector<Buffer> buffers(expected.size());
  std::vector<engine::TensorToWrite> to_write;
  to_write.reserve(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, shape] = expected[i];
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    absl::StatusOr<std::vector<float>> values = tensor(name);
    if (!values.ok()) {
      return absl::Status(
          values.status().code(),
          absl::StrCat("tensor \"", name, "\": ", values.status().message()));
    }
    if (static_cast<int64_t>(values->size()) != numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": the source gave ",
                       values->size(), " values; its shape [",
                       absl::StrJoin(shape, ", "), "] holds ", numel));
    }
    ASSIGN_OR_RETURN(std::string hf_name,
                     ConveyorNameToHf(name, config.num_hidden_layers));
    Buffer& buffer = buffers[i];
    engine::TensorToWrite& out = to_write.emplace_back();
    out.name = std::move(hf_name);
    out.shape = shape;
    if (options.dtype == HfDType::kBF16) {
      buffer.bf16.resize(values->size());
      for (size_t k = 0; k < values->size(); ++k) {
        buffer.bf16[k] = FloatToBf16Bits((*values)[k]);
      }
      out.dtype = engine::DType::kBF16;
      out.data = buffer.bf16.data();
      out.bytes = buffer.bf16.size() * sizeof(uint16_t);
    } else {
      buffer.f32 = *std::move(values);
      out.dtype = engine::DType::kF32;
      out.data = buffer.f32.data();
      out.bytes = buffer.f32.size() * sizeof(float);
    }
  }
  // transformers refuses a safetensors file whose metadata lacks "format".
  RETURN_IF_ERROR(engine::WriteSafetensors(
      (fs::path(dir) / kHfWeightsFile).string(), to_write, {{"format", "pt"}}));
  return WriteFileAtomically(config_path,
                             HfLlamaConfigJson(config, options.dtype));
}

}  // namespace conveyor::hf
