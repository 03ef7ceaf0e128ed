// Byte-level BPE from tokenizer.json files built in the test
// (tokenizer_json_builder.h: ids 0..255 are the bytes, merges get the
// next ids), with GPT-2's and Llama-3's patterns. Every expected id list is
// worked out by hand from the pattern (which pre-tokens the text splits
// into) and the merges (lowest rank first, leftmost among equals), and the
// comments show the working.
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"
#include "tests/tokenizer/tokenizer_json_builder.h"
#include "tokenizer/tokenizer.h"

namespace conveyor::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::kLlama3Pattern;
using testing::TokenizerJsonBuilder;

// The merges of these tests (ids from 256 in this order):
//  256 "Ġt"  257 "he"  258 "Ġthe"  259 "'s"  260 "'L"  261 "LL"
//  262 "12"  263 "123"  264 "ĠĠ"  265 "ĊĊ"  266 F0 9F  267 F0 9F A6
//  268 F0 9F A6 99 (🦙)
TokenizerJsonBuilder Merges() {
  TokenizerJsonBuilder b;
  b.merges = {{" ", "t"},
              {"h", "e"},
              {" t", "he"},
              {"'", "s"},
              {"'", "L"},
              {"L", "L"},
              {"1", "2"},
              {"12", "3"},
              {" ", " "},
              {"\n", "\n"},
              {"\xF0", "\x9F"},
              {"\xF0\x9F", "\xA6"},
              {"\xF0\x9F\xA6", "\x99"}};
  return b;
}

TokenizerJsonBuilder Llama3() {
  TokenizerJsonBuilder b = Merges();
  b.split_pattern = kLlama3Pattern;
  b.added_tokens = {{"<|begin_of_text|>", 300}, {"<|end_of_text|>", 301}};
  return b;
}

TokenizerJsonBuilder Gpt2() {
  TokenizerJsonBuilder b = Merges();
  b.added_tokens = {{"<|endoftext|>", 300}};
  return b;
}

std::unique_ptr<Tokenizer> Load(const TokenizerJsonBuilder& builder) {
  const std::string dir = testing_util::FreshTestDir("bpe").string();
  testing::WriteText(dir + "/tokenizer.json", builder.Json().dump());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::vector<int64_t> Ids(const Tokenizer& tokenizer, const std::string& text) {
  absl::StatusOr<std::vector<int64_t>> ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  if (!ids.ok()) return {};
  absl::StatusOr<std::string> decoded = tokenizer.Decode(*ids);
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded.value_or(""), text) << "round trip";
  return *ids;
}

TEST(BpeTokenizerTest, LoadsWithItsSizeKindAndSpecialTokensByName) {
  const auto llama = Load(Llama3());
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->kind(), "bpe");
  EXPECT_EQ(llama->vocab_size(), 302);  // Ids 269..299 have no token.
  EXPECT_EQ(llama->bos_id(), 300);      // <|begin_of_text|>
  EXPECT_EQ(llama->eos_id(), 301);      // <|end_of_text|>
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(gpt2, nullptr);
  EXPECT_EQ(gpt2->bos_id(), std::nullopt);
  EXPECT_EQ(gpt2->eos_id(), 300);  // <|endoftext|>
}

TEST(BpeTokenizerTest, MergesLowestRankFirstInEachPreToken) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  // "the" | " cat" | "'s" | " " | "123" | "45":
  //   t h e -> t he (257; "t he" is no merge);  Ġ c a t: no merge;
  //   ' s -> 's (259);  1 2 3 -> 12 3 -> 123 (263);  4 5: no merge.
  EXPECT_THAT(Ids(*t, "the cat's 12345"),
              ElementsAre(116, 257, 32, 99, 97, 116, 259, 32, 263, 52, 53));
  // " the": Ġ t h e -> Ġt h e (rank 0) -> Ġt he (1) -> Ġthe (2).
  EXPECT_THAT(Ids(*t, " the"), ElementsAre(258));
}

TEST(BpeTokenizerTest, Llama3ContractionsIgnoreCaseGpt2sDoNot) {
  // Llama-3: "WE" | "'LL" (?i: contraction); in "'LL" the merge "' L"
  // (rank 4) comes before "L L" (rank 5): 'L L.
  const auto llama = Load(Llama3());
  ASSERT_NE(llama, nullptr);
  EXPECT_THAT(Ids(*llama, "WE'LL"), ElementsAre(87, 69, 260, 76));
  // GPT-2: contractions are lower case only: "WE" | "'" | "LL" -> LL (261).
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(gpt2, nullptr);
  EXPECT_THAT(Ids(*gpt2, "WE'LL"), ElementsAre(87, 69, 39, 261));
  // Lower case, both: "we" | "'s".
  EXPECT_THAT(Ids(*llama, "we's"), ElementsAre(119, 101, 259));
  EXPECT_THAT(Ids(*gpt2, "we's"), ElementsAre(119, 101, 259));
}

