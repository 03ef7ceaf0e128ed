#include "proto/grpc_diagnostics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::proto {
namespace {

using ::testing::HasSubstr;

// The messages gRPC 1.51 gives a client, as tests/integration/tls_test.sh
// sees them for each way a handshake fails.
TEST(GrpcDiagnosticsTest, ClientSideCauses) {
  const char* closed =
      "failed to connect to all addresses; last error: UNAVAILABLE: "
      "ipv4:127.0.0.1:34851: Socket closed";
  EXPECT_THAT(DescribeTransportFailure(closed, {}),
              HasSubstr("probably serves TLS (give --tls-ca"));
  EXPECT_THAT(DescribeTransportFailure(closed, {.tls = true}),
              HasSubstr("requires a client certificate"));
  EXPECT_THAT(
      DescribeTransportFailure(closed, {.tls = true, .client_cert = true}),
      HasSubstr("does not accept this client certificate"));
  EXPECT_THAT(DescribeTransportFailure(
                  "last error: UNKNOWN: ipv4:127.0.0.1:1: Ssl handshake "
                  "failed: SSL_ERROR_SSL: error:0A000086:SSL "
                  "routines::certificate verify failed",
                  {.tls = true}),
              HasSubstr("certificate is not trusted"));
  EXPECT_THAT(DescribeTransportFailure(
                  "Ssl handshake failed: SSL_ERROR_SSL: error:0A00010B:SSL "
                  "routines::wrong version number",
                  {.tls = true}),
              HasSubstr("does not speak TLS"));
  EXPECT_EQ(DescribeTransportFailure(
                "failed to connect to all addresses; last error: "
                "UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused",
                {}),
            "");
}

TEST(GrpcDiagnosticsTest, ServerSideCauses) {
  EXPECT_THAT(DescribeRefusedHandshake(
                  "Handshake failed with fatal error SSL_ERROR_SSL: "
                  "error:0A00010B:SSL routines::wrong version number."),
              HasSubstr("spoke plaintext"));
  EXPECT_THAT(DescribeRefusedHandshake(
                  "Handshake failed with fatal error SSL_ERROR_SSL: "
                  "error:0A0000C7:SSL routines::peer did not return a "
                  "certificate."),
              HasSubstr("presented no certificate"));
  EXPECT_THAT(DescribeRefusedHandshake(
                  "Handshake failed with fatal error SSL_ERROR_SSL: "
                  "error:0A000086:SSL routines::certificate verify failed."),
              HasSubstr("not signed by --tls-ca"));
  EXPECT_EQ(DescribeRefusedHandshake("some other gRPC line"), "");
}

}  // namespace
}  // namespace conveyor::proto
