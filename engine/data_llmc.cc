// The llmc data source (engine/data.h): one llm.c token shard, as llm.c's
// dev/data scripts write them and its dataloader.h reads them: a header of
// 256 little-endian int32 (magic, version, token count, then unused), then
// the tokens, uint16 (GPT-2 shards, magic 20240520) or uint32 (Llama 3
// shards, magic 20240801).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "engine/data.h"
#include "engine/internal/data_sources.h"
#include "engine/internal/data_token_stream.h"
#include "engine/internal/data_token_windows.h"

namespace conveyor::engine::data_internal {
namespace {

constexpr uint64_t kHeaderInts = 256;
constexpr uint64_t kHeaderBytes = kHeaderInts * 4;
constexpr int32_t kMagicUint16 = 20240520;
constexpr int32_t kMagicUint32 = 20240801;
constexpr int32_t kVersion = 1;

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> CreateLlmc(
    const DataConfig& config, const SampleShapes& shapes) {
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        "data.path is required for data.source llmc");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                   MappedFile::Open(config.path));
  auto bad = [&](auto&&... message) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.path, ": ", message...));
  };
  if (file->size() < kHeaderBytes) {
    return bad(file->size(), " bytes is too short for an llm.c header (",
               kHeaderBytes, " bytes)");
  }
  const uint8_t* header = file->data();
  auto field = [&](int i) {
    return static_cast<int32_t>(GetU32(header + 4 * i));
  };
  const int32_t magic = field(0);
  TokenEncoding encoding;
  if (magic == kMagicUint16) {
    encoding = {.bytes = 2, .is_signed = false, .name = "uint16"};
  } else if (magic == kMagicUint32) {
    encoding = {.bytes = 4, .is_signed = false, .name = "uint32"};
  } else {
    return bad("magic ", magic, " at byte 0 is not an llm.c token shard's (",
               kMagicUint16, " for uint16 tokens, ", kMagicUint32,
               " for uint32 tokens)");
  }
  if (field(1) != kVersion) {
    return bad("version ", field(1), " at byte 4 is not the one llm.c writes (",
               kVersion, ")");
  }
  const int32_t count = field(2);
  if (count <= 0) {
    return bad("the header's token count at byte 8 is ", count,
               "; a shard holds at least one token");
  }
  const uint64_t expected =
      kHeaderBytes + static_cast<uint64_t>(count) * encoding.bytes;
  if (file->size() != expected) {
    return bad("the header (byte 8) says ", count, " ", encoding.name,
               " tokens, ", expected,
               " bytes with the header, but the file has ", file->size(),
               file->size() < expected ? ": it is truncated" : "");
  }
  ASSIGN_OR_RETURN(
      VocabBound vocab,
      MakeVocabBound(config, shapes, uint64_t{1} << (8 * encoding.bytes),
                     encoding.name));
  std::vector<TokenComponent> components;
  components.push_back(
      {.stream = TokenStream(std::move(file), kHeaderBytes, count,
                             std::move(encoding), std::move(vocab)),
       .index = nullptr});
  return CreateTokenWindows(config, shapes, std::move(components));
}

}  // namespace conveyor::engine::data_internal
