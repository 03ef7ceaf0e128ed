// Tokenizer::Load: where it looks, how it finds BOS and EOS, and what it
// refuses. Every hostile file is refused with an error that names the file
// and says what is wrong, never a crash.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TokenizerJsonBuilder;
using testing::WriteText;
using Json = nlohmann::json;

// The bytes, "a b" -> 256 and "ab c" -> 257, and two special tokens.
TokenizerJsonBuilder Small() {
  TokenizerJsonBuilder b;
  b.merges = {{"a", "b"}, {"ab", "c"}};
  b.split_pattern = testing::kLlama3Pattern;
  b.added_tokens = {{"<|begin_of_text|>", 300}, {"<|end_of_text|>", 301}};
  return b;
}

class TokenizerLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_util::FreshTestDir("load").string(); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    WriteText(path, text);
    return path;
  }

  // Loads a tokenizer.json holding `json`; the status.
  absl::Status LoadJson(const Json& json) {
    return Tokenizer::Load(Write("tokenizer.json", json.dump())).status();
  }

  std::string dir_;
};

TEST_F(TokenizerLoadTest, FindsTokenizerJsonInADirectoryOrByItsPath) {
  const std::string path = Write("tokenizer.json", Small().Json().dump());
  for (const std::string& where : {dir_, dir_ + "/", path}) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(where);
    ASSERT_TRUE(t.ok()) << where << ": " << t.status();
    EXPECT_EQ((*t)->kind(), "bpe");
    EXPECT_THAT(*(*t)->Encode("abc"), ::testing::ElementsAre(257));
  }
  // Any name: a file that starts with '{' is JSON.
  const std::string other = Write("vocab.bin", Small().Json().dump());
  EXPECT_TRUE(Tokenizer::Load(other).ok());
}

TEST_F(TokenizerLoadTest, BosAndEosFromTheConfigFilesFirst) {
  TokenizerJsonBuilder b = Small();
  b.added_tokens.push_back({"<|eot_id|>", 302});
  Write("tokenizer.json", b.Json().dump());
  // Known names when there is no configuration.
  auto t = *Tokenizer::Load(dir_);
  EXPECT_EQ(t->bos_id(), 300);
  EXPECT_EQ(t->eos_id(), 301);
  // tokenizer_config.json (an instruct model's EOS, as an object), then
  // special_tokens_map.json for what the first leaves out.
  Write("tokenizer_config.json",
        R"({"eos_token": {"__type": "AddedToken", "content": "<|eot_id|>"},
            "chat_template": "{{ x }}"})");
  Write(
      "special_tokens_map.json",
      R"({"bos_token": "<|end_of_text|>", "eos_token": "<|begin_of_text|>"})");
  t = *Tokenizer::Load(dir_);
  EXPECT_EQ(t->eos_id(), 302);
  EXPECT_EQ(t->bos_id(), 301);
  // null says there is none, whatever the names.
  Write("tokenizer_config.json", R"({"bos_token": null})");
  t = *Tokenizer::Load(dir_);
  EXPECT_EQ(t->bos_id(), std::nullopt);
  EXPECT_EQ(t->eos_id(), 300);  // From special_tokens_map.json.
  // A token the vocabulary lacks is an error naming the file.
  Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  absl::Status status = Tokenizer::Load(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("</s>"),
                    HasSubstr("not in the vocabulary")));
  // So is a value that is no token, and a file that is not JSON.
  Write("tokenizer_config.json", R"({"eos_token": 7})");
  EXPECT_THAT(Tokenizer::Load(dir_).status().message(),
              HasSubstr("eos_token is 7, not a token"));
  Write("tokenizer_config.json", "{");
  EXPECT_THAT(
      Tokenizer::Load(dir_).status().message(),
      AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("not valid JSON")));
}

