#include "tokenizer/internal/tokenizer_json.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/strict_json.h"
#include "nlohmann/json.hpp"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status Unsupported(absl::string_view path, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(path, ": ", what));
}

// object[key] when present and not null, else nullptr.
const Json* Find(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<const Json*> RequireObject(const Json& object, const char* key,
                                          const std::string& path) {
  const Json* value = Find(object, key);
  if (value == nullptr) return Invalid(path, "missing");
  if (!value->is_object()) {
    return Invalid(
        path, absl::StrCat("is a ", value->type_name(), ", not an object"));
  }
  return value;
}

absl::StatusOr<std::string> RequireString(const Json& object, const char* key,
                                          const std::string& path) {
  const Json* value = Find(object, key);
  if (value == nullptr) return Invalid(path, "missing");
  if (!value->is_string()) {
    return Invalid(path,
                   absl::StrCat("is a ", value->type_name(), ", not a string"));
  }
  return value->get<std::string>();
}

absl::StatusOr<bool> OptionalBool(const Json& object, const char* key,
                                  bool default_value, const std::string& path) {
  const Json* value = Find(object, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) {
    return Invalid(
        path, absl::StrCat("is a ", value->type_name(), ", not true or false"));
  }
  return value->get<bool>();
}

// A token id: an integer in [0, kMaxTokenId].
absl::StatusOr<int64_t> TokenId(const Json& value, const std::string& path) {
  if (!value.is_number_integer()) {
    return Invalid(
        path, absl::StrCat("is a ", value.type_name(), ", not an integer id"));
  }
  if (value.is_number_unsigned()
          ? value.get<uint64_t>() > static_cast<uint64_t>(kMaxTokenId)
          : (value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxTokenId)) {
    return Invalid(path,
                   absl::StrCat("id ", value.dump(), " is out of range [0, ",
                                kMaxTokenId, "]"));
  }
  return value.get<int64_t>();
}

absl::Status ParseNormalizer(const Json& root, TokenizerJson* out) {
  const Json* normalizer = Find(root, "normalizer");
  if (normalizer == nullptr) return absl::OkStatus();
  const auto check_one = [&](const Json& item,
                             const std::string& path) -> absl::Status {
    if (!item.is_object()) return Invalid(path, "is not an object");
    ASSIGN_OR_RETURN(const std::string type,
                     RequireString(item, "type", path + ".type"));
    if (type != "NFC") {
      return Unsupported(path + ".type",
                         absl::StrCat("normalizer ", Quoted(type),
                                      " is not supported (supported: none, "
                                      "NFC, or a Sequence of NFC)"));
    }
    out->nfc = true;
    return absl::OkStatus();
  };
  if (!normalizer->is_object())
    return Invalid("normalizer", "is not an object");
  ASSIGN_OR_RETURN(const std::string type,
                   RequireString(*normalizer, "type", "normalizer.type"));
  if (type != "Sequence") return check_one(*normalizer, "normalizer");
  const Json* items = Find(*normalizer, "normalizers");
  if (items == nullptr || !items->is_array()) {
    return Invalid("normalizer.normalizers", "missing or not an array");
  }
  for (size_t i = 0; i < items->size(); ++i) {
    RETURN_IF_ERROR(check_one((*items)[i],
                              absl::StrCat("normalizer.normalizers[", i, "]")));
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& name,
                                            const std::string& path) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return Invalid(path, absl::StrCat(Quoted(name),
                                    " is not one of Removed, Isolated, "
                                    "MergedWithPrevious, MergedWithNext, "
                                    "Contiguous"));
}

absl::StatusOr<PreTokenizerStep> ParseStep(const Json& item,
                                           const std::string& path) {
  if (!item.is_object()) return Invalid(path, "is not an object");
  ASSIGN_OR_RETURN(const std::string type,
                   RequireString(item, "type", path + ".type"));
  PreTokenizerStep step;
  std::string pattern;
  if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    ASSIGN_OR_RETURN(const Json* spec,
                     RequireObject(item, "pattern", path + ".pattern"));
    if (const Json* regex = Find(*spec, "Regex"); regex != nullptr) {
      ASSIGN_OR_RETURN(pattern,
                       RequireString(*spec, "Regex", path + ".pattern.Regex"));
      pattern = Regex::FromOniguruma(pattern);
    } else if (Find(*spec, "String") != nullptr) {
      ASSIGN_OR_RETURN(
          const std::string literal,
          RequireString(*spec, "String", path + ".pattern.String"));
      if (literal.empty()) {
        // HF: an empty String pattern matches nothing.
        return step;
      }
      pattern = Regex::Escape(literal);
    } else {
      return Invalid(path + ".pattern", "has neither Regex nor String");
    }
    ASSIGN_OR_RETURN(const std::string behavior,
                     RequireString(item, "behavior", path + ".behavior"));
    ASSIGN_OR_RETURN(step.behavior,
                     ParseBehavior(behavior, path + ".behavior"));
    ASSIGN_OR_RETURN(step.invert,
                     OptionalBool(item, "invert", false, path + ".invert"));
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    // HF's defaults when the keys are missing.
    ASSIGN_OR_RETURN(step.add_prefix_space,
                     OptionalBool(item, "add_prefix_space", true,
                                  path + ".add_prefix_space"));
    ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(item, "use_regex", true,
                                                        path + ".use_regex"));
    if (use_regex) pattern = Regex::FromOniguruma(kGpt2Pattern);
  } else {
    return Unsupported(path + ".type",
                       absl::StrCat("pre-tokenizer ", Quoted(type),
                                    " is not supported (supported: Split, "
                                    "ByteLevel, and a Sequence of them)"));
  }
  if (!pattern.empty()) {
    absl::StatusOr<std::unique_ptr<Regex>> regex = Regex::Compile(pattern);
    if (!regex.ok()) return Invalid(path, regex.status().message());
    step.regex = *std::move(regex);
  }
  return step;
}

