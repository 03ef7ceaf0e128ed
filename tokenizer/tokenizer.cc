#include "tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "tokenizer/internal/bpe_tokenizer.h"
#include "tokenizer/internal/sentencepiece_tokenizer.h"
#include "tokenizer/internal/special_tokens.h"
#include "tokenizer/internal/tokenizer_json.h"

namespace conveyor::tokenizer {
namespace {

namespace internal = tokenizer_internal;

// Llama-3's tokenizer.json is 9 MB, Qwen2's 7 MB; a Llama-2
// tokenizer.model 0.5 MB.
constexpr uint64_t kMaxTokenizerBytes = 1 << 30;

absl::Status InFile(const absl::Status& status, absl::string_view file) {
  return absl::Status(status.code(),
                      absl::StrCat(file, ": ", status.message()));
}

std::string DirectoryOf(const std::string& file) {
  const size_t slash = file.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : file.substr(0, slash);
}

// 0 when `path` exists, else errno.
int Stat(const std::string& path, struct stat* info) {
  return ::stat(path.c_str(), info) == 0 ? 0 : errno;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJson(const std::string& file) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(file, kMaxTokenizerBytes));
  absl::StatusOr<internal::TokenizerJson> json =
      internal::ParseTokenizerJson(text);
  if (!json.ok()) return InFile(json.status(), file);
  absl::StatusOr<std::unique_ptr<internal::BpeTokenizer>> tokenizer =
      internal::BpeTokenizer::Create(*std::move(json));
  if (!tokenizer.ok()) return InFile(tokenizer.status(), file);
  ASSIGN_OR_RETURN(const internal::SpecialTokenNames names,
                   internal::ReadSpecialTokenNames(DirectoryOf(file)));
  internal::BpeTokenizer& bpe = **tokenizer;
  ASSIGN_OR_RETURN(
      const internal::SpecialTokenIds ids,
      internal::ResolveSpecialTokens(
          names, file, [&](absl::string_view token) { return bpe.Find(token); },
          std::nullopt, std::nullopt));
  bpe.SetSpecialTokens(ids.bos, ids.eos);
  return std::unique_ptr<Tokenizer>(*std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModel(const std::string& file) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(file, kMaxTokenizerBytes));
  absl::StatusOr<std::unique_ptr<internal::SentencePieceTokenizer>> tokenizer =
      internal::SentencePieceTokenizer::Create(bytes);
  if (!tokenizer.ok()) return InFile(tokenizer.status(), file);
  ASSIGN_OR_RETURN(const internal::SpecialTokenNames names,
                   internal::ReadSpecialTokenNames(DirectoryOf(file)));
  internal::SentencePieceTokenizer& sp = **tokenizer;
  ASSIGN_OR_RETURN(
      const internal::SpecialTokenIds ids,
      internal::ResolveSpecialTokens(
          names, file, [&](absl::string_view piece) { return sp.Find(piece); },
          sp.model_bos(), sp.model_eos()));
  sp.SetSpecialTokens(ids.bos, ids.eos);
  return std::unique_ptr<Tokenizer>(*std::move(tokenizer));
}

// A file named neither *.json nor *.model: JSON starts with '{'.
absl::StatusOr<bool> LooksLikeJson(const std::string& file) {
  ASSIGN_OR_RETURN(const std::string head, ReadFile(file, kMaxTokenizerBytes));
  for (char c : head) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(
    const std::string& path) {
  struct stat info;
  if (const int error = Stat(path, &info); error != 0) {
    if (error == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no such tokenizer file or directory"));
    }
    return ErrnoError(error, path, "stat");
  }
  if (!S_ISDIR(info.st_mode)) {
    if (absl::EndsWith(path, ".json")) return LoadJson(path);
    if (absl::EndsWith(path, ".model")) return LoadModel(path);
    ASSIGN_OR_RETURN(const bool json, LooksLikeJson(path));
    return json ? LoadJson(path) : LoadModel(path);
  }
  const std::string base =
      path.back() == '/' ? path.substr(0, path.size() - 1) : path;
  const std::string json = base + "/tokenizer.json";
  const std::string model = base + "/tokenizer.model";
  const bool has_json = Stat(json, &info) == 0;
  const bool has_model = Stat(model, &info) == 0;
  if (has_json) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadJson(json);
    // Llama-2's directories hold a SentencePiece-style tokenizer.json
    // beside the tokenizer.model it was made from: the model serves.
    if (tokenizer.ok() || !has_model ||
        tokenizer.status().code() != absl::StatusCode::kUnimplemented) {
      return tokenizer;
    }
  }
  if (has_model) return LoadModel(model);
  return absl::NotFoundError(absl::StrCat(
      path, ": a directory with neither tokenizer.json nor tokenizer.model"));
}

}  // namespace conveyor::tokenizer
