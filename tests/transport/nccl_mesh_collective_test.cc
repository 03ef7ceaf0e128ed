#include "transport/nccl/nccl_mesh_collective.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::transport {
namespace {

using engine::CudaBackend;
using engine::Tensor;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

int VisibleGpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

Tensor OnDevice(engine::Backend* backend, const std::vector<float>& values) {
  absl::StatusOr<Tensor> t = backend->Empty(
      {static_cast<int64_t>(values.size())}, engine::DType::kF32);
  CONVEYOR_CHECK(t.ok(), "Empty failed");
  CONVEYOR_CHECK(
      backend->CopyFromHost(values.data(), values.size() * 4, *t).ok(),
      "CopyFromHost failed");
  return *t;
}

std::vector<float> ToHost(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  CONVEYOR_CHECK(t.backend()->CopyToHost(t, out.data(), t.bytes()).ok(),
                 "CopyToHost failed");
  return out;
}

TEST(NcclMeshCollectiveTest, RejectsEmptyAndNullBackendsWithoutAGpu) {
  EXPECT_EQ(CreateNcclMeshCollective({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status null = CreateNcclMeshCollective({nullptr}).status();
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null.message(), HasSubstr("null backend"));
  // A host backend has no device to join a communicator on.
  absl::Status host =
      CreateNcclMeshCollective({engine::CpuBackend::Get()}).status();
  EXPECT_EQ(host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host.message(), HasSubstr("cpu is not a GPU backend"));
}

class TwoGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (VisibleGpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
    for (int d = 0; d < 2; ++d) {
      absl::StatusOr<std::unique_ptr<CudaBackend>> b = CudaBackend::Create(d);
      ASSERT_TRUE(b.ok()) << b.status();
      backends_.push_back(*std::move(b));
    }
    absl::StatusOr<std::unique_ptr<engine::MeshCollective>> c =
        CreateNcclMeshCollective({backends_[0].get(), backends_[1].get()});
    ASSERT_TRUE(c.ok()) << c.status();
    collective_ = *std::move(c);
  }
  void TearDown() override { collective_.reset(); }  // Before the backends.

  std::vector<std::unique_ptr<CudaBackend>> backends_;
  std::unique_ptr<engine::MeshCollective> collective_;
};

TEST_F(TwoGpuTest, SumsOntoTheFirstDeviceAndBroadcastsFromIt) {
  ASSERT_EQ(collective_->size(), 2);
  // Two tensors in one call, one of them large enough for several NCCL
  // chunks.
  std::vector<float> a0(1 << 20), a1(1 << 20);
  for (size_t i = 0; i < a0.size(); ++i) {
    a0[i] = static_cast<float>(i % 1000);
    a1[i] = 0.5f * static_cast<float>(i % 7);
  }
  std::vector<std::vector<Tensor>> grads = {
      {OnDevice(backends_[0].get(), {1, 2, 3}),
       OnDevice(backends_[1].get(), {10, 20, 30})},
      {OnDevice(backends_[0].get(), a0), OnDevice(backends_[1].get(), a1)}};
  ASSERT_TRUE(collective_->ReduceSumToFirst(grads).ok());
  EXPECT_THAT(ToHost(grads[0][0]), ElementsAreArray({11.0f, 22.0f, 33.0f}));
  EXPECT_THAT(ToHost(grads[0][1]), ElementsAreArray({10.0f, 20.0f, 30.0f}));
  std::vector<float> sum(a0.size());
  for (size_t i = 0; i < a0.size(); ++i) sum[i] = a0[i] + a1[i];
  EXPECT_EQ(ToHost(grads[1][0]), sum);

  // Work queued on device 0 after the reduce sees its result, and the
  // broadcast sees that work.
  backends_[0]->Scale(grads[0][0], 2);
  ASSERT_TRUE(collective_->BroadcastFromFirst(grads).ok());
  EXPECT_THAT(ToHost(grads[0][1]), ElementsAreArray({22.0f, 44.0f, 66.0f}));
  EXPECT_EQ(ToHost(grads[1][1]), sum);
}

TEST_F(TwoGpuTest, CopiesBetweenDevicesAndTheHost) {
  Tensor on0 = OnDevice(backends_[0].get(), {1, 2, 3, 4});
  Tensor on1 = OnDevice(backends_[1].get(), {0, 0, 0, 0});
  ASSERT_TRUE(collective_->Copy(on0, on1).ok());
  EXPECT_THAT(ToHost(on1), ElementsAreArray({1.0f, 2.0f, 3.0f, 4.0f}));

  engine::Backend* cpu = engine::CpuBackend::Get();
  Tensor host = OnDevice(cpu, {5, 6, 7, 8});
  ASSERT_TRUE(collective_->Copy(host, on1).ok());
  EXPECT_THAT(ToHost(on1), ElementsAreArray({5.0f, 6.0f, 7.0f, 8.0f}));
  Tensor back = OnDevice(cpu, {0, 0, 0, 0});
  ASSERT_TRUE(collective_->Copy(on0, back).ok());
  EXPECT_THAT(ToHost(back), ElementsAreArray({1.0f, 2.0f, 3.0f, 4.0f}));

  Tensor wrong = OnDevice(backends_[1].get(), {0, 0});
  EXPECT_EQ(collective_->Copy(on0, wrong).code(),
            absl::StatusCode::kInvalidArgument);
  // A reduce with a device's tensor on another device's backend.
  EXPECT_EQ(collective_->ReduceSumToFirst({{on0, on0}}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor::transport