TEST(BpeTokenizerTest, Llama3SplitsDigitsInThreesGpt2KeepsTheRun) {
  const auto llama = Load(Llama3());
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  // Llama-3: "123" | "123" | "1": 263, 263, 49.
  EXPECT_THAT(Ids(*llama, "1231231"), ElementsAre(263, 263, 49));
  // GPT-2: one pre-token "1231231": 1 2 merges twice (rank 6, leftmost
  // first), then 12 3 twice (rank 7): 123 123 1.
  EXPECT_THAT(Ids(*gpt2, "1231231"), ElementsAre(263, 263, 49));
  // The split shows where a merge would cross it: "12" | "312" under
  // GPT-2 would be one pre-token "12312": 12 3 12 -> 123 12.
  EXPECT_THAT(Ids(*gpt2, "12312"), ElementsAre(263, 262));
  // Llama-3: "123" | "12".
  EXPECT_THAT(Ids(*llama, "12312"), ElementsAre(263, 262));
  // And "1212": GPT-2 12 12; Llama-3 "121" | "2": 12 1, 2.
  EXPECT_THAT(Ids(*gpt2, "1212"), ElementsAre(262, 262));
  EXPECT_THAT(Ids(*llama, "1212"), ElementsAre(262, 49, 50));
}

TEST(BpeTokenizerTest, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  // "a" | "  " (\s+(?!\S) stops before the last space) | " the":
  // ĠĠ (264); Ġthe (258).
  EXPECT_THAT(Ids(*t, "a   the"), ElementsAre(97, 264, 258));
  // Trailing white space is one run: "a" | "   " -> ĠĠ Ġ (leftmost first).
  EXPECT_THAT(Ids(*t, "a   "), ElementsAre(97, 264, 32));
  // A tab and spaces: "\t " is white space followed by "b": "\t" | " b".
  EXPECT_THAT(Ids(*t, "\t b"), ElementsAre(9, 32, 98));
}

TEST(BpeTokenizerTest, NewlinesGroupInLlama3) {
  const auto llama = Load(Llama3());
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  // Llama-3: "a" | "\n\n\n" (\s*[\r\n]+) -> ĊĊ Ċ | "the" -> t he.
  EXPECT_THAT(Ids(*llama, "a\n\n\nthe"), ElementsAre(97, 265, 10, 116, 257));
  // Llama-3: "  \n" takes the spaces before the newline; then " " and
  // " b" (the last space goes with the word): Ġ Ġ Ċ -> ĠĠ Ċ | Ġ | Ġ b.
  EXPECT_THAT(Ids(*llama, "a  \n  b"), ElementsAre(97, 264, 10, 32, 32, 98));
  // GPT-2: "a" | "  \n " (\s+(?!\S)) | " b": ĠĠ Ċ Ġ, then Ġ b.
  EXPECT_THAT(Ids(*gpt2, "a  \n  b"), ElementsAre(97, 264, 10, 32, 32, 98));
  // Llama-3 keeps the newlines after punctuation with it: ".\n\n" is one
  // pre-token -> . ĊĊ.
  EXPECT_THAT(Ids(*llama, "a.\n\nb"), ElementsAre(97, 46, 265, 98));
}

TEST(BpeTokenizerTest, EmojiAndOtherMultiByteCharacters) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  // "🦙🦙!" is one pre-token (symbols and punctuation): F0 9F merges at
  // both places (rank 10, leftmost first), then F09F A6, then F09FA6 99.
  EXPECT_THAT(Ids(*t, "🦙🦙!"), ElementsAre(268, 268, 33));
  // "é日" (C3 A9, E6 97 A5) is one pre-token without merges: its bytes.
  EXPECT_THAT(Ids(*t, "é日"), ElementsAre(0xC3, 0xA9, 0xE6, 0x97, 0xA5));
  // " 🦙" under Llama-3: " ?[^\s\p{L}\p{N}]+" takes the space with it.
  EXPECT_THAT(Ids(*t, " 🦙"), ElementsAre(32, 268));
}

TEST(BpeTokenizerTest, SpecialTokensInTheTextAreSplitOutFirst) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  // <|begin_of_text|> the <|end_of_text|>, then an unfinished one as text:
  // "<|" | "end" | "_of" | "_text".
  EXPECT_THAT(Ids(*t, "<|begin_of_text|>the<|end_of_text|><|end_of_text"),
              ElementsAre(300, 116, 257, 301, 60, 124, 101, 110, 100, 95, 111,
                          102, 95, 116, 101, 120, 116));
  // add_bos puts BOS in front; a BOS in the text stays where it is.
  absl::StatusOr<std::vector<int64_t>> ids =
      t->Encode("<|begin_of_text|>", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(300, 300));
}

