// The megatron data source (engine/data.h): one Megatron indexed data set
// (data.path, a prefix) or a weighted blend of several (data.blend), each
// opened as PREFIX.bin memory-mapped and PREFIX.idx checked against it
// (engine/megatron_index.h).
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
#include "engine/megatron_format.h"
#include "engine/megatron_index.h"

namespace conveyor::engine::data_internal {
namespace {

absl::StatusOr<TokenComponent> OpenPrefix(const std::string& prefix,
                                          const DataConfig& config,
                                          const SampleShapes& shapes) {
  const std::string bin_path = MegatronBinPath(prefix);
  ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> bin,
                   MappedFile::Open(bin_path));
  ASSIGN_OR_RETURN(
      std::shared_ptr<const MegatronIndex> index,
      MegatronIndex::Open(MegatronIdxPath(prefix), bin_path, bin->size()));
  const MegatronDType dtype = index->dtype();
  TokenEncoding encoding{.bytes = MegatronDTypeBytes(dtype),
                         .is_signed = dtype == MegatronDType::kInt8 ||
                                      dtype == MegatronDType::kInt16 ||
                                      dtype == MegatronDType::kInt32 ||
                                      dtype == MegatronDType::kInt64,
                         .name = std::string(MegatronDTypeName(dtype))};
  ASSIGN_OR_RETURN(VocabBound vocab,
                   MakeVocabBound(config, shapes, MegatronDTypeIdLimit(dtype),
                                  encoding.name));
  const int64_t count = index->num_tokens();
  return TokenComponent{
      .stream = TokenStream(std::move(bin), 0, count, std::move(encoding),
                            std::move(vocab)),
      .index = std::move(index)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataSource>> CreateMegatron(
    const DataConfig& config, const SampleShapes& shapes) {
  if (config.path.empty() == config.blend.empty()) {
    return absl::InvalidArgumentError(
        "data.source megatron needs exactly one of data.path (one data set's "
        "prefix) and data.blend (several, by weight)");
  }
  std::vector<std::string> prefixes;
  if (!config.path.empty()) {
    prefixes.push_back(config.path);
  } else {
    for (const DataBlendEntry& e : config.blend) prefixes.push_back(e.path);
  }
  std::vector<TokenComponent> components;
  for (size_t k = 0; k < prefixes.size(); ++k) {
    if (prefixes[k].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.blend[", k, "].path is empty"));
    }
    absl::StatusOr<TokenComponent> c = OpenPrefix(prefixes[k], config, shapes);
    if (!c.ok()) {
      if (config.blend.empty()) return c.status();
      return absl::Status(
          c.status().code(),
          absl::StrCat("data.blend[", k, "]: ", c.status().message()));
    }
    components.push_back(*std::move(c));
  }
  return CreateTokenWindows(config, shapes, std::move(components));
}

}  // namespace conveyor::engine::data_internal