absl::Status ParsePreTokenizer(const Json& root, TokenizerJson* out) {
  const Json* pre_tokenizer = Find(root, "pre_tokenizer");
  if (pre_tokenizer == nullptr) {
    return Unsupported("pre_tokenizer",
                       "none: not a byte-level BPE (a SentencePiece-style "
                       "tokenizer.json? give its tokenizer.model instead)");
  }
  if (!pre_tokenizer->is_object()) {
    return Invalid("pre_tokenizer", "is not an object");
  }
  ASSIGN_OR_RETURN(const std::string type,
                   RequireString(*pre_tokenizer, "type", "pre_tokenizer.type"));
  if (type == "Sequence") {
    const Json* items = Find(*pre_tokenizer, "pretokenizers");
    if (items == nullptr || !items->is_array()) {
      return Invalid("pre_tokenizer.pretokenizers", "missing or not an array");
    }
    for (size_t i = 0; i < items->size(); ++i) {
      ASSIGN_OR_RETURN(
          PreTokenizerStep step,
          ParseStep((*items)[i],
                    absl::StrCat("pre_tokenizer.pretokenizers[", i, "]")));
      out->pre_tokenizer.push_back(std::move(step));
    }
  } else {
    ASSIGN_OR_RETURN(PreTokenizerStep step,
                     ParseStep(*pre_tokenizer, "pre_tokenizer"));
    out->pre_tokenizer.push_back(std::move(step));
  }
  // The byte-level alphabet is what the vocabulary is written in: without
  // the ByteLevel step the tokens are not byte strings. After it, a Split
  // would see that alphabet rather than the text.
  size_t byte_levels = 0;
  for (const PreTokenizerStep& step : out->pre_tokenizer) {
    byte_levels += step.kind == PreTokenizerStep::Kind::kByteLevel;
  }
  if (byte_levels == 0) {
    return Unsupported("pre_tokenizer",
                       "has no ByteLevel step: not a byte-level BPE (a "
                       "SentencePiece-style tokenizer.json? give its "
                       "tokenizer.model instead)");
  }
  if (byte_levels > 1 ||
      out->pre_tokenizer.back().kind != PreTokenizerStep::Kind::kByteLevel) {
    return Unsupported("pre_tokenizer",
                       "ByteLevel must be the last step, and the only one");
  }
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Json& root) {
  const Json* decoder = Find(root, "decoder");
  const auto byte_level = [](const Json& item) {
    return item.is_object() && item.contains("type") &&
           item["type"] == "ByteLevel";
  };
  bool ok = decoder != nullptr && byte_level(*decoder);
  if (decoder != nullptr && decoder->is_object() &&
      decoder->value("type", Json()) == "Sequence") {
    const Json* items = Find(*decoder, "decoders");
    ok = items != nullptr && items->is_array() && !items->empty();
    for (size_t i = 0; ok && i < items->size(); ++i) {
      ok = byte_level((*items)[i]);
    }
  }
  if (!ok) {
    return Unsupported(
        "decoder",
        absl::StrCat(decoder == nullptr ? std::string("none")
                                        : decoder->dump().substr(0, 120),
                     ": only the ByteLevel decoder is supported"));
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& root, TokenizerJson* out) {
  ASSIGN_OR_RETURN(const Json* model, RequireObject(root, "model", "model"));
  ASSIGN_OR_RETURN(const std::string type,
                   RequireString(*model, "type", "model.type"));
  if (type != "BPE") {
    const bool known =
        type == "WordPiece" || type == "WordLevel" || type == "Unigram";
    const std::string what = absl::StrCat(
        "model ", Quoted(type),
        known ? " is not supported: only byte-level BPE (GPT-2, Llama-3, "
                "Qwen2) is; for a SentencePiece model give its "
                "tokenizer.model"
              : " is not a model type HF defines");
    return known ? Unsupported("model.type", what)
                 : Invalid("model.type", what);
  }
  if (const Json* dropout = Find(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && *dropout == 0)) {
    return Unsupported("model.dropout",
                       absl::StrCat(dropout->dump(),
                                    ": BPE dropout (random merges) is not "
                                    "supported"));
  }
  ASSIGN_OR_RETURN(
      const bool byte_fallback,
      OptionalBool(*model, "byte_fallback", false, "model.byte_fallback"));
  if (byte_fallback) {
    return Unsupported("model.byte_fallback",
                       "a SentencePiece-style BPE (byte fallback) is not "
                       "supported; give its tokenizer.model instead");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* affix = Find(*model, key);
    if (affix != nullptr && !(affix->is_string() && affix->empty())) {
      return Unsupported(absl::StrCat("model.", key),
                         absl::StrCat(affix->dump(), ": not supported"));
    }
  }
  ASSIGN_OR_RETURN(
      out->ignore_merges,
      OptionalBool(*model, "ignore_merges", false, "model.ignore_merges"));
  ASSIGN_OR_RETURN(const Json* vocab,
                   RequireObject(*model, "vocab", "model.vocab"));
  out->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    ASSIGN_OR_RETURN(const int64_t id,
                     TokenId(it.value(), absl::StrCat("model.vocab[",
                                                      Quoted(it.key()), "]")));
    out->vocab.emplace_back(it.key(), id);
  }
  const Json* merges = Find(*model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return Invalid("model.merges", "missing or not an array");
  }
  out->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& merge = (*merges)[i];
    const std::string path = absl::StrCat("model.merges[", i, "]");
    if (merge.is_string()) {
      // "a b": HF splits on ' ' and wants exactly two parts.
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos ||
          text.find(' ', space + 1) != std::string::npos) {
        return Invalid(path, absl::StrCat(Quoted(text),
                                          " is not two tokens separated by "
                                          "one space"));
      }
      out->merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      out->merges.emplace_back(merge[0].get<std::string>(),
                               merge[1].get<std::string>());
    } else {
      return Invalid(path, absl::StrCat(merge.dump().substr(0, 120),
                                        " is neither \"a b\" nor [\"a\", "
                                        "\"b\"]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const Json& root, TokenizerJson* out) {
  const Json* tokens = Find(root, "added_tokens");
  if (tokens == nullptr) return absl::OkStatus();
  if (!tokens->is_array()) return Invalid("added_tokens", "is not an array");
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& item = (*tokens)[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!item.is_object()) return Invalid(path, "is not an object");
    AddedToken token;
    const Json* id = Find(item, "id");
    if (id == nullptr) return Invalid(path + ".id", "missing");
    ASSIGN_OR_RETURN(token.id, TokenId(*id, path + ".id"));
    ASSIGN_OR_RETURN(token.content,
                     RequireString(item, "content", path + ".content"));
    if (token.content.empty()) return Invalid(path + ".content", "is empty");
    // HF's AddedToken defaults for keys left out.
    ASSIGN_OR_RETURN(token.single_word, OptionalBool(item, "single_word", false,
                                                     path + ".single_word"));
    ASSIGN_OR_RETURN(token.lstrip,
                     OptionalBool(item, "lstrip", false, path + ".lstrip"));
    ASSIGN_OR_RETURN(token.rstrip,
                     OptionalBool(item, "rstrip", false, path + ".rstrip"));
    ASSIGN_OR_RETURN(token.special,
                     OptionalBool(item, "special", false, path + ".special"));
    ASSIGN_OR_RETURN(
        token.normalized,
        OptionalBool(item, "normalized", !token.special, path + ".normalized"));
    out->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerJson> ParseTokenizerJson(absl::string_view text) {
  StrictJsonOptions options;
  options.max_depth = 32;
  ASSIGN_OR_RETURN(const Json root, ParseStrictJson(text, "the file", options));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the top level is a ", root.type_name(), ", not an object"));
  }
  TokenizerJson out;
  // The model first: a WordPiece or Unigram file is told so, whatever else
  // it holds.
  RETURN_IF_ERROR(ParseModel(root, &out));
  RETURN_IF_ERROR(ParseNormalizer(root, &out));
  RETURN_IF_ERROR(ParsePreTokenizer(root, &out));
  RETURN_IF_ERROR(ParseDecoder(root));
  RETURN_IF_ERROR(ParseAddedTokens(root, &out));
  return out;
}

std::string Quoted(absl::string_view text) {
  constexpr size_t kMaxShown = 80;
  std::string shown =
      absl::StrCat("\"", absl::CHexEscape(text.substr(0, kMaxShown)), "\"");
  if (text.size() > kMaxShown) shown += "...";
  return shown;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
