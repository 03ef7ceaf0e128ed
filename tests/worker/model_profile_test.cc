#include "worker/model_profile.h"

#include <string>

#include "common/yaml_load_count.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/job/test_jobs.h"

namespace conveyor::worker {
namespace {

v1::ProfileModel Request(const std::string& yaml) {
  v1::ProfileModel request;
  request.set_job_id("job-7");
  request.set_yaml(yaml);
  request.set_file_name("auto.yaml");
  request.set_base_dir("/jobs");
  request.set_repetitions(1);
  return request;
}

TEST(ProfileJobModelTest, TimesEveryLayerAndKeepsTheParsedFile) {
  const std::string yaml = job::testing::JobYaml(3);
  TEST_CountYamlLoads(true);
  absl::StatusOr<ProfiledJob> profiled =
      ProfileJobModel(Request(yaml), nullptr, {"cpu:1"});
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  // Three dense layers; the boundaries are not layers.
  EXPECT_EQ(profiled->profile.layers_size(), 3);
  EXPECT_EQ(profiled->profile.job_id(), "job-7");
  EXPECT_EQ(profiled->profile.device(), "cpu:1");
  for (const v1::LayerCost& layer : profiled->profile.layers()) {
    EXPECT_GT(layer.forward_seconds(), 0);
    EXPECT_GT(layer.parameter_bytes(), 0);
  }
  // The file parsed once, and kept as parsed for the job's preparation.
  EXPECT_EQ(TEST_YamlLoadsOf(yaml), 1);
  TEST_CountYamlLoads(false);
  ASSERT_NE(profiled->parsed, nullptr);
  EXPECT_EQ(profiled->parsed->yaml, yaml);
  EXPECT_EQ(profiled->parsed->file_name, "auto.yaml");
  EXPECT_EQ(profiled->parsed->base_dir, "/jobs");
  EXPECT_EQ(profiled->parsed->spec.name, "mlp");
  EXPECT_EQ(profiled->parsed->spec.model.layers.size(), 3u);
}

TEST(ProfileJobModelTest, BadJobIsInvalidArgumentAtItsPosition) {
  absl::StatusOr<ProfiledJob> profiled =
      ProfileJobModel(Request("model: {layers: 3}\n"), nullptr, {"cpu:1"});
  ASSERT_FALSE(profiled.ok());
  EXPECT_EQ(profiled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(profiled.status().message()),
              ::testing::StartsWith("auto.yaml:"));
}

}  // namespace
}  // namespace conveyor::worker
