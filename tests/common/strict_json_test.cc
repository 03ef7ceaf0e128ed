#include "common/strict_json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

TEST(StrictJsonTest, ParsesAWellFormedDocument) {
  auto json = ParseStrictJson(R"({"a": [1, 2, {"b": "c"}], "d": null})", "x");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["a"][2]["b"], "c");
  EXPECT_TRUE((*json)["d"].is_null());
}

TEST(StrictJsonTest, RejectsADuplicateKeyAtAnyDepth) {
  auto top = ParseStrictJson(R"({"a": 1, "a": 2})", "header",
                             {.top_level_key = "tensor name"});
  EXPECT_EQ(top.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(top.status().message(), "header has duplicate tensor name 'a'");

  auto nested = ParseStrictJson(R"({"a": {"k": 1, "k": 2}})", "header",
                                {.top_level_key = "tensor name"});
  EXPECT_EQ(nested.status().message(), "header has duplicate key 'k'");

  // The same key in sibling objects is not a duplicate.
  EXPECT_TRUE(ParseStrictJson(R"([{"k": 1}, {"k": 2}])", "x").ok());
}

TEST(StrictJsonTest, ShowsAHostileKeyEscapedAndShort) {
  const std::string key = "\\u0001" + std::string(100, 'z');
  auto json =
      ParseStrictJson("{\"" + key + "\": 1, \"" + key + "\": 2}", "manifest");
  ASSERT_FALSE(json.ok());
  EXPECT_THAT(json.status().message(), HasSubstr("'\\x01zzz"));
  EXPECT_THAT(json.status().message(), HasSubstr("...'"));
  EXPECT_LT(json.status().message().size(), 120u);
}

TEST(StrictJsonTest, RejectsANulByteAndWhatFollowsIt) {
  const std::string text("{}\0{\"a\":1}", 10);
  auto json = ParseStrictJson(text, "header");
  EXPECT_EQ(json.status().message(),
            "header is not valid JSON: NUL byte at offset 2");
}

TEST(StrictJsonTest, RejectsNestingDeeperThanTheCap) {
  EXPECT_TRUE(ParseStrictJson("[[[1]]]", "x", {.max_depth = 3}).ok());
  auto deep = ParseStrictJson("[[[[1]]]]", "x", {.max_depth = 3});
  EXPECT_EQ(deep.status().message(), "x is nested deeper than 3 levels");
  // Brackets inside strings, escaped quotes included, do not count.
  EXPECT_TRUE(ParseStrictJson(R"(["[[[[\"[[[["])", "x", {.max_depth = 1}).ok());
  // A hostile document fails fast, before the library sees it.
  auto hostile = ParseStrictJson(std::string(1 << 20, '['), "x");
  EXPECT_EQ(hostile.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StrictJsonTest, RejectsMalformedInputAndTrailingText) {
  for (const char* text : {"", "{", "{} x", "{\"a\":}", "[1,]", "\"\xff\""}) {
    auto json = ParseStrictJson(text, "manifest");
    EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(json.status().message(),
                HasSubstr("manifest is not valid JSON: "))
        << text;
  }
}

}  // namespace
}  // namespace conveyor
