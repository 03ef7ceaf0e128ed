// HfCheckpoint: opening and reading. WriteHfCheckpoint is in
// checkpoint_writer.cc.
#include "hf/checkpoint.h"

#include <filesystem>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "engine/safetensors.h"
#include "nlohmann/json.hpp"

namespace conveyor::hf {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using engine::DType;
using engine::SafetensorsReader;

// config.json is a few KB; the index of a 400B model is a few hundred KB.
constexpr uint64_t kMaxConfigBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
// How many names of each kind CheckComplete lists before "... and N more".
constexpr size_t kMaxListed = 8;

// Names come from files: show them escaped, quoted and bounded.
std::string Quoted(absl::string_view name) {
  constexpr size_t kMaxShown = 120;
  std::string shown = absl::CHexEscape(name.substr(0, kMaxShown));
  if (name.size() > kMaxShown) shown += "...";
  return absl::StrCat("\"", shown, "\"");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

bool IsReadableFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

// Whether something (a file, a directory, a dangling link) is at `path`.
absl::StatusOr<bool> Exists(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoError(ec.value(), path, "stat");
  }
  return fs::exists(status);
}

// `status` with `prefix` before its message, same code.
absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(prefix, ": ", status.message()));
}

// "a", "b" and 3 more.
std::string ListNames(const std::vector<std::string>& names) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    shown.push_back(Quoted(names[i]));
  }
  std::string text = absl::StrJoin(shown, ", ");
  if (names.size() > kMaxListed) {
    absl::StrAppend(&text, " and ", names.size() - kMaxListed, " more");
  }
  return text;
}

}  // namespace

// The shard a read loaded last. Loading one evicts the previous, so at most
// one shard's bytes are resident.
struct HfCheckpoint::ShardCache {
  absl::Mutex mu;
  std::optional<size_t> shard ABSL_GUARDED_BY(mu);
  std::optional<SafetensorsReader> reader ABSL_GUARDED_BY(mu);
};

HfCheckpoint::HfCheckpoint() : cache_(std::make_unique<ShardCache>()) {}
HfCheckpoint::HfCheckpoint(HfCheckpoint&&) noexcept = default;
HfCheckpoint& HfCheckpoint::operator=(HfCheckpoint&&) noexcept = default;
HfCheckpoint::~HfCheckpoint() = default;

std::string HfCheckpoint::ShardPath(size_t shard) const {
  return (fs::path(dir_) / shard_files_[shard]).string();
}

absl::StatusOr<HfCheckpoint> HfCheckpoint::Open(const std::string& dir) {
  RETURN_IF_ERROR(CheckDirectory(dir, "checkpoint directory"));
  HfCheckpoint checkpoint;
  checkpoint.dir_ = dir;
  const std::string config_path = (fs::path(dir) / kHfConfigFile).string();
  ASSIGN_OR_RETURN(const std::string config_text,
                   ReadFile(config_path, kMaxConfigBytes));
  ASSIGN_OR_RETURN(checkpoint.config_,
                   ParseHfLlamaConfig(config_text, config_path));
  for (auto& [name, shape] : ExpectedLlamaTensors(checkpoint.config_)) {
    checkpoint.expected_.emplace(std::move(name), std::move(shape));
  }

  const std::string weights_path = (fs::path(dir) / kHfWeightsFile).string();
  const std::string index_path = (fs::path(dir) / kHfIndexFile).string();
  ASSIGN_OR_RETURN(const bool has_weights, Exists(weights_path));
  ASSIGN_OR_RETURN(const bool has_index, Exists(index_path));
  if (has_weights && has_index) {
    // transformers would silently pick one; they may disagree.
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": holds both ", kHfWeightsFile, " and ",
                     kHfIndexFile, "; remove the one that is stale"));
  }
  if (has_index) {
    RETURN_IF_ERROR(checkpoint.LoadIndex(index_path));
  } else if (has_weights) {
    RETURN_IF_ERROR(checkpoint.AddShard(kHfWeightsFile, nullptr));
  } else {
    ASSIGN_OR_RETURN(const bool has_bin,
                     Exists((fs::path(dir) / "pytorch_model.bin").string()));
    return absl::NotFoundError(absl::StrCat(
        dir, ": no ", kHfWeightsFile, " or ", kHfIndexFile,
        has_bin ? " (pytorch_model.bin is not read: convert the checkpoint "
                  "to safetensors)"
                : ""));
  }
  return checkpoint;
}

