#include "common/logging.h"

#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace conveyor {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(LoggingTest, LinesCarryTimeSeverityAndFileLine) {
  ASSERT_TRUE(InitLogging("info").ok());
  testing::internal::CaptureStderr();
  SPDLOG_INFO("hello {}", 42);
  SPDLOG_DEBUG("hidden at info level");
  spdlog::default_logger()->flush();
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_THAT(out, ContainsRegex("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ info "
                                 "logging_test\\.cc:[0-9]+ hello 42\n$"));
}

TEST(LoggingTest, UnknownLevelIsRejectedWithTheAllowedValues) {
  absl::Status status = InitLogging("loud");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'loud'"));
  EXPECT_THAT(status.message(), HasSubstr("trace, debug, info, warn, error"));
}

}  // namespace
}  // namespace conveyor
