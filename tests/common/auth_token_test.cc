#include "common/auth_token.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteToken(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(AuthTokenTest, ReadsTheTokenWithoutSurroundingWhitespace) {
  absl::StatusOr<std::string> token =
      ReadAuthTokenFile(WriteToken("token", "  s3cr3t-Token_1\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cr3t-Token_1");
}

TEST(AuthTokenTest, BadFilesAreErrorsThatNeverShowTheContent) {
  const struct {
    const char* name;
    std::string content;
    const char* error;
  } kCases[] = {
      {"empty", " \n\t", "is empty"},
      {"spaced", "two words-secretvalue", "printable ASCII without spaces"},
      {"control", "abc\x01secretvalue", "printable ASCII without spaces"},
      {"long", std::string(kMaxAuthTokenBytes + 1, 'x'), "longer than 4096"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<std::string> token =
        ReadAuthTokenFile(WriteToken(c.name, c.content));
    ASSERT_FALSE(token.ok()) << c.name;
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(token.status().message(), HasSubstr(c.error)) << c.name;
    EXPECT_THAT(token.status().message(), HasSubstr(c.name));
    EXPECT_THAT(token.status().message(), Not(HasSubstr("secretvalue")));
  }
  EXPECT_EQ(
      ReadAuthTokenFile(::testing::TempDir() + "/missing").status().code(),
      absl::StatusCode::kNotFound);
}

TEST(AuthTokenTest, MetadataMatchesOnlyTheWholeBearerValue) {
  EXPECT_EQ(AuthMetadataValue("abc"), "Bearer abc");
  EXPECT_TRUE(AuthMetadataMatches("Bearer abc", "abc"));
  EXPECT_FALSE(AuthMetadataMatches("Bearer abd", "abc"));
  EXPECT_FALSE(AuthMetadataMatches("abc", "abc"));
  EXPECT_FALSE(AuthMetadataMatches("Bearer abc ", "abc"));
  EXPECT_FALSE(AuthMetadataMatches("", "abc"));
}

TEST(AuthTokenTest, ConstantTimeEqualsComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace conveyor
