// Helpers for the cross-backend tests: a fixture that creates a CudaBackend
// or skips the test when no device is visible, and tensors that exist on
// both backends with the same contents so one op can run on each and the
// results can be compared.
#ifndef CONVEYOR_TESTS_ENGINE_CUDA_CUDA_TEST_UTIL_H_
#define CONVEYOR_TESTS_ENGINE_CUDA_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_info.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine::testing_util {

// Creates cuda:0 in SetUp, or skips the test (reported as skipped) on a
// machine without a CUDA device.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::StatusOr<std::vector<CudaDeviceInfo>> devices =
        ListCudaDevices();
    ASSERT_TRUE(devices.ok()) << devices.status();
    if (devices->empty()) {
      GTEST_SKIP() << "no CUDA device (driver supports CUDA "
                   << CudaDriverVersionString() << ")";
    }
    absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
        CudaBackend::Create(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    cuda_ = std::move(*backend);
  }

  CpuBackend* cpu() const { return CpuBackend::Get(); }
  CudaBackend* cuda() const { return cuda_.get(); }

  // A copy of a CPU tensor on the CUDA backend.
  Tensor ToCuda(const Tensor& cpu_tensor) const {
    absl::StatusOr<Tensor> t =
        cuda_->Empty(cpu_tensor.shape(), cpu_tensor.dtype());
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(
        cuda_->CopyFromHost(cpu_tensor.raw(), cpu_tensor.bytes(), *t).ok());
    return *t;
  }

  // The values of an f32 tensor of either backend.
  static std::vector<float> Values(const Tensor& t) {
    std::vector<float> v(t.numel());
    const absl::Status s = t.backend()->CopyToHost(t, v.data(), t.bytes());
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }

  std::unique_ptr<CudaBackend> cuda_;
};

// One tensor on both backends.
struct Both {
  Tensor cpu, cuda;
};

}  // namespace conveyor::engine::testing_util

#endif  // CONVEYOR_TESTS_ENGINE_CUDA_CUDA_TEST_UTIL_H_
