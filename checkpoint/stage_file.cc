#include "checkpoint/stage_file.h"

#include <filesystem>
#include <map>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/layout.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace conveyor::checkpoint {
namespace {

namespace fs = std::filesystem;

uint32_t CrcOf(absl::string_view bytes) {
  return Crc32c(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::string Hex32(uint32_t value) { return absl::StrFormat("%08x", value); }

// The metadata of one file, read with errors that name it.
class MetadataReader {
 public:
  explicit MetadataReader(const engine::SafetensorsReader& file)
      : file_(file) {}

  absl::StatusOr<std::string> Text(absl::string_view key) const {
    auto it = file_.metadata().find(std::string(key));
    if (it == file_.metadata().end()) {
      return absl::DataLossError(absl::StrCat(
          file_.source_name(), ": no '", key,
          "' in the metadata (not a stage file written by a conveyor worker)"));
    }
    return it->second;
  }

  // A decimal of at most 18 digits (so it fits int64), nothing else.
  absl::StatusOr<int64_t> Count(absl::string_view key) const {
    ASSIGN_OR_RETURN(std::string text, Text(key));
    int64_t value = 0;
    const bool digits =
        !text.empty() && text.size() <= 18 &&
        std::all_of(text.begin(), text.end(), [](char c) {
          return absl::ascii_isdigit(static_cast<unsigned char>(c));
        });
    if (!digits || !absl::SimpleAtoi(text, &value)) {
      return absl::DataLossError(
          absl::StrCat(file_.source_name(), ": metadata '", key, "' is '", text,
                       "', not a non-negative integer"));
    }
    return value;
  }

 private:
  const engine::SafetensorsReader& file_;
};

absl::StatusOr<StageFileInfo> ReadInfo(const engine::SafetensorsReader& file,
                                       const StageFileDigest& digest,
                                       const StageFileExpectation& expect) {
  const std::string& name = file.source_name();
  const MetadataReader meta(file);
  ASSIGN_OR_RETURN(const std::string format, meta.Text("format"));
  if (format != kStageFileFormat) {
    return absl::DataLossError(absl::StrCat(name, ": metadata 'format' is '",
                                            format, "', expected '",
                                            kStageFileFormat, "'"));
  }
  StageFileInfo info;
  ASSIGN_OR_RETURN(const int64_t stage, meta.Count("stage"));
  if (stage != digest.stage) {
    return absl::DataLossError(absl::StrCat(name, ": metadata says stage ",
                                            stage, ", the file name ",
                                            digest.stage));
  }
  info.stage = digest.stage;
  ASSIGN_OR_RETURN(info.step, meta.Count("step"));
  if (info.step != expect.step) {
    return absl::DataLossError(absl::StrCat(name, ": metadata says step ",
                                            info.step, ", the directory step ",
                                            expect.step));
  }
  ASSIGN_OR_RETURN(const int64_t num_stages, meta.Count("num_stages"));
  if (num_stages <= digest.stage || num_stages > kMaxManifestStages) {
    return absl::DataLossError(absl::StrCat(name, ": num_stages ", num_stages,
                                            " cannot hold stage ",
                                            digest.stage));
  }
  info.num_stages = static_cast<int>(num_stages);
  if (expect.num_stages.has_value() && info.num_stages != *expect.num_stages) {
    return absl::DataLossError(absl::StrCat(
        name, ": num_stages ", info.num_stages,
        " disagrees with the manifest (", *expect.num_stages, ")"));
  }
  ASSIGN_OR_RETURN(info.job, meta.Text("job"));
  if (expect.job.has_value() && info.job != *expect.job) {
    return absl::DataLossError(
        absl::StrCat(name, ": job '", info.job, "' disagrees with ",
                     StageFileName(0), " (job '", *expect.job, "')"));
  }
  ASSIGN_OR_RETURN(info.optimizer_step, meta.Count("optimizer_step"));
  if (info.optimizer_step != info.step) {
    return absl::DataLossError(absl::StrCat(
        name, ": metadata says optimizer_step ", info.optimizer_step,
        ", but step ", info.step, " (one optimizer step per training step)"));
  }
  // Written by every worker, but not needed to read a file back.
  if (file.metadata().contains("samples_seen")) {
    ASSIGN_OR_RETURN(info.samples_seen, meta.Count("samples_seen"));
  }
  return info;
}

}  // namespace

std::string OptimizerTensorName(absl::string_view slot,
                                absl::string_view parameter) {
  return absl::StrCat(kOptimizerTensorPrefix, slot, "/", parameter);
}

bool IsOptimizerTensor(absl::string_view name) {
  return absl::StartsWith(name, kOptimizerTensorPrefix);
}

absl::StatusOr<StageFileDigest> WriteStageFile(
    const std::string& checkpoint_dir, const StageFileInfo& info,
    const std::vector<engine::TensorToWrite>& tensors) {
  const std::string path = StageFilePath(checkpoint_dir, info.step, info.stage);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) {
    return ErrnoError(ec.value(), fs::path(path).parent_path().string(),
                      "create directory");
  }
  ASSIGN_OR_RETURN(
      const std::string bytes,
      engine::SerializeSafetensors(
          tensors, {{"job", info.job},
                    {"stage", absl::StrCat(info.stage)},
                    {"num_stages", absl::StrCat(info.num_stages)},
                    {"step", absl::StrCat(info.step)},
                    {"optimizer_step", absl::StrCat(info.optimizer_step)},
                    {"samples_seen", absl::StrCat(info.samples_seen)},
                    {"format", kStageFileFormat}}));
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  return StageFileDigest{.stage = info.stage,
                         .file = StageFileName(info.stage),
                         .bytes = bytes.size(),
                         .crc32c = CrcOf(bytes)};
}

absl::StatusOr<StageFile> ReadStageFile(const std::string& step_dir,
                                        const StageFileDigest& digest,
                                        const StageFileExpectation& expect) {
  if (digest.file != StageFileName(digest.stage)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage file '", digest.file, "' for stage ", digest.stage,
                     " is not ", StageFileName(digest.stage)));
  }
  const std::string path = (fs::path(step_dir) / digest.file).string();
  // One byte more than expected is enough to tell the size is wrong.
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, digest.bytes + 1));
  if (bytes.size() != digest.bytes) {
    return absl::DataLossError(absl::StrCat(
        path, ": ", bytes.size() > digest.bytes ? "more than " : "",
        bytes.size() > digest.bytes ? digest.bytes : bytes.size(),
        " bytes, but the checkpoint's manifest records ", digest.bytes));
  }
  const uint32_t crc = CrcOf(bytes);
  if (crc != digest.crc32c) {
    return absl::DataLossError(absl::StrCat(
        path, ": CRC-32C ", Hex32(crc), " differs from the manifest's ",
        Hex32(digest.crc32c), "; the file is corrupt"));
  }
  absl::StatusOr<engine::SafetensorsReader> file =
      engine::SafetensorsReader::FromBytes(std::move(bytes), path);
  if (!file.ok()) {
    // The checksum matched: it was written like this, a state to repair
    // (not a bad argument).
    if (!absl::IsInvalidArgument(file.status())) return file.status();
    return absl::DataLossError(file.status().message());
  }
  ASSIGN_OR_RETURN(StageFileInfo info, ReadInfo(*file, digest, expect));
  return StageFile{.info = std::move(info), .tensors = *std::move(file)};
}

}  // namespace conveyor::checkpoint
