// The pre-tokenizer patterns of GPT-2, Llama-3 and Qwen2 on the cases HF's
// tokenizers are known for, each expected split worked out by hand from
// the pattern (alternatives tried left to right at each position, greedy
// quantifiers backing off as far as a lookahead needs), and the Split
// behaviours on HF's own example.
#include "tokenizer/internal/pre_tokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/tokenizer_json_builder.h"

namespace conveyor::tokenizer::tokenizer_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

PreTokenizerStep SplitStep(const std::string& oniguruma, SplitBehavior behavior,
                           bool invert = false) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
  step.regex = *Regex::Compile(Regex::FromOniguruma(oniguruma));
  step.behavior = behavior;
  step.invert = invert;
  return step;
}

PreTokenizerStep ByteLevelStep(bool use_regex, bool add_prefix_space = false) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  if (use_regex) {
    step.regex = *Regex::Compile(Regex::FromOniguruma(kGpt2Pattern));
  }
  step.add_prefix_space = add_prefix_space;
  return step;
}

PreTokenizer Pattern(const char* pattern) {
  std::vector<PreTokenizerStep> steps;
  steps.push_back(SplitStep(pattern, SplitBehavior::kIsolated));
  steps.push_back(ByteLevelStep(false));
  return PreTokenizer(std::move(steps));
}

PreTokenizer Gpt2(bool add_prefix_space = false) {
  std::vector<PreTokenizerStep> steps;
  steps.push_back(ByteLevelStep(true, add_prefix_space));
  return PreTokenizer(std::move(steps));
}

std::vector<std::string> Words(const PreTokenizer& pre_tokenizer,
                               const std::string& text) {
  std::vector<std::string> words;
  const absl::Status status = pre_tokenizer.Run(
      text, [&](absl::string_view word) { words.emplace_back(word); });
  EXPECT_TRUE(status.ok()) << status;
  return words;
}

const PreTokenizer& Llama3() {
  static const PreTokenizer* p =
      new PreTokenizer(Pattern(testing::kLlama3Pattern));
  return *p;
}

TEST(PreTokenizerTest, Contractions) {
  // GPT-2: lower case only; "'S" is "'" then "S".
  EXPECT_THAT(
      Words(Gpt2(), "it's we'll I'm they're I've he'd don't IT'S"),
      ElementsAre("it", "'s", " we", "'ll", " I", "'m", " they", "'re", " I",
                  "'ve", " he", "'d", " don", "'t", " IT", "'", "S"));
  // Llama-3: (?i:...) takes any case.
  EXPECT_THAT(Words(Llama3(), "IT'S WE'LL I'M THEY'RE I'VE HE'D DON'T"),
              ElementsAre("IT", "'S", " WE", "'LL", " I", "'M", " THEY", "'RE",
                          " I", "'VE", " HE", "'D", " DON", "'T"));
  // Not a contraction: "'x" is punctuation then a letter; Llama-3 gives the
  // apostrophe to the word ([^\r\n\p{L}\p{N}]?\p{L}+).
  EXPECT_THAT(Words(Gpt2(), "rock'n"), ElementsAre("rock", "'", "n"));
  EXPECT_THAT(Words(Llama3(), "rock'n"), ElementsAre("rock", "'n"));
}

TEST(PreTokenizerTest, DigitsInRunsOfOneToThree) {
  EXPECT_THAT(Words(Llama3(), "1234567 89"),
              ElementsAre("123", "456", "7", " ", "89"));
  EXPECT_THAT(Words(Gpt2(), "1234567 89"), ElementsAre("1234567", " 89"));
  EXPECT_THAT(Words(Pattern(testing::kQwen2Pattern), "2024"),
              ElementsAre("2", "0", "2", "4"));
  // Other numerals are \p{N} too: Arabic-Indic digits, superscripts.
  EXPECT_THAT(Words(Llama3(), "\u0661\u0662\u0663\u0664"),
              ElementsAre("\u0661\u0662\u0663", "\u0664"));
  // A letter before digits: "x" | "123"; after: "123" | "x".
  EXPECT_THAT(Words(Llama3(), "x123y"), ElementsAre("x", "123", "y"));
}

TEST(PreTokenizerTest, WhitespaceRunsKeepTheLastSpaceForTheWord) {
  // \s+(?!\S) backs off one space before a word.
  EXPECT_THAT(Words(Gpt2(), "Hello   world"),
              ElementsAre("Hello", "  ", " world"));
  EXPECT_THAT(Words(Llama3(), "Hello   world"),
              ElementsAre("Hello", "  ", " world"));
  // At the end nothing follows: the whole run.
  EXPECT_THAT(Words(Gpt2(), "end   "), ElementsAre("end", "   "));
  EXPECT_THAT(Words(Llama3(), "end   "), ElementsAre("end", "   "));
  // Before punctuation: GPT-2's " ?[^\s\p{L}\p{N}]+" takes the last space.
  EXPECT_THAT(Words(Gpt2(), "a   !"), ElementsAre("a", "  ", " !"));
  // Unicode spaces (no-break, em, ideographic) are white space too.
  EXPECT_THAT(Words(Llama3(), "a\u00a0\u2003\u3000b"),
              ElementsAre("a", "\u00a0\u2003", "\u3000b"));
}