absl::Status HfCheckpoint::LoadIndex(const std::string& index_path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadFile(index_path, kMaxIndexBytes));
  ASSIGN_OR_RETURN(const Json index, ParseStrictJson(text, index_path));
  auto error = [&](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", message));
  };
  if (!index.is_object()) return error("must be a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return error("weight_map: must be an object {tensor name: shard file}");
  }
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it->is_string()) {
      return error(absl::StrCat("weight_map: ", Quoted(it.key()),
                                ": must be a shard file name"));
    }
    const std::string& shard = it->get_ref<const std::string&>();
    // A bare file name in DIR: nothing in an index may point elsewhere.
    if (shard.empty() || shard.find('/') != std::string::npos ||
        shard.find("..") != std::string::npos ||
        shard.find('\0') != std::string::npos || shard == ".") {
      return error(absl::StrCat("weight_map: ", Quoted(it.key()),
                                ": shard file ", Quoted(shard),
                                " is not a plain file name in the checkpoint "
                                "directory"));
    }
    weight_map.emplace(it.key(), shard);
    shards.insert(shard);
  }
  for (const std::string& shard : shards) {
    RETURN_IF_ERROR(AddShard(shard, &weight_map));
  }
  // Every shard has been read, so a name still unaccounted for is in none.
  for (const auto& [name, shard] : weight_map) {
    if (!tensors_.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          (fs::path(dir_) / shard).string(), ": has no tensor ", Quoted(name),
          ", which ", kHfIndexFile, "'s weight_map places there"));
    }
  }
  return absl::OkStatus();
}

absl::Status HfCheckpoint::AddShard(
    const std::string& file,
    const std::map<std::string, std::string>* weight_map) {
  const size_t shard = shard_files_.size();
  shard_files_.push_back(file);
  const std::string path = ShardPath(shard);
  {
    // Free the previous shard before the next one is read.
    absl::MutexLock lock(&cache_->mu);
    cache_->reader.reset();
    cache_->shard.reset();
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    // A shard the index names but that is not there is a broken
    // checkpoint, whatever the errno says.
    if (weight_map != nullptr && absl::IsNotFound(reader.status())) {
      return absl::NotFoundError(absl::StrCat(
          path, ": missing, but ", kHfIndexFile, " names it as a shard"));
    }
    return reader.status();
  }
  for (const engine::TensorInfo& info : reader->tensors()) {
    if (weight_map != nullptr) {
      const auto it = weight_map->find(info.name);
      if (it == weight_map->end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": holds tensor ", Quoted(info.name),
                         ", which is not in ", kHfIndexFile, "'s weight_map"));
      }
      if (it->second != file) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": holds tensor ", Quoted(info.name), ", which ",
            kHfIndexFile, "'s weight_map places in ", Quoted(it->second),
            " (a tensor in two shards, or an index that disagrees with them)"));
      }
    }
    tensors_.emplace(info.name, StoredTensor{shard, info.dtype, info.shape});
  }
  {
    absl::MutexLock lock(&cache_->mu);
    cache_->reader.emplace(*std::move(reader));
    cache_->shard = shard;
  }
  return absl::OkStatus();
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, stored] : tensors_) names.push_back(name);
  return names;
}

