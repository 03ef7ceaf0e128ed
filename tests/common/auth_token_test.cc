#include "common/auth_token.h"

#include <sys/stat.h>

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
      ReadAuthTokenFile(WriteToken("token", "  s3cr3t-Token_1-0123\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cr3t-Token_1-0123");
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
      // A 1-character token was once accepted without a word.
      {"short", "secretvalue", "has 11 characters; use at least 16"},
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

// As ssh says of a private key: a token file others can read is named.
TEST(AuthTokenTest, ATokenFileOthersCanReadIsWarnedAbout) {
  const std::string path = WriteToken("shared", "0123456789abcdef-token");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_EQ(AuthTokenFileWarning(path),
            "auth token file " + path +
                " can be read by other users (mode 0644); chmod 600 it");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(AuthTokenFileWarning(path), "");
  EXPECT_EQ(AuthTokenFileWarning(::testing::TempDir() + "/missing"), "");
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

constexpr char kJobSecret[] = "00112233445566778899aabbccddeeff";

std::string Derived(absl::string_view token, absl::string_view job_secret,
                    uint64_t job_number) {
  absl::StatusOr<std::string> secret =
      DataPlaneSecret(token, job_secret, job_number);
  EXPECT_TRUE(secret.ok()) << secret.status();
  return secret.ok() ? *secret : "";
}

TEST(DataPlaneSecretTest, IsAPinnedHmacOfTheJobUnderTheToken) {
  // Every rank of a job must derive the same bytes, whichever build it runs:
  // the value is pinned, computed independently with Python's hmac module.
  EXPECT_EQ(Derived("tok", kJobSecret, 7),
            "6e61eb84f29b1faa8f35c5283c1840b0bd5399dce87d16fce5e8e9d4730c4fa5");
}

TEST(DataPlaneSecretTest, FitsTheHandshakeAndNeverContainsTheToken) {
  const std::string token = "Tok3n-very-secret";
  const std::string secret = Derived(token, kJobSecret, 1);
  EXPECT_EQ(secret.size(), 64u);  // transport/tcp/frame.h: kMaxSecretBytes.
  EXPECT_THAT(secret, Not(HasSubstr(token)));
  EXPECT_THAT(secret, Not(HasSubstr(kJobSecret)));
}

TEST(DataPlaneSecretTest, DiffersByTokenJobSecretAndJobNumber) {
  const std::string base = Derived("token-a", kJobSecret, 1);
  EXPECT_EQ(Derived("token-a", kJobSecret, 1), base);
  EXPECT_NE(Derived("token-b", kJobSecret, 1), base);
  EXPECT_NE(Derived("token-a", "ffeeddccbbaa99887766554433221100", 1), base);
  EXPECT_NE(Derived("token-a", kJobSecret, 2), base);
  // The job number and secret cannot trade digits: "1" + ":2..." differs
  // from "12" + ":...".
  EXPECT_NE(Derived("token-a", "2abc", 1), Derived("token-a", "abc", 12));
}

TEST(DataPlaneSecretTest, WithoutATokenIsTheJobSecretItself) {
  // Clusters without --auth-token-file keep today's handshake.
  EXPECT_EQ(Derived("", kJobSecret, 7), kJobSecret);
}

TEST(DataPlaneSecretTest, EmptyJobSecretIsInvalid) {
  for (absl::string_view token : {"", "tok"}) {
    absl::StatusOr<std::string> secret = DataPlaneSecret(token, "", 7);
    EXPECT_EQ(secret.status().code(), absl::StatusCode::kInvalidArgument)
        << token;
  }
}

}  // namespace
}  // namespace conveyor
