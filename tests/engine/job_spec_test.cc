#include "engine/job_spec.h"

#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

TEST(JobSpecTest, Placeholder) {
  EXPECT_FALSE(ParseJobSpec("", "job.yaml").ok());
}

}  // namespace
}  // namespace conveyor::engine
