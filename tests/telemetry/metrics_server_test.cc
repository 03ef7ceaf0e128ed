#include "telemetry/metrics_server.h"

#include <memory>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "telemetry/daemon_metrics.h"
#include "tests/testing/http_get.h"

namespace conveyor::telemetry {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(MetricsServerTest, ServesRegistryAndProcessMetricsOnAPickedPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  AddBuildInfo(*registry, "worker");
  prometheus::BuildCounter()
      .Name("conveyor_test_things_total")
      .Help("Things")
      .Register(*registry)
      .Add({{"kind", "a"}})
      .Increment(3);
  auto process = std::make_shared<ProcessCollector>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", {registry, process});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->address(), MatchesRegex("127\\.0\\.0\\.1:[0-9]+"));
  EXPECT_NE((*server)->address(), "127.0.0.1:0");

  absl::StatusOr<std::string> body =
      conveyor::testing::HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("conveyor_test_things_total{kind=\"a\"} 3"));
  EXPECT_THAT(*body, HasSubstr("conveyor_build_info{"));
  EXPECT_THAT(*body, HasSubstr("component=\"worker\""));
  EXPECT_THAT(*body, MatchesRegex("(.|\n)*process_threads [1-9][0-9]*(.|\n)*"));
  EXPECT_THAT(*body,
              MatchesRegex("(.|\n)*process_open_fds [1-9][0-9]*(.|\n)*"));
  EXPECT_THAT(*body, MatchesRegex("(.|\n)*process_resident_memory_"
                                  "bytes [1-9][0-9.e+]*(.|\n)*"));
  EXPECT_THAT(*body, HasSubstr("process_start_time_seconds 1"));
  EXPECT_THAT(*body, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  EXPECT_THAT(*body, HasSubstr("process_max_fds "));
}

TEST(MetricsServerTest, ProbesAnswerAndOtherPathsAre404) {
  bool ready = false;
  absl::Mutex mu;
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", {}, [&]() -> Readiness {
        absl::MutexLock lock(&mu);
        return {ready, ready ? "registered" : "no coordinator yet"};
      });
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  absl::StatusOr<std::string> body =
      conveyor::testing::HttpGet(address, "/healthz");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "ok\n");
  body = conveyor::testing::HttpGet(address, "/readyz");
  EXPECT_THAT(body.status().message(), HasSubstr("503"));
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  body = conveyor::testing::HttpGet(address, "/readyz");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "ready: registered\n");
  // The paths that crashed civetweb: an answer, and the server stays.
  for (const char* path : {"/", "/favicon.ico", "/metrics2", "/%00"}) {
    body = conveyor::testing::HttpGet(address, path);
    EXPECT_THAT(body.status().message(), HasSubstr("404")) << path;
  }
  EXPECT_TRUE(conveyor::testing::HttpGet(address, "/metrics").ok());
}

TEST(MetricsServerTest, ReadyWithoutACheck) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::string> body =
      conveyor::testing::HttpGet((*server)->address(), "/readyz");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "ready\n");
}

TEST(MetricsServerTest, RejectsAddressesWithoutPort) {
  for (const char* bad : {"localhost", ":9090", "127.0.0.1:x",
                          "127.0.0.1:70000", "[::1:80", ""}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(bad, {});
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(MetricsServerTest, AddressInUseIsUnavailableNotAThrow) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start((*first)->address(), {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr((*first)->address()));
}

TEST(MetricsServerTest, DurationBucketsAscendAndSpanTheRange) {
  const auto& b = DurationBuckets();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 0.0001);
  EXPECT_DOUBLE_EQ(b.back(), 100);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

}  // namespace
}  // namespace conveyor::telemetry
