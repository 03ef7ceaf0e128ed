#include "proto/credentials.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::proto {
namespace {

using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(CredentialsTest, NoFilesIsPlaintext) {
  EXPECT_TRUE(MakeServerCredentials({}).ok());
  EXPECT_TRUE(MakeChannelCredentials({}).ok());
}

TEST(CredentialsTest, BadCombinationsNameTheFlags) {
  const std::string pem = Write(
      "a.pem", "-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n");
  absl::Status half = MakeServerCredentials({.cert = pem}).status();
  EXPECT_EQ(half.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(half.message(),
              HasSubstr("--tls-cert and --tls-key go together"));
  EXPECT_THAT(MakeServerCredentials({.ca = pem}).status().message(),
              HasSubstr("give --tls-cert and --tls-key too"));
  EXPECT_THAT(
      MakeChannelCredentials({.cert = pem, .key = pem}).status().message(),
      HasSubstr("TLS needs --tls-ca"));
  EXPECT_THAT(
      MakeChannelCredentials({.key = pem, .ca = pem}).status().message(),
      HasSubstr("go together"));
}

// Bad configuration, all of it (exit 2 in every program), naming the flag.
TEST(CredentialsTest, UnreadableOrNonPemFilesAreErrors) {
  const std::string missing = ::testing::TempDir() + "/missing.pem";
  absl::Status gone = MakeChannelCredentials({.ca = missing}).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gone.message(), HasSubstr("--tls-ca: "));
  EXPECT_THAT(gone.message(), HasSubstr("missing.pem"));
  const std::string text = Write("not.pem", "hello");
  absl::Status not_pem = MakeChannelCredentials({.ca = text}).status();
  EXPECT_EQ(not_pem.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_pem.message(),
              HasSubstr("--tls-ca " + text + ": no PEM certificate in it"));
}

}  // namespace
}  // namespace conveyor::proto
