#include "coordinator/metrics_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::coordinator {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      ("metrics_log_test_" + std::to_string(getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<nlohmann::json> ReadLines(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / kMetricsLogFileName);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

TEST(MetricsLogTest, OneObjectPerStepWithWhatTheStepHas) {
  const std::string dir = TempDir("lines");
  v1::StepSummary first;
  first.set_step(1);
  first.set_has_loss(true);
  first.set_loss(2.5);
  first.set_learning_rate(0.001);
  first.set_seconds(0.25);
  first.set_samples_per_second(64);
  first.set_tokens_per_second(8192);
  first.set_bubble_fraction(0.2);
  first.set_receive_wait_fraction(0.125);
  first.set_grad_norm(1.5);
  first.set_mfu(0.375);
  first.set_tflops_per_device(0.125);
  first.set_peak_memory_allocated_bytes(3000);
  first.set_peak_memory_reserved_bytes(4096);
  first.set_memory_capacity_bytes(65536);
  v1::StepSummary second = first;
  second.set_step(2);
  second.set_has_eval(true);
  second.set_eval_loss(2.75);
  second.set_eval_perplexity(15.6);
  v1::StepSummary lossless;
  lossless.set_step(3);
  for (const auto* s : {&first, &second, &lossless}) {
    ASSERT_TRUE(
        AppendMetricsLog(dir, MetricsLogLine(*s, 1000 + s->step(), 0)).ok());
  }
  const std::vector<nlohmann::json> lines = ReadLines(dir);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[0]["time_unix_ms"], 1001);
  EXPECT_EQ(lines[0]["restarts"], 0);
  EXPECT_EQ(lines[0]["loss"], 2.5);
  EXPECT_EQ(lines[0]["learning_rate"], 0.001);
  EXPECT_EQ(lines[0]["step_seconds"], 0.25);
  EXPECT_EQ(lines[0]["samples_per_second"], 64.0);
  EXPECT_EQ(lines[0]["tokens_per_second"], 8192.0);
  EXPECT_EQ(lines[0]["bubble_fraction"], 0.2);
  EXPECT_EQ(lines[0]["receive_wait_fraction"], 0.125);
  EXPECT_EQ(lines[0]["grad_norm"], 1.5);
  EXPECT_EQ(lines[0]["mfu"], 0.375);
  EXPECT_FALSE(lines[2].contains("mfu"));  // No known peak: absent.
  EXPECT_EQ(lines[0]["tflops_per_device"], 0.125);
  EXPECT_EQ(lines[0]["peak_memory_allocated_bytes"], 3000);
  EXPECT_EQ(lines[0]["peak_memory_reserved_bytes"], 4096);
  EXPECT_EQ(lines[0]["memory_capacity_bytes"], 65536);
  EXPECT_FALSE(lines[2].contains("peak_memory_reserved_bytes"));
  EXPECT_FALSE(lines[2].contains("tflops_per_device"));
  EXPECT_FALSE(lines[0].contains("eval_loss"));
  EXPECT_EQ(lines[1]["eval_loss"], 2.75);
  EXPECT_EQ(lines[1]["eval_perplexity"], 15.6);
  EXPECT_FALSE(lines[2].contains("loss"));  // No last stage's loss: absent.
  // A job's first step from scratch starts the file over.
  ASSERT_TRUE(
      AppendMetricsLog(dir, MetricsLogLine(first, 5, 0), /*start_over=*/true)
          .ok());
  ASSERT_EQ(ReadLines(dir).size(), 1u);
  EXPECT_EQ(ReadLines(dir)[0]["time_unix_ms"], 5);
  // The first key is the step, for readers that sort lines as text.
  EXPECT_EQ(MetricsLogLine(first, 1, 0).rfind("{\"step\":1,", 0), 0u);
}

// A directory or a FIFO in the file's place fails the append with the path
// named, and never blocks.
TEST(MetricsLogTest, AnUnwritablePlaceIsAnErrorNotAHang) {
  const std::string dir = TempDir("fifo");
  ASSERT_EQ(::mkfifo((std::filesystem::path(dir) / kMetricsLogFileName).c_str(),
                     0644),
            0);
  const absl::Status fifo = AppendMetricsLog(dir, "{}\n");
  EXPECT_FALSE(fifo.ok());
  EXPECT_THAT(fifo.message(), HasSubstr(kMetricsLogFileName));
  const std::string other = TempDir("dir");
  std::filesystem::create_directories(std::filesystem::path(other) /
                                      kMetricsLogFileName);
  EXPECT_FALSE(AppendMetricsLog(other, "{}\n").ok());
  EXPECT_FALSE(AppendMetricsLog(TempDir("gone") + "/missing", "{}\n").ok());
}

}  // namespace
}  // namespace conveyor::coordinator
