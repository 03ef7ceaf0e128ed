// Small tokenizer.json files for tests, built from byte strings: ids 0..255
// are the 256 bytes (id = byte value), each merge's result gets the next id
// (unless an earlier merge made the same token), and extra tokens and added
// tokens take the ids given. The hand-checked ids in the tests follow from
// these rules alone.
#ifndef CONVEYOR_TESTS_TOKENIZER_TOKENIZER_JSON_BUILDER_H_
#define CONVEYOR_TESTS_TOKENIZER_TOKENIZER_JSON_BUILDER_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tokenizer/internal/byte_level.h"

namespace conveyor::tokenizer::testing {

// The patterns of the HF tokenizer.json files (GPT-2's is ByteLevel's own).
inline constexpr char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
inline constexpr char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct TestAddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

struct TokenizerJsonBuilder {
  // Pairs of byte strings, in rank order.
  std::vector<std::pair<std::string, std::string>> merges;
  // Byte strings with ids of their own (not made by any merge).
  std::vector<std::pair<std::string, int64_t>> extra_tokens;
  std::vector<TestAddedToken> added_tokens;
  bool ignore_merges = false;
  bool merges_as_lists = false;  // [a, b] rather than "a b".
  bool nfc = false;
  // kLlama3Pattern-style Split then ByteLevel(use_regex=false), or, when
  // empty, ByteLevel(use_regex=true) alone (GPT-2).
  std::string split_pattern;
  bool add_prefix_space = false;

  static nlohmann::json ByteLevelStep(bool use_regex, bool add_prefix_space) {
    return {{"type", "ByteLevel"},
            {"add_prefix_space", add_prefix_space},
            {"trim_offsets", true},
            {"use_regex", use_regex}};
  }

  // The id each byte string gets.
  std::map<std::string, int64_t> Ids() const {
    std::map<std::string, int64_t> ids;
    for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = b;
    int64_t next = 256;
    for (const auto& [left, right] : merges) {
      if (ids.emplace(left + right, next).second) ++next;
    }
    for (const auto& [token, id] : extra_tokens) ids[token] = id;
    return ids;
  }

  nlohmann::json Json() const {
    using tokenizer_internal::BytesToByteLevel;
    nlohmann::json vocab = nlohmann::json::object();
    for (const auto& [bytes, id] : Ids()) vocab[BytesToByteLevel(bytes)] = id;
    nlohmann::json merge_list = nlohmann::json::array();
    for (const auto& [left, right] : merges) {
      const std::string a = BytesToByteLevel(left);
      const std::string b = BytesToByteLevel(right);
      if (merges_as_lists) {
        merge_list.push_back({a, b});
      } else {
        merge_list.push_back(a + " " + b);
      }
    }
    nlohmann::json added = nlohmann::json::array();
    for (const TestAddedToken& t : added_tokens) {
      added.push_back({{"id", t.id},
                       {"content", t.content},
                       {"single_word", t.single_word},
                       {"lstrip", t.lstrip},
                       {"rstrip", t.rstrip},
                       {"normalized", t.normalized},
                       {"special", t.special}});
    }
    nlohmann::json pre_tokenizer;
    if (split_pattern.empty()) {
      pre_tokenizer = ByteLevelStep(true, add_prefix_space);
    } else {
      pre_tokenizer = {{"type", "Sequence"},
                       {"pretokenizers",
                        {{{"type", "Split"},
                          {"pattern", {{"Regex", split_pattern}}},
                          {"behavior", "Isolated"},
                          {"invert", false}},
                         ByteLevelStep(false, add_prefix_space)}}};
    }
    return {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer",
             nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json(nullptr)},
            {"pre_tokenizer", pre_tokenizer},
            {"post_processor", nullptr},
            {"decoder", ByteLevelStep(true, false)},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", ignore_merges},
              {"vocab", vocab},
              {"merges", merge_list}}}};
  }
};

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace conveyor::tokenizer::testing

#endif  // CONVEYOR_TESTS_TOKENIZER_TOKENIZER_JSON_BUILDER_H_
