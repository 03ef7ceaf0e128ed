// SentencePiece models (tokenizer.model) through libsentencepiece: a BPE
// model with byte fallback and the identity normalizer (as Llama-2's) is
// trained in the test on a few lines, then checked for the ids that follow
// from its layout (0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes <0x00>..<0xFF>)
// and for exact round trips.
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/sentencepiece_trainer.h"
#include "tests/tokenizer/tokenizer_json_builder.h"
#include "tokenizer/internal/utf8.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kText[] =
    "the quick brown fox jumps over the lazy dog\n"
    "a tokenizer turns text into ids and ids back into text\n"
    "the model reads the ids, one token at a time\n"
    "pipelines move activations from stage to stage\n"
    "the the the quick quick brown brown fox fox\n"
    "numbers like 12 and 345 appear in text too\n";

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // FreshTestDir names its directory after the running test, and there
    // is none yet.
    dir_ =
        new std::string(absl::StrCat(::testing::TempDir(), "/spm_", getpid()));
    std::filesystem::remove_all(*dir_);
    std::filesystem::create_directories(*dir_);
    testing::WriteText(*dir_ + "/corpus.txt", kText);
    // As Llama-2: BPE, byte fallback, text kept as it is.
    *error_ = testing::TrainSentencePiece(
        *dir_ + "/corpus.txt", *dir_ + "/tokenizer",
        "--model_type=bpe --vocab_size=300 --byte_fallback=true "
        "--character_coverage=1.0 --normalization_rule_name=identity "
        "--remove_extra_whitespaces=false --unk_id=0 --bos_id=1 --eos_id=2 "
        "--hard_vocab_limit=false --minloglevel=2");
  }

  void SetUp() override { ASSERT_EQ(*error_, "") << "training failed"; }

  static std::unique_ptr<Tokenizer> Load() {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t =
        Tokenizer::Load(*dir_ + "/tokenizer.model");
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  static std::string* dir_;
  static std::string* error_;
};

std::string* SentencePieceTokenizerTest::dir_ = nullptr;
std::string* SentencePieceTokenizerTest::error_ = new std::string;

TEST_F(SentencePieceTokenizerTest, LayoutAndSpecialTokens) {
  const auto t = Load();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), "sentencepiece");
  EXPECT_GE(t->vocab_size(), 259);  // 3 specials + 256 bytes + pieces.
  EXPECT_LE(t->vocab_size(), 300);
  EXPECT_EQ(t->bos_id(), 1);  // The model's own ids.
  EXPECT_EQ(t->eos_id(), 2);
  // A directory with only a tokenizer.model loads it.
  absl::StatusOr<std::unique_ptr<Tokenizer>> from_dir = Tokenizer::Load(*dir_);
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  EXPECT_EQ((*from_dir)->kind(), "sentencepiece");
}

TEST_F(SentencePieceTokenizerTest, DirectoryFallsBackFromAnUnsupportedJson) {
  // As in a Llama-2 directory: a tokenizer.json this reader does not take
  // (SentencePiece-style) beside the tokenizer.model it was made from.
  const std::string dir = *dir_ + "/llama2";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(*dir_ + "/tokenizer.model",
                             dir + "/tokenizer.model");
  testing::WriteText(dir + "/tokenizer.json",
                     R"({"model": {"type": "BPE", "byte_fallback": true,
                         "vocab": {}, "merges": []}})");
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->kind(), "sentencepiece");
  // Named directly, the JSON's own error.
  const absl::Status status = Tokenizer::Load(dir + "/tokenizer.json").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("byte_fallback"));
  // A broken tokenizer.json is not passed over: its error stands.
  testing::WriteText(dir + "/tokenizer.json", "{");
  EXPECT_EQ(Tokenizer::Load(dir).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SentencePieceTokenizerTest, UnseenCharactersFallBackToBytes) {
  const auto t = Load();
  ASSERT_NE(t, nullptr);
  // "€" (E2 82 AC) never occurs in the corpus: the dummy-prefix piece
  // "▁" then its three byte pieces, <0xNN> = 3 + 0xNN.
  absl::StatusOr<std::vector<int64_t>> ids = t->Encode("€");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 4u);
  EXPECT_THAT(std::vector<int64_t>(ids->begin() + 1, ids->end()),
              ElementsAre(3 + 0xE2, 3 + 0x82, 3 + 0xAC));
  EXPECT_EQ(*t->Decode(*ids), "€");
  EXPECT_EQ(*t->Decode({{3 + 0xE2, 3 + 0x82, 3 + 0xAC}}), "€");
}

TEST_F(SentencePieceTokenizerTest, ControlPiecesInTheTextAreTheirIds) {
  const auto t = Load();
  ASSERT_NE(t, nullptr);
  absl::StatusOr<std::vector<int64_t>> ids = t->Encode("<s>the</s>", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_GE(ids->size(), 4u);
  EXPECT_EQ(ids->front(), 1);  // add_bos
  EXPECT_EQ((*ids)[1], 1);     // "<s>" in the text
  EXPECT_EQ(ids->back(), 2);   // "</s>"
  EXPECT_EQ(*t->Decode(*ids), "<s><s>the</s>");
}

TEST_F(SentencePieceTokenizerTest, RoundTripsValidUtf8) {
  const auto t = Load();
  ASSERT_NE(t, nullptr);
  std::vector<std::string> corpus = {
      "",
      "the quick brown fox",
      "  leading and trailing spaces  ",
      "tabs\tand\nnewlines\n\n",
      "Ünïcödé 你好 🦙 €100",
      "<unk> <s></s> x",
  };
  // Random code points from several planes.
  std::mt19937 gen(3);
  std::uniform_int_distribution<uint32_t> plane(0, 3);
  for (int i = 0; i < 30; ++i) {
    std::string text;
    for (int j = 0; j < 40; ++j) {
      char32_t c;
      switch (plane(gen)) {
        case 0:
          c = 0x20 + gen() % 0x5F;
          break;
        case 1:
          c = 0xA0 + gen() % 0x700;
          break;
        case 2:
          c = 0x4E00 + gen() % 0x5000;
          break;
        default:
          c = 0x1F300 + gen() % 0x300;
          break;
      }
      tokenizer_internal::AppendUtf8(c, &text);
    }
    corpus.push_back(text);
  }
  for (const std::string& text : corpus) {
    absl::StatusOr<std::vector<int64_t>> ids = t->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    absl::StatusOr<std::string> decoded = t->Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
  }
}

TEST_F(SentencePieceTokenizerTest, RefusesBadInput) {
  const auto t = Load();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("a\xFF").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode({{-1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode({{t->vocab_size()}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Not a model: a clear error naming the file.
  const std::string bad = *dir_ + "/bad.model";
  testing::WriteText(bad, "not a protobuf at all \xFF\xFF\xFF");
  const absl::Status status = Tokenizer::Load(bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("bad.model"), HasSubstr("not a SentencePiece")));
}

}  // namespace
}  // namespace conveyor::tokenizer
