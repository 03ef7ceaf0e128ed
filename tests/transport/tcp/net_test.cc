#include "transport/tcp/internal/net.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport::tcp_internal {
namespace {

using ::testing::HasSubstr;

TEST(SplitHostPortTest, SplitsHostAndPort) {
  std::string host, port;
  ASSERT_TRUE(SplitHostPort("127.0.0.1:8080", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, "8080");
}

TEST(SplitHostPortTest, DropsTheBracketsOfAnIpv6Host) {
  std::string host, port;
  ASSERT_TRUE(SplitHostPort("[::1]:0", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, "0");
}

TEST(SplitHostPortTest, RejectsWhatIsNotHostColonPort) {
  for (const char* address :
       {"localhost", ":80", "host:", "host:http", "host:65536", "host:-1"}) {
    std::string host, port;
    const absl::Status s = SplitHostPort(address, &host, &port);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(s.message(), HasSubstr("is not host:port")) << address;
  }
}

TEST(ResolveTest, ResolvesANumericAddress) {
  absl::StatusOr<std::vector<asio::ip::tcp::endpoint>> endpoints =
      Resolve("127.0.0.1:4242", /*passive=*/false);
  ASSERT_TRUE(endpoints.ok()) << endpoints.status();
  ASSERT_EQ(endpoints->size(), 1u);
  EXPECT_EQ(endpoints->front().port(), 4242);
  EXPECT_TRUE(endpoints->front().address().is_loopback());
}

TEST(ResolveTest, PassesOnTheParseError) {
  EXPECT_EQ(Resolve("no-port", /*passive=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::transport::tcp_internal
