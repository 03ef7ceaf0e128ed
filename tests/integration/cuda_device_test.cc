// Runs on every CUDA build, GPU or not: the status mapping and the check
// macros are pure; listing must succeed on a machine without a GPU; the
// device smoke test runs on each visible device or is skipped.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "anything").ok());
  EXPECT_EQ(CudaErrorToStatusCode(cudaSuccess), absl::StatusCode::kOk);
}

TEST(CudaStatusTest, MissingDeviceOrDriverIsFailedPrecondition) {
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorNoKernelImageForDevice, "x").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaStatusTest, BusyDeviceIsUnavailable) {
  EXPECT_EQ(CudaStatus(cudaErrorDevicesUnavailable, "x").code(),
            absl::StatusCode::kUnavailable);
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorLaunchOutOfResources, "x").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CudaStatusTest, BadDeviceOrdinalIsInvalidArgument) {
  EXPECT_EQ(CudaStatus(cudaErrorInvalidDevice, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaStatusTest, OtherErrorsAreInternal) {
  // cudaErrorInvalidValue means we passed CUDA bad arguments: our bug.
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "x").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(),
            absl::StatusCode::kInternal);
}

TEST(CudaStatusTest, MessageHasContextErrorNameAndDescription) {
  const absl::Status status =
      CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(64 bytes) on device 0");
  EXPECT_EQ(status.message(),
            "cudaMalloc(64 bytes) on device 0: cudaErrorMemoryAllocation (out "
            "of memory)");
}

TEST(CudaStatusTest, EmptyContextLeavesJustTheError) {
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "").message(),
            "cudaErrorInvalidValue (invalid argument)");
}

TEST(CudaStatusTest, UnknownCodeKeepsItsNumber) {
  const auto unknown = static_cast<cudaError_t>(12345);
  EXPECT_EQ(CudaErrorToStatusCode(unknown), absl::StatusCode::kInternal);
  EXPECT_THAT(CudaErrorMessage(unknown), HasSubstr("cudaError_t 12345"));
}

TEST(CudaCheckTest, PassesOnSuccessAndEvaluatesOnce) {
  int calls = 0;
  auto succeed = [&calls] {
    ++calls;
    return cudaSuccess;
  };
  CONVEYOR_CUDA_CHECK(succeed());
  EXPECT_EQ(calls, 1);
}

// Death tests run first (gtest orders *DeathTest suites first) and re-execute
// the binary instead of forking, so a CUDA runtime already initialized by
// another test in this process cannot confuse the child.
class CudaCheckDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CudaCheckDeathTest, AbortsWithFileLineExpressionAndErrorName) {
  // The expression text differs from the error name, so both are checked.
  const int line = __LINE__ + 1;
  auto fail = [] { CONVEYOR_CUDA_CHECK(static_cast<cudaError_t>(1)); };
  EXPECT_DEATH(fail(),
               AllOf(HasSubstr(absl::StrCat("cuda_device_test.cc:", line, ":")),
                     HasSubstr("static_cast<cudaError_t>(1)"),
                     HasSubstr("cudaErrorInvalidValue (invalid argument)")));
}

const char* FakeLibraryErrorString(int code) {
  return code == 7 ? "fake library error seven" : "other fake error";
}

TEST_F(CudaCheckDeathTest, GenericCheckUsesTheGivenSuccessValueAndErrorFn) {
  // How cuBLAS and NCCL checks are derived: another success value and
  // another function that names the error.
  CONVEYOR_CUDA_CHECK_GEN(3, 3, FakeLibraryErrorString);
  EXPECT_DEATH(CONVEYOR_CUDA_CHECK_GEN(7, 0, FakeLibraryErrorString),
               HasSubstr("check failed: 7: fake library error seven"));
}

TEST(CudaDeviceTest, ListingSucceedsWithOrWithoutDevices) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  for (size_t i = 0; i < devices->size(); ++i) {
    const CudaDeviceInfo& device = (*devices)[i];
    EXPECT_EQ(device.index, static_cast<int>(i));
    EXPECT_FALSE(device.name.empty());
    EXPECT_GE(device.compute_major, 1);
    EXPECT_GT(device.total_memory_bytes, 0u);
    EXPECT_GT(device.multiprocessors, 0);
  }
}

TEST(CudaDeviceTest, RuntimeVersionMatchesTheHeadersWeBuiltWith) {
  const std::string version = CudaRuntimeVersionString();
  EXPECT_THAT(version, MatchesRegex("[0-9]+\\.[0-9]+"));
  // Same major version as the toolkit headers (minor may be newer at run
  // time).
  EXPECT_EQ(version.substr(0, version.find('.')),
            std::to_string(CUDART_VERSION / 1000));
}

TEST(CudaDeviceTest, DriverVersionIsNoneOrMajorMinor) {
  EXPECT_THAT(CudaDriverVersionString(), MatchesRegex("none|[0-9]+\\.[0-9]+"));
}

TEST(CudaDeviceTest, SmokeTestRejectsNegativeDevice) {
  EXPECT_EQ(RunDeviceSmokeTest(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CudaDeviceTest, SmokeTestFailsCleanlyOnAMissingDevice) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  const int missing = static_cast<int>(devices->size());
  const absl::Status status = RunDeviceSmokeTest(missing);
  // Without a GPU every device is missing because there is no device or
  // driver at all; with GPUs, `missing` is one past the last ordinal.
  EXPECT_EQ(status.code(), devices->empty()
                               ? absl::StatusCode::kFailedPrecondition
                               : absl::StatusCode::kInvalidArgument)
      << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("smoke test on device ", missing)));
}

TEST(CudaDeviceTest, SmokeTestPassesOnEveryDevice) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) {
    GTEST_SKIP() << "no CUDA device (driver supports CUDA "
                 << CudaDriverVersionString() << ", runtime is "
                 << CudaRuntimeVersionString() << ")";
  }
  for (const CudaDeviceInfo& device : *devices) {
    const absl::Status status = RunDeviceSmokeTest(device.index);
    EXPECT_TRUE(status.ok()) << device.name << ": " << status;
  }
}

// Regression test for the first GPU run: a failed runtime call reported as
// a Status (here cudaSetDevice of a missing ordinal) left its error as the
// thread's last error, and the next smoke test's launch check took it for
// its own ("launching a kernel ...: invalid device ordinal"). CudaStatus
// now consumes the error it reports.
TEST(CudaDeviceTest, AReportedFailureDoesNotFailTheNextLaunch) {
  const absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) GTEST_SKIP() << "no CUDA device";
  const int missing = static_cast<int>(devices->size());
  ASSERT_EQ(RunDeviceSmokeTest(missing).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  const absl::Status status = RunDeviceSmokeTest(0);
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace conveyor
