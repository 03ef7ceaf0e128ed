// The tokens data source (engine/data.h): a headerless file of little-endian
// token ids (uint8, uint16, uint32 or int32), memory-mapped and cut into
// overlapping windows for next-token prediction.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "engine/data.h"
#include "engine/internal/data_sources.h"
#include "engine/internal/data_token_stream.h"
#include "engine/internal/data_token_windows.h"

namespace conveyor::engine::data_internal {

absl::StatusOr<std::unique_ptr<DataSource>> CreateTokens(
    const DataConfig& config, const SampleShapes& shapes) {
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        "data.path is required for data.source tokens");
  }
  TokenEncoding encoding{.name =
                             std::string(TokenDTypeName(config.token_dtype))};
  uint64_t dtype_limit = 0;
  switch (config.token_dtype) {
    case TokenDType::kUint8:
      encoding.bytes = 1;
      dtype_limit = uint64_t{1} << 8;
      break;
    case TokenDType::kUint16:
      encoding.bytes = 2;
      dtype_limit = uint64_t{1} << 16;
      break;
    case TokenDType::kUint32:
      encoding.bytes = 4;
      dtype_limit = uint64_t{1} << 32;
      break;
    case TokenDType::kInt32:
      encoding.bytes = 4;
      encoding.is_signed = true;
      dtype_limit = uint64_t{1} << 31;
      break;
  }
  ASSIGN_OR_RETURN(VocabBound vocab,
                   MakeVocabBound(config, shapes, dtype_limit, encoding.name));
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
                   MappedFile::Open(config.path));
  if (file->size() % encoding.bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.path, ": ", file->size(), " bytes is not a whole number of ",
        encoding.name, " tokens (", encoding.bytes,
        " bytes each): the file is truncated or of another dtype"));
  }
  const int64_t count = static_cast<int64_t>(file->size() / encoding.bytes);
  std::vector<TokenComponent> components;
  components.push_back(
      {.stream = TokenStream(std::move(file), 0, count, std::move(encoding),
                             std::move(vocab)),
       .index = nullptr});
  return CreateTokenWindows(config, shapes, std::move(components));
}

}  // namespace conveyor::engine::data_internal
