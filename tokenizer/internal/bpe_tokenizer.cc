#include "tokenizer/internal/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tokenizer/internal/byte_level.h"
#include "tokenizer/internal/tokenizer_json.h"
#include "tokenizer/internal/utf8.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

absl::Status Invalid(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The merges in the byte domain, checked against the vocabulary (in the
// file's alphabet: `ids`).
absl::StatusOr<std::vector<BpeModel::Merge>> CheckMerges(
    const TokenizerJson& json,
    const absl::flat_hash_map<std::string, int64_t>& ids,
    const absl::flat_hash_map<std::string, int32_t>& byte_vocab) {
  std::vector<BpeModel::Merge> merges;
  merges.reserve(json.merges.size());
  absl::flat_hash_map<std::pair<int64_t, int64_t>, size_t> seen;
  seen.reserve(json.merges.size());
  for (size_t rank = 0; rank < json.merges.size(); ++rank) {
    const auto& [left, right] = json.merges[rank];
    // Built only for an error: a vocabulary has some 300 K merges.
    const auto path = [&, &left = left, &right = right] {
      return absl::StrCat("model.merges[", rank, "] (", Quoted(left), " ",
                          Quoted(right), ")");
    };
    if (left.empty() || right.empty()) {
      // Its result would be its other part: the merge feeds itself.
      return Invalid(path(),
                     "is cyclic: with an empty part its result is "
                     "one of its parts");
    }
    const auto left_id = ids.find(left);
    const auto right_id = ids.find(right);
    for (const auto& [part, it] :
         {std::make_pair(&left, left_id), std::make_pair(&right, right_id)}) {
      if (it == ids.end()) {
        return Invalid(
            path(), absl::StrCat(Quoted(*part), " is not in the vocabulary"));
      }
    }
    const std::string joined = left + right;
    const auto result = ids.find(joined);
    if (result == ids.end()) {
      return Invalid(path(), absl::StrCat("its result ", Quoted(joined),
                                          " is not in the vocabulary"));
    }
    const auto [previous, inserted] =
        seen.emplace(std::make_pair(left_id->second, right_id->second), rank);
    if (!inserted) {
      return Invalid(
          path(), absl::StrCat("repeats model.merges[", previous->second, "]"));
    }
    // A merge of tokens outside the byte-level alphabet can never apply to
    // bytes; it stays checked but unused.
    const std::optional<std::string> left_bytes = ByteLevelToBytes(left);
    const std::optional<std::string> right_bytes = ByteLevelToBytes(right);
    if (!left_bytes.has_value() || !right_bytes.has_value()) continue;
    merges.push_back({byte_vocab.at(*left_bytes), byte_vocab.at(*right_bytes),
                      byte_vocab.at(*left_bytes + *right_bytes)});
  }
  return merges;
}

}  // namespace

BpeTokenizer::BpeTokenizer(bool nfc, std::vector<PreTokenizerStep> steps,
                           BpeModel model)
    : nfc_(nfc), pre_tokenizer_(std::move(steps)), model_(std::move(model)) {}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(
    TokenizerJson json) {
  int64_t max_id = -1;
  for (const auto& [token, id] : json.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& token : json.added_tokens) {
    max_id = std::max(max_id, token.id);
  }
  // Tables are indexed by id: ids far sparser than any real vocabulary
  // (whose ids run 0..n-1, added tokens after) would make a small file cost
  // gigabytes.
  const size_t tokens = json.vocab.size() + json.added_tokens.size();
  if (max_id >= static_cast<int64_t>(2 * tokens + 1024)) {
    return Invalid("model.vocab",
                   absl::StrCat("ids run to ", max_id, " for ", tokens,
                                " tokens: far sparser than a vocabulary"));
  }
  // Each id's token as the file writes it, to find two with one id.
  std::vector<const std::string*> token_of_id(max_id + 1, nullptr);
  absl::flat_hash_map<std::string, int64_t> ids;  // In the file's alphabet.
  ids.reserve(json.vocab.size());
  absl::flat_hash_map<std::string, int32_t> byte_vocab;
  byte_vocab.reserve(json.vocab.size());
  absl::flat_hash_map<std::string, int64_t> other_ids;
  std::vector<std::string> decoded(max_id + 1);
  std::vector<bool> has_token(max_id + 1, false);
  for (const auto& [token, id] : json.vocab) {
    if (token_of_id[id] != nullptr) {
      return Invalid(
          "model.vocab",
          absl::StrCat("id ", id, " is given to both ",
                       Quoted(*token_of_id[id]), " and ", Quoted(token)));
    }
    token_of_id[id] = &token;
    ids.emplace(token, id);
    has_token[id] = true;
    if (std::optional<std::string> bytes = ByteLevelToBytes(token)) {
      decoded[id] = *bytes;
      byte_vocab.emplace(*std::move(bytes), static_cast<int32_t>(id));
    } else {
      // As HF's ByteLevel decoder does with a token outside its alphabet:
      // the token's own text.
      decoded[id] = token;
      other_ids.emplace(token, id);
    }
  }
  std::array<int32_t, 256> byte_ids;
  for (int byte = 0; byte < 256; ++byte) {
    const auto it = byte_vocab.find(std::string(1, static_cast<char>(byte)));
    if (it == byte_vocab.end()) {
      return Invalid(
          "model.vocab",
          absl::StrCat(
              "no token for the byte 0x", absl::Hex(byte, absl::kZeroPad2),
              " (",
              Quoted(BytesToByteLevel(std::string(1, static_cast<char>(byte)))),
              "): a byte-level vocabulary has all 256"));
    }
    byte_ids[byte] = it->second;
  }
  ASSIGN_OR_RETURN(std::vector<BpeModel::Merge> merges,
                   CheckMerges(json, ids, byte_vocab));

  // Added tokens: an id of their own, or the vocabulary's id for the same
  // text (GPT-2's <|endoftext|> is both).
  absl::flat_hash_map<std::string, int64_t> added_ids;
  std::vector<bool> added_id_seen(max_id + 1, false);
  for (size_t i = 0; i < json.added_tokens.size(); ++i) {
    const AddedToken& token = json.added_tokens[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (added_id_seen[token.id]) {
      return Invalid(path, absl::StrCat("id ", token.id,
                                        " is given to an earlier added token"));
    }
    added_id_seen[token.id] = true;
    if (!added_ids.emplace(token.content, token.id).second) {
      return Invalid(path, absl::StrCat(Quoted(token.content),
                                        " is an earlier added token too"));
    }
    if (token_of_id[token.id] != nullptr &&
        *token_of_id[token.id] != token.content) {
      return Invalid(
          path,
          absl::StrCat("id ", token.id, " is ", Quoted(*token_of_id[token.id]),
                       " in model.vocab, not ", Quoted(token.content)));
    }
    if (const auto it = ids.find(token.content);
        it != ids.end() && it->second != token.id) {
      return Invalid(path,
                     absl::StrCat(Quoted(token.content), " has id ", it->second,
                                  " in model.vocab, not ", token.id));
    }
    decoded[token.id] = token.content;
    has_token[token.id] = true;
  }

  auto tokenizer = std::unique_ptr<BpeTokenizer>(new BpeTokenizer(
      json.nfc, std::move(json.pre_tokenizer),
      BpeModel(std::move(byte_vocab), byte_ids, merges, json.ignore_merges)));
  tokenizer->added_tokens_ = std::move(json.added_tokens);
  std::vector<AddedTokenMatcher::Pattern> raw;
  std::vector<AddedTokenMatcher::Pattern> normalized;
  for (const AddedToken& token : tokenizer->added_tokens_) {
    if (!token.normalized) {
      raw.push_back({token.content, &token});
      continue;
    }
    // Matched against normalized text, so written normalized too.
    std::string text = token.content;
    if (json.nfc) {
      ASSIGN_OR_RETURN(text, ToNfc(token.content));
    }
    if (text.empty()) continue;
    normalized.push_back({std::move(text), &token});
  }
  tokenizer->raw_matcher_ = AddedTokenMatcher(std::move(raw));
  tokenizer->normalized_matcher_ = AddedTokenMatcher(std::move(normalized));
  tokenizer->added_ids_ = std::move(added_ids);
  tokenizer->other_ids_ = std::move(other_ids);
  tokenizer->decoded_ = std::move(decoded);
  tokenizer->has_token_ = std::move(has_token);
  return tokenizer;
}

std::optional<int64_t> BpeTokenizer::Find(absl::string_view token) const {
  if (const auto it = added_ids_.find(token); it != added_ids_.end()) {
    return it->second;
  }
  if (const auto it = other_ids_.find(token); it != other_ids_.end()) {
    return it->second;
  }
  if (std::optional<std::string> bytes = ByteLevelToBytes(token)) {
    if (const int32_t id = model_.Find(*bytes); id >= 0) return id;
  }
  return std::nullopt;
}

absl::Status BpeTokenizer::EncodePlain(absl::string_view text,
                                       std::vector<int64_t>* ids) const {
  return pre_tokenizer_.Run(
      text, [&](absl::string_view word) { model_.Encode(word, ids); });
}

absl::StatusOr<std::vector<int64_t>> BpeTokenizer::Encode(
    absl::string_view text, bool add_bos) const {
  std::vector<int64_t> ids;
  // English runs at about four bytes a token.
  ids.reserve(text.size() / 4 + 2);
  if (add_bos) {
    if (!bos_.has_value()) {
      return absl::FailedPreconditionError(
          "this tokenizer has no BOS token (see docs/tokenizers.md for how "
          "it is found)");
    }
    ids.push_back(*bos_);
  }
  std::vector<TextPiece> pieces;
  std::vector<TextPiece> inner;
  raw_matcher_.Split(text, &pieces);
  for (const TextPiece& piece : pieces) {
    if (piece.id != TextPiece::kText) {
      ids.push_back(piece.id);
      continue;
    }
    absl::string_view segment =
        text.substr(piece.start, piece.end - piece.start);
    std::string normalized;
    if (nfc_ && !IsNfc(segment)) {
      ASSIGN_OR_RETURN(normalized, ToNfc(segment));
      segment = normalized;
    }
    if (normalized_matcher_.empty()) {
      RETURN_IF_ERROR(EncodePlain(segment, &ids));
      continue;
    }
    normalized_matcher_.Split(segment, &inner);
    for (const TextPiece& part : inner) {
      if (part.id != TextPiece::kText) {
        ids.push_back(part.id);
      } else {
        RETURN_IF_ERROR(EncodePlain(
            segment.substr(part.start, part.end - part.start), &ids));
      }
    }
  }
  return ids;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(
    absl::Span<const int64_t> ids) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !has_token_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "id ", id, " (position ", i, ") is not in the vocabulary",
          id >= 0 && id < vocab_size()
              ? ": no token has it"
              : absl::StrCat(" of ", vocab_size(), " ids")));
    }
    text += decoded_[id];
  }
  return text;
}

}  // namespace conveyor::tokenizer::tokenizer_internal