TEST(PreTokenizerTest, Newlines) {
  // Llama-3: \s*[\r\n]+ takes the spaces before newlines and the newlines.
  EXPECT_THAT(Words(Llama3(), "a \n\n b"), ElementsAre("a", " \n\n", " b"));
  EXPECT_THAT(Words(Llama3(), "a\r\n\r\nb"), ElementsAre("a", "\r\n\r\n", "b"));
  // ... and punctuation keeps the newlines that follow it.
  EXPECT_THAT(Words(Llama3(), "end.\n\nNext"),
              ElementsAre("end", ".\n\n", "Next"));
  // GPT-2 only has \s+(?!\S): the newlines less the last character.
  EXPECT_THAT(Words(Gpt2(), "a\n\n\nb"), ElementsAre("a", "\n\n", "\n", "b"));
  EXPECT_THAT(Words(Gpt2(), "end.\n\nNext"),
              ElementsAre("end", ".", "\n", "\n", "Next"));
}

TEST(PreTokenizerTest, EmojiAndMultiByteLetters) {
  // Letters of any script are \p{L}; symbols (emoji) are not.
  EXPECT_THAT(Words(Llama3(), "naïve café 你好世界 Привет"),
              ElementsAre("naïve", " café", " 你好世界", " Привет"));
  EXPECT_THAT(Words(Llama3(), "I ❤ 🦙s!"),
              ElementsAre("I", " ❤", " 🦙", "s", "!"));
  EXPECT_THAT(Words(Gpt2(), "I ❤ 🦙s!"),
              ElementsAre("I", " ❤", " 🦙", "s", "!"));
  // A family emoji is one run of symbols and joiners (ZWJ is a format
  // character, not a letter).
  EXPECT_THAT(Words(Llama3(), "👨‍👩‍👧 x"),
              ElementsAre("👨‍👩‍👧", " x"));
  // A combining mark is not a letter: "e" | U+0301 (NFC would compose).
  EXPECT_THAT(Words(Llama3(), "e\xCC\x81"), ElementsAre("e", "\xCC\x81"));
}

TEST(PreTokenizerTest, NextLineIsWhiteSpaceAsInOniguruma) {
  // U+0085 (NEL): Oniguruma's \s has it, PCRE2's does not; FromOniguruma
  // adds it, so "\u0085\u0085" before a word is white space backing off
  // one character, not a run of punctuation.
  EXPECT_THAT(Words(Llama3(), "a\u0085\u0085b"),
              ElementsAre("a", "\u0085", "\u0085b"));
  // GPT-2's " ?\p{L}+" takes only U+0020 before a word: the last NEL is
  // \s+ on its own.
  EXPECT_THAT(Words(Gpt2(), "a\u0085\u0085b"),
              ElementsAre("a", "\u0085", "\u0085", "b"));
}

TEST(PreTokenizerTest, InvalidBytesAreTheTextBetweenMatches) {
  EXPECT_THAT(Words(Llama3(),
                    "ab\xFF\xFE"
                    "cd \x80"),
              ElementsAre("ab", "\xFF\xFE", "cd", " ", "\x80"));
  // An invalid byte ends a letter run but not the bytes before it.
  EXPECT_THAT(Words(Gpt2(), "\xC3(x"), ElementsAre("\xC3", "(", "x"));
}

TEST(PreTokenizerTest, SplitBehavioursOnHfsExample) {
  const std::string text = "the-final--countdown";
  const auto split = [&](SplitBehavior behavior, bool invert = false) {
    std::vector<PreTokenizerStep> steps;
    steps.push_back(SplitStep("-", behavior, invert));
    return Words(PreTokenizer(std::move(steps)), text);
  };
  EXPECT_THAT(split(SplitBehavior::kRemoved),
              ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kIsolated),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithPrevious),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithNext),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(split(SplitBehavior::kContiguous),
              ElementsAre("the", "-", "final", "--", "countdown"));
  // invert: the matches are the content, the rest the delimiters.
  EXPECT_THAT(split(SplitBehavior::kRemoved, true), ElementsAre("-", "-", "-"));
}

TEST(PreTokenizerTest, AddPrefixSpaceGoesOnEveryPieceWithoutOne) {
  EXPECT_THAT(Words(Gpt2(true), "Hello world"),
              ElementsAre(" Hello", " world"));
  EXPECT_THAT(Words(Gpt2(true), " Hello"), ElementsAre(" Hello"));
}

TEST(PreTokenizerTest, LongTextsSplitInConstantMemory) {
  // A megabyte of words: each is handed on as found.
  std::string text;
  while (text.size() < (1 << 20)) text += "lorem ipsum dolor ";
  size_t words = 0;
  size_t bytes = 0;
  ASSERT_TRUE(Llama3()
                  .Run(text,
                       [&](absl::string_view word) {
                         ++words;
                         bytes += word.size();
                       })
                  .ok());
  EXPECT_EQ(bytes, text.size());
  // "lorem" " ipsum" " dolor" per 18 bytes, and the final " ".
  EXPECT_EQ(words, text.size() / 6 + 1);
}

TEST(PreTokenizerTest, PathologicalPatternFailsInsteadOfHanging) {
  std::vector<PreTokenizerStep> steps;
  steps.push_back(SplitStep("(a+)+$", SplitBehavior::kIsolated));
  const PreTokenizer pre_tokenizer(std::move(steps));
  const std::string text = std::string(40, 'a') + "!";
  const absl::Status status = pre_tokenizer.Run(text, [](absl::string_view) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("backtracking steps"));
}

}  // namespace
}  // namespace conveyor::tokenizer::tokenizer_internal