TEST_F(TokenizerLoadTest, RefusesWhatIsNotThere) {
  absl::Status status = Tokenizer::Load(dir_ + "/missing.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("missing.json"));
  status = Tokenizer::Load(dir_).status();  // An empty directory.
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("neither tokenizer.json nor"));
  // A FIFO is refused without blocking on it; a directory named *.json
  // is a directory without tokenizers.
  const std::string fifo = dir_ + "/fifo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  status = Tokenizer::Load(fifo).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
  std::filesystem::create_directory(dir_ + "/dir.json");
  EXPECT_EQ(Tokenizer::Load(dir_ + "/dir.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TokenizerLoadTest, RefusesFilesThatAreNotTokenizerJson) {
  for (const std::string& text :
       {std::string(""), std::string("{\"model\": "), std::string("[1, 2]"),
        std::string(Small().Json().dump()).substr(0, 500),
        std::string(1000, '[')}) {
    const absl::Status status =
        Tokenizer::Load(Write("tokenizer.json", text)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(status.message(), HasSubstr("tokenizer.json: ")) << text;
  }
}

TEST_F(TokenizerLoadTest, RefusesOtherModelsAsUnsupported) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    Json json = Small().Json();
    json["model"]["type"] = type;
    const absl::Status status = LoadJson(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << type;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(type), HasSubstr("not supported")));
  }
  Json json = Small().Json();
  json["model"]["type"] = "Magic";
  EXPECT_EQ(LoadJson(json).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenizerLoadTest, RefusesWhatAByteLevelBpeDoesNotUse) {
  const auto refused = [&](const std::function<void(Json&)>& edit,
                           const std::string& what) {
    Json json = Small().Json();
    edit(json);
    const absl::Status status = LoadJson(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << what;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
  };
  refused(
      [](Json& j) {
        j["normalizer"] = {{"type", "Lowercase"}};
      },
      "normalizer \"Lowercase\" is not supported");
  refused(
      [](Json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      "pre-tokenizer \"Metaspace\" is not supported");
  refused([](Json& j) { j["pre_tokenizer"] = nullptr; },
          "not a byte-level BPE");
  refused(
      [](Json& j) {
        j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0];
      },
      "has no ByteLevel step");
  refused(
      [](Json& j) {
        j["decoder"] = {{"type", "WordPiece"}};
      },
      "only the ByteLevel decoder");
  refused([](Json& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  refused([](Json& j) { j["model"]["byte_fallback"] = true; },
          "tokenizer.model");
  refused([](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
          "continuing_subword_prefix");
  // A Sequence of NFC normalizers is fine.
  Json json = Small().Json();
  json["normalizer"] = {{"type", "Sequence"},
                        {"normalizers", {{{"type", "NFC"}}}}};
  EXPECT_TRUE(LoadJson(json).ok());
}

TEST_F(TokenizerLoadTest, RefusesInconsistentVocabulariesAndMerges) {
  const auto refused = [&](const std::function<void(Json&)>& edit,
                           const std::string& what) {
    Json json = Small().Json();
    edit(json);
    const absl::Status status = LoadJson(json);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(status.message()),
                AllOf(HasSubstr("tokenizer.json: "), HasSubstr(what)));
  };
  // A merge whose part, or whose result, is missing.
  refused([](Json& j) { j["model"]["merges"].push_back("a z9"); },
          "\"z9\" is not in the vocabulary");
  refused([](Json& j) { j["model"]["merges"].push_back("b c"); },
          "its result \"bc\" is not in the vocabulary");
  // A repeated merge, and a cyclic one (an empty part: its result is its
  // other part).
  refused([](Json& j) { j["model"]["merges"].push_back("ab c"); },
          "model.merges[2] (\"ab\" \"c\"): repeats model.merges[1]");
  refused(
      [](Json& j) {
        j["model"]["vocab"][""] = 270;
        j["model"]["merges"].push_back("a ");
      },
      "is cyclic");
  refused([](Json& j) { j["model"]["merges"].push_back("a b c"); },
          "is not two tokens separated by one space");
  refused([](Json& j) { j["model"]["merges"].push_back(Json::array({"a"})); },
          "is neither");
  // Ids: negative, past the limit, not integers, shared.
  refused([](Json& j) { j["model"]["vocab"]["zz"] = -1; }, "out of range");
  refused([](Json& j) { j["model"]["vocab"]["zz"] = int64_t{1} << 40; },
          "out of range");
  refused([](Json& j) { j["model"]["vocab"]["zz"] = 1.5; },
          "not an integer id");
  refused([](Json& j) { j["model"]["vocab"]["zz"] = 7; },
          "id 7 is given to both");
  // Ids so sparse that tables indexed by id would be huge.
  refused([](Json& j) { j["model"]["vocab"]["zz"] = 16000000; },
          "far sparser than a vocabulary");
  // A byte without a token.
  refused([](Json& j) { j["model"]["vocab"].erase("a"); },
          "no token for the byte 0x61");
  // Added tokens that disagree with the vocabulary or each other.
  refused([](Json& j) { j["added_tokens"][0]["id"] = 97; },
          "id 97 is \"a\" in model.vocab");
  refused([](Json& j) { j["added_tokens"][1]["id"] = 300; },
          "id 300 is given to an earlier added token");
  refused([](Json& j) { j["added_tokens"][0]["content"] = ""; }, "is empty");
  // A pattern that does not compile.
  refused(
      [](Json& j) {
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a";
      },
      "pattern \"(a\"");
  refused(
      [](Json& j) {
        j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
      },
      "is not one of Removed");
}

TEST_F(TokenizerLoadTest, DuplicateVocabularyKeysAreRefused) {
  // JSON with a key twice: nlohmann would keep the last silently.
  std::string text = Small().Json().dump();
  const size_t vocab = text.find("\"vocab\":{");
  ASSERT_NE(vocab, std::string::npos);
  text.insert(vocab + 9, "\"a\":5,");
  const absl::Status status =
      Tokenizer::Load(Write("tokenizer.json", text)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("duplicate key 'a'"));
}

// Random damage to a valid file: every load either fails with a message or
// gives a tokenizer whose round trip still holds; none crashes.
TEST_F(TokenizerLoadTest, DamagedFilesAreRefusedOrWork) {
  std::mt19937 gen(5);
  const Json good = Small().Json();
  const std::string text = good.dump();
  const auto check = [&](const std::string& contents) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::Load(Write("tokenizer.json", contents));
    if (!t.ok()) {
      EXPECT_FALSE(t.status().message().empty());
      return;
    }
    const std::string sample = "abc the <|end_of_text|> 12345\n\xFF";
    absl::StatusOr<std::vector<int64_t>> ids = (*t)->Encode(sample);
    if (!ids.ok()) return;  // A damaged pattern may fail to match.
    absl::StatusOr<std::string> back = (*t)->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
  };
  // Bytes flipped, inserted or cut.
  for (int i = 0; i < 100; ++i) {
    std::string damaged = text;
    const size_t at = gen() % damaged.size();
    switch (gen() % 3) {
      case 0:
        damaged[at] = static_cast<char>(gen());
        break;
      case 1:
        damaged.insert(at, 1, "{}[]\",:0\\"[gen() % 9]);
        break;
      default:
        damaged.resize(at);
        break;
    }
    check(damaged);
  }
  // Values replaced where they matter.
  const std::vector<Json> values = {
      nullptr, -1, 0,   97,     300,           70000,
      1.5,     "", "a", "ab c", Json::array(), Json::object(),
      true};
  for (int i = 0; i < 200; ++i) {
    Json damaged = good;
    const Json& value = values[gen() % values.size()];
    switch (gen() % 6) {
      case 0:
        damaged["model"]["merges"][gen() % 2] = value;
        break;
      case 1:
        damaged["model"]["vocab"]["ab"] = value;
        break;
      case 2:
        damaged["added_tokens"][gen() % 2]["id"] = value;
        break;
      case 3:
        damaged["added_tokens"][gen() % 2]["content"] = value;
        break;
      case 4:
        damaged["model"]["ignore_merges"] = value;
        break;
      default:
        damaged["pre_tokenizer"]["pretokenizers"][gen() % 2]["type"] = value;
        break;
    }
    check(damaged.dump());
  }
}

TEST_F(TokenizerLoadTest, PathologicalPatternFailsEncodeWithAClearError) {
  Json json = Small().Json();
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+$";
  ASSERT_TRUE(LoadJson(json).ok());
  auto t = *Tokenizer::Load(dir_);
  const absl::Status status = t->Encode(std::string(40, 'a') + "!").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("backtracks without bound"));
}

}  // namespace
}  // namespace conveyor::tokenizer
