#include "telemetry/internal/http_request.h"

#include <string>

#include "gtest/gtest.h"

namespace conveyor::telemetry::http_internal {
namespace {

TEST(HttpRequestTest, FindHeadEndWaitsForTheBlankLine) {
  EXPECT_EQ(FindHeadEnd(""), std::string::npos);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n"), std::string::npos);
  const std::string crlf = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(FindHeadEnd(crlf + "GET /next"), crlf.size());
  const std::string lf = "GET / HTTP/1.0\n\n";
  EXPECT_EQ(FindHeadEnd(lf), lf.size());
  // Empty lines before the request line are skipped, not taken as its end.
  EXPECT_EQ(FindHeadEnd("\r\n\r\n"), std::string::npos);
  EXPECT_EQ(FindHeadEnd("\r\nGET / HTTP/1.0\r\n\r\n"), 20u);
}

TEST(HttpRequestTest, ParsesMethodPathAndKeepAlive) {
  RequestHead head =
      ParseRequestHead("GET /metrics?x=1#f HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(head.error_status, 0) << head.error;
  EXPECT_EQ(head.method, "GET");
  EXPECT_EQ(head.path, "/metrics");
  EXPECT_TRUE(head.keep_alive);

  head = ParseRequestHead("HEAD /readyz HTTP/1.0\r\n\r\n");
  ASSERT_EQ(head.error_status, 0);
  EXPECT_FALSE(head.keep_alive);  // HTTP/1.0 closes unless asked
  head = ParseRequestHead("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
  EXPECT_TRUE(head.keep_alive);
  head = ParseRequestHead("GET / HTTP/1.1\r\nconnection: foo, close\r\n\r\n");
  EXPECT_FALSE(head.keep_alive);
}

TEST(HttpRequestTest, AbsoluteFormTargetsBecomePaths) {
  EXPECT_EQ(ParseRequestHead("GET http://h:1/healthz HTTP/1.1\r\n\r\n").path,
            "/healthz");
  EXPECT_EQ(ParseRequestHead("GET https://h HTTP/1.1\r\n\r\n").path, "/");
}

TEST(HttpRequestTest, ABodyIsNeverReadSoTheConnectionCloses) {
  RequestHead head =
      ParseRequestHead("POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
  ASSERT_EQ(head.error_status, 0);
  EXPECT_TRUE(head.has_body);
  EXPECT_FALSE(head.keep_alive);
  head =
      ParseRequestHead("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_FALSE(head.keep_alive);
  head = ParseRequestHead("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(head.keep_alive);
}

TEST(HttpRequestTest, RefusesWhatIsNotHttp1) {
  for (const char* bad : {
           "\r\n", "GET\r\n\r\n",
           "GET /\r\n\r\n",  // HTTP/0.9
           "GET  / HTTP/1.1\r\n\r\n", "G(T / HTTP/1.1\r\n\r\n",
           "GET / FTP/1.0\r\n\r\n", "GET relative HTTP/1.1\r\n\r\n",
           "GET /a\x01 HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nno colon\r\n\r\n",
           "GET / HTTP/1.1\r\n folded: x\r\n\r\n",
           "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
           "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  // TLS
       }) {
    const RequestHead head = ParseRequestHead(bad);
    EXPECT_EQ(head.error_status, 400) << bad;
    EXPECT_FALSE(head.error.empty());
  }
  EXPECT_EQ(ParseRequestHead("GET / HTTP/2.0\r\n\r\n").error_status, 505);
  EXPECT_EQ(ParseRequestHead("GET / HTTP/1.2\r\n\r\n").error_status, 505);
}

TEST(HttpRequestTest, StatusTextsForEveryStatusTheServerSends) {
  for (const int status : {200, 400, 404, 405, 431, 500, 503, 505}) {
    EXPECT_NE(StatusText(status), "Unknown") << status;
  }
}

}  // namespace
}  // namespace conveyor::telemetry::http_internal
