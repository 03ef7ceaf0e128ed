#include "worker/device_backends.h"

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::worker {
namespace {

using ::testing::HasSubstr;

TEST(DeviceBackendsTest, CpuWorkersComputeOnTheCpuBackendOfTheJobsPrecision) {
  absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
      DeviceBackends::Create({"cpu:4"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->cuda_device(), -1);
  EXPECT_EQ(*(*b)->Get(engine::Precision::kFp32), engine::CpuBackend::Get());
  EXPECT_EQ(*(*b)->Get(engine::Precision::kBf16),
            engine::CpuBackend::Get(engine::Precision::kBf16));
}

TEST(DeviceBackendsTest, BadDevicesNameTheAllowedForms) {
  for (const char* bad : {"gpu:0", "cpu:0", "cpu:", "cuda:-1", "cuda:x", ""}) {
    absl::Status s = DeviceBackends::Create({bad}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("allowed: cpu:N with N >= 1, or cuda:K"))
        << bad;
  }
  EXPECT_THAT(DeviceBackends::Create({}).status().message(),
              HasSubstr("empty"));
  absl::Status mesh = DeviceBackends::Create({"cuda:0", "cuda:1"}).status();
  EXPECT_EQ(mesh.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mesh.message(), HasSubstr("one worker per GPU"));
}

TEST(DeviceBackendsTest, CudaDevicesNeedTheCudaBackendAndAGpu) {
  absl::StatusOr<std::unique_ptr<DeviceBackends>> b =
      DeviceBackends::Create({"cuda:0"});
  if (!HaveCudaBackend()) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(b.status().message(), HasSubstr("built without the CUDA"));
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->cuda_device(), 0);
  absl::StatusOr<engine::Backend*> fp32 = (*b)->Get(engine::Precision::kFp32);
  if (!fp32.ok()) {
    // No GPU here: the CUDA backend's own error, which the worker reports
    // at start.
    EXPECT_EQ(fp32.status().code(), absl::StatusCode::kFailedPrecondition)
        << fp32.status();
    GTEST_SKIP() << "no usable CUDA device: " << fp32.status();
  }
  EXPECT_EQ((*fp32)->Name().substr(0, 4), "cuda");
  // One backend per precision, kept.
  EXPECT_EQ(*(*b)->Get(engine::Precision::kFp32), *fp32);
  absl::StatusOr<engine::Backend*> bf16 = (*b)->Get(engine::Precision::kBf16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_NE(*bf16, *fp32);
}

}  // namespace
}  // namespace conveyor::worker