absl::Status HfCheckpoint::CheckStored(
    const std::string& hf_name, const StoredTensor& stored,
    const std::vector<int64_t>& expected) const {
  if (!IsReadableFloat(stored.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ShardPath(stored.shard), ": tensor ", Quoted(hf_name), ": dtype ",
        engine::DTypeName(stored.dtype), "; expected F32, F16 or BF16"));
  }
  if (stored.shape != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(ShardPath(stored.shard), ": tensor ", Quoted(hf_name),
                     ": shape ", ShapeString(stored.shape), "; ", kHfConfigFile,
                     " implies ", ShapeString(expected)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> HfCheckpoint::ReadConveyorTensor(
    const std::string& conveyor_name) const {
  const int64_t n = config_.num_hidden_layers;
  absl::StatusOr<std::string> mapped = ConveyorNameToHf(conveyor_name, n);
  if (!mapped.ok()) return Prefixed(dir_, mapped.status());
  std::string hf_name = *std::move(mapped);
  auto expected = expected_.find(conveyor_name);
  if (expected == expected_.end() && config_.tie_word_embeddings &&
      conveyor_name == absl::StrCat("layers.", n + 2, ".weight")) {
    // The tied lm_head is the embedding, stored once.
    expected = expected_.find("layers.0.weight");
    hf_name = "model.embed_tokens.weight";
  }
  if (expected == expected_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir_, ": ", Quoted(conveyor_name), " (HF ", Quoted(hf_name),
        ") is not a parameter of this model (attention_bias is ",
        config_.attention_bias ? "true" : "false", ")"));
  }
  const auto stored = tensors_.find(hf_name);
  if (stored == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": tensor ", Quoted(hf_name), " (Conveyor ",
                     Quoted(conveyor_name), ") is not in the checkpoint"));
  }
  RETURN_IF_ERROR(CheckStored(hf_name, stored->second, expected->second));

  const size_t shard = stored->second.shard;
  absl::MutexLock lock(&cache_->mu);
  if (cache_->shard != shard) {
    // Drop the old shard before loading the next: one resident at a time.
    cache_->reader.reset();
    cache_->shard.reset();
    ASSIGN_OR_RETURN(SafetensorsReader reader,
                     SafetensorsReader::Open(ShardPath(shard)));
    cache_->reader.emplace(std::move(reader));
    cache_->shard = shard;
  }
  // The file may have been replaced since Open: check what is there now.
  const engine::TensorInfo* info = cache_->reader->Find(hf_name);
  if (info == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(ShardPath(shard), ": tensor ", Quoted(hf_name),
                     " is gone (the file changed since it was opened)"));
  }
  RETURN_IF_ERROR(CheckStored(hf_name, {shard, info->dtype, info->shape},
                              expected->second));
  return cache_->reader->ReadF32(hf_name);
}

absl::Status HfCheckpoint::CheckComplete() const {
  const int64_t n = config_.num_hidden_layers;
  std::set<std::string> expected_hf;
  std::vector<std::string> missing;
  std::vector<std::string> mismatched;
  // In layer order, so that the first missing tensors are listed first.
  for (const auto& [conveyor_name, shape] : ExpectedLlamaTensors(config_)) {
    ASSIGN_OR_RETURN(const std::string hf_name,
                     ConveyorNameToHf(conveyor_name, n));
    expected_hf.insert(hf_name);
    const auto stored = tensors_.find(hf_name);
    if (stored == tensors_.end()) {
      missing.push_back(hf_name);
    } else if (absl::Status s = CheckStored(hf_name, stored->second, shape);
               !s.ok()) {
      mismatched.emplace_back(s.message());
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [hf_name, stored] : tensors_) {
    if (!expected_hf.contains(hf_name) && !IsIgnorableHfTensor(hf_name)) {
      unexpected.push_back(hf_name);
    }
  }
  if (missing.empty() && mismatched.empty() && unexpected.empty()) {
    return absl::OkStatus();
  }
  std::vector<std::string> problems;
  if (!missing.empty()) {
    problems.push_back(absl::StrCat("missing ", missing.size(),
                                    " tensor(s): ", ListNames(missing)));
  }
  for (size_t i = 0; i < mismatched.size() && i < kMaxListed; ++i) {
    problems.push_back(mismatched[i]);
  }
  if (mismatched.size() > kMaxListed) {
    problems.push_back(absl::StrCat(mismatched.size() - kMaxListed,
                                    " more tensor(s) of the wrong dtype or "
                                    "shape"));
  }
  if (!unexpected.empty()) {
    std::string text = absl::StrCat("unexpected ", unexpected.size(),
                                    " tensor(s): ", ListNames(unexpected));
    if (config_.tie_word_embeddings &&
        tensors_.contains(std::string("lm_head.weight"))) {
      absl::StrAppend(&text,
                      " (tie_word_embeddings is true, so lm_head.weight "
                      "should not be stored)");
    }
    problems.push_back(std::move(text));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(dir_, ": ", absl::StrJoin(problems, "; ")));
}

}  // namespace conveyor::hf