TEST(BpeTokenizerTest, InvalidUtf8BytesRoundTrip) {
  const auto llama = Load(Llama3());
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  // Invalid bytes match no pattern item: they are a pre-token of their own.
  EXPECT_THAT(Ids(*llama,
                  "a\xFF\xFE"
                  "b"),
              ElementsAre(97, 255, 254, 98));
  EXPECT_THAT(Ids(*gpt2, "the\x80"), ElementsAre(116, 257, 0x80));
  // A truncated emoji: F0 9F A6 merges, the missing last byte is fine.
  EXPECT_THAT(Ids(*llama, "\xF0\x9F\xA6"), ElementsAre(267));
}

TEST(BpeTokenizerTest, IgnoreMergesTakesAWholePreTokenFromTheVocabulary) {
  TokenizerJsonBuilder b = Llama3();
  b.extra_tokens = {{" Llama", 400}};  // No merges make it.
  const auto merging = Load(b);
  ASSERT_NE(merging, nullptr);
  EXPECT_THAT(Ids(*merging, " Llama"), ElementsAre(32, 76, 108, 97, 109, 97));
  b.ignore_merges = true;
  const auto whole = Load(b);
  ASSERT_NE(whole, nullptr);
  EXPECT_THAT(Ids(*whole, " Llama Llamas"),
              ElementsAre(400, 32, 76, 108, 97, 109, 97, 115));
}

TEST(BpeTokenizerTest, MergesAsListsReadLikeStrings) {
  TokenizerJsonBuilder b = Llama3();
  b.merges_as_lists = true;
  const auto t = Load(b);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, " the"), ElementsAre(258));
}

TEST(BpeTokenizerTest, NfcNormalizerComposesBeforeSplitting) {
  TokenizerJsonBuilder b = Llama3();
  b.merges.push_back({"\xC3", "\xA9"});  // 269 "é" (U+00E9).
  b.nfc = true;
  const auto t = Load(b);
  ASSERT_NE(t, nullptr);
  // "e" + U+0301 (combining acute) is "é" in NFC: one letter, one merge.
  absl::StatusOr<std::vector<int64_t>> ids = t->Encode(
      "caf"
      "e\xCC\x81");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(99, 97, 102, 269));
  absl::StatusOr<std::string> text = t->Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "caf\xC3\xA9");  // NFC(s), not s.
  // Without the normalizer: "caf" "e" | U+0301 (a mark, not a letter).
  b.nfc = false;
  const auto raw = Load(b);
  ASSERT_NE(raw, nullptr);
  EXPECT_THAT(Ids(*raw, "cafe\xCC\x81"),
              ElementsAre(99, 97, 102, 101, 0xCC, 0x81));
}

TEST(BpeTokenizerTest, DecodeRefusesIdsOutsideTheVocabulary) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  for (int64_t id : {int64_t{-1}, int64_t{302}, int64_t{1} << 40}) {
    absl::StatusOr<std::string> text = t->Decode({{116, id}});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_THAT(text.status().message(), HasSubstr("not in the vocabulary"));
  }
  // 280 is inside the range but no token has it.
  EXPECT_EQ(t->Decode({{280}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BpeTokenizerTest, AddBosWithoutBosFails) {
  const auto t = Load(Gpt2());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("x", true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(BpeTokenizerTest, RoundTripsAnyBytes) {
  const auto llama = Load(Llama3());
  const auto gpt2 = Load(Gpt2());
  ASSERT_NE(llama, nullptr);
  ASSERT_NE(gpt2, nullptr);
  std::vector<std::string> corpus = {
      "",
      "Hello, world! It's 2024: 12345 apples.\n\n\tIndented  text   here.  ",
      "Ünïcödé ñ 你好，世界！ Привет мир. مرحبا "
      "🦙🦙 "
      "👨‍👩‍👧 "
      "e\xCC\x81",
      "<|begin_of_text|><|end_of_text|><|endoftext|> <|begin_of_text",
      "\r\n\r\n \u00a0\u2003\u3000x\xC2\x85y",
  };
  std::mt19937 gen(7);
  for (int length : {1, 2, 7, 64, 65, 300, 5000}) {
    for (int i = 0; i < 5; ++i) {
      std::string bytes(length, '\0');
      for (char& c : bytes) c = static_cast<char>(gen() & 0xFF);
      corpus.push_back(bytes);
    }
  }
  // A long run of one letter and of spaces: one pre-token merged with the
  // heap (longer than BpeModel::kScanLimit).
  corpus.push_back(std::string(3000, 'L'));
  corpus.push_back("x" + std::string(3000, ' ') + "y");
  for (const std::string& text : corpus) {
    for (const Tokenizer* t : {llama.get(), gpt2.get()}) {
      absl::StatusOr<std::vector<int64_t>> ids = t->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      absl::StatusOr<std::string> decoded = t->Decode(*ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, text);
    }
  }
}

TEST(BpeTokenizerTest, EncodeIsTheSameFromManyThreads) {
  const auto t = Load(Llama3());
  ASSERT_NE(t, nullptr);
  const std::string text = "the cat's 12345 WE'LL 🦙🦙! the the the\n\n";
  const std::vector<int64_t> expected = *t->Encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 200; ++j) {
        if (*t->Encode(text) != expected) ++mismatches;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace conveyor::tokenizer
