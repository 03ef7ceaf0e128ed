#include "tokenizer/internal/special_tokens.h"

#include <sys/stat.h>

#include <cerrno>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

using Json = nlohmann::json;

// Configuration files are small; a chat template makes them a few KiB.
constexpr uint64_t kMaxConfigBytes = 64 << 20;

// Fills in what `path` says about the tokens not already given.
absl::Status ReadConfig(const std::string& path, SpecialTokenNames* names) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError(errno, path, "stat");
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path, kMaxConfigBytes));
  StrictJsonOptions options;
  options.max_depth = 64;
  absl::StatusOr<Json> json = ParseStrictJson(text, "the file", options);
  if (!json.ok()) {
    return absl::Status(json.status().code(),
                        absl::StrCat(path, ": ", json.status().message()));
  }
  if (!json->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the top level is not an object"));
  }
  for (auto [key, token] : {std::make_pair("bos_token", &names->bos),
                            std::make_pair("eos_token", &names->eos)}) {
    const auto it = json->find(key);
    if (token->given || it == json->end()) continue;
    token->given = true;
    token->source = path;
    if (it->is_null()) continue;
    const Json* content = &*it;
    if (it->is_object()) {
      const auto inner = it->find("content");
      content = inner == it->end() ? nullptr : &*inner;
    }
    if (content == nullptr || !content->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", key, " is ", it->dump().substr(0, 120),
          ", not a token (a string, or an object with a \"content\" string)"));
    }
    token->name = content->get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> Resolve(
    const NamedToken& token, const char* key, absl::string_view tokenizer_file,
    absl::FunctionRef<std::optional<int64_t>(absl::string_view)> find,
    std::optional<int64_t> model_id,
    std::initializer_list<absl::string_view> known_names) {
  if (token.given) {
    if (!token.name.has_value()) return std::nullopt;
    const std::optional<int64_t> id = find(*token.name);
    if (!id.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          token.source, ": ", key, " \"", absl::CHexEscape(*token.name),
          "\" is not in the vocabulary of ", tokenizer_file));
    }
    return id;
  }
  if (model_id.has_value()) return model_id;
  for (absl::string_view name : known_names) {
    if (std::optional<int64_t> id = find(name); id.has_value()) return id;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<SpecialTokenNames> ReadSpecialTokenNames(
    const std::string& directory) {
  SpecialTokenNames names;
  const std::string base = directory.empty() ? "." : directory;
  RETURN_IF_ERROR(ReadConfig(base + "/tokenizer_config.json", &names));
  RETURN_IF_ERROR(ReadConfig(base + "/special_tokens_map.json", &names));
  return names;
}

absl::StatusOr<SpecialTokenIds> ResolveSpecialTokens(
    const SpecialTokenNames& names, absl::string_view tokenizer_file,
    absl::FunctionRef<std::optional<int64_t>(absl::string_view)> find,
    std::optional<int64_t> model_bos, std::optional<int64_t> model_eos) {
  SpecialTokenIds ids;
  ASSIGN_OR_RETURN(
      ids.bos, Resolve(names.bos, "bos_token", tokenizer_file, find, model_bos,
                       {"<|begin_of_text|>", "<s>"}));
  ASSIGN_OR_RETURN(
      ids.eos, Resolve(names.eos, "eos_token", tokenizer_file, find, model_eos,
                       {"<|end_of_text|>", "<|endoftext|>", "</s>"}));
  return ids;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
