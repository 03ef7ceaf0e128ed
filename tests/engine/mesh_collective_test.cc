#include "engine/mesh_collective.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using ::testing::HasSubstr;
using testing_util::FromVector;
using testing_util::Ids;
using testing_util::ToVector;

// The fp32 and bf16 CPU backends are distinct objects: a mesh over both
// exercises the host staging between backends, one over a repeated backend
// the same-backend path.
std::unique_ptr<MeshCollective> Mesh(std::vector<Backend*> backends) {
  absl::StatusOr<std::unique_ptr<MeshCollective>> mesh =
      CreateHostMeshCollective(std::move(backends));
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *std::move(mesh);
}

Tensor On(Backend* backend, const Shape& shape, const std::vector<float>& v) {
  Tensor t = *backend->Empty(shape, DType::kF32);
  EXPECT_TRUE(backend->CopyFromHost(v.data(), v.size() * 4, t).ok());
  return t;
}

std::vector<float> Read(const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_TRUE(t.backend()->CopyToHost(t, v.data(), v.size() * 4).ok());
  return v;
}

TEST(MeshCollectiveTest, RejectsAnEmptyMeshAndMissingBackends) {
  auto empty = CreateHostMeshCollective({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto null = CreateHostMeshCollective({CpuBackend::Get(), nullptr});
  EXPECT_EQ(null.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null.status().message(), HasSubstr("device 1"));
}

TEST(MeshCollectiveTest, ReportsItsDevices) {
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  auto mesh = Mesh({CpuBackend::Get(), bf16, CpuBackend::Get()});
  EXPECT_EQ(mesh->size(), 3);
  EXPECT_EQ(mesh->backend(0), CpuBackend::Get());
  EXPECT_EQ(mesh->backend(1), bf16);
}

TEST(MeshCollectiveTest, CopiesWithinAndAcrossBackends) {
  Backend* fp32 = CpuBackend::Get();
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  ASSERT_NE(fp32, bf16);
  auto mesh = Mesh({fp32, bf16});
  const std::vector<float> v = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  const Tensor src = FromVector({2, 3}, v);
  for (Backend* to : {fp32, bf16}) {
    Tensor dst = *to->Zeros({2, 3});
    ASSERT_TRUE(mesh->Copy(src, dst).ok());
    EXPECT_EQ(Read(dst), v);  // A copy: no rounding, whatever the precision.
  }
  // Into a row view: the rest of the destination is untouched.
  Tensor wide = *bf16->Zeros({4, 3});
  ASSERT_TRUE(mesh->Copy(src, wide.Rows(1, 3)).ok());
  EXPECT_EQ(Read(wide),
            (std::vector<float>{0, 0, 0, 1.5f, -2, 3.25f, 4, 5, 6, 0, 0, 0}));
  // Integer tensors (token ids) copy too.
  const Tensor ids = Ids({3}, {7, 8, 9});
  Tensor ids_dst = *bf16->Empty({3}, DType::kI64);
  ASSERT_TRUE(mesh->Copy(ids, ids_dst).ok());
  std::vector<int64_t> got(3);
  ASSERT_TRUE(bf16->CopyToHost(ids_dst, got.data(), 24).ok());
  EXPECT_EQ(got, (std::vector<int64_t>{7, 8, 9}));
}

TEST(MeshCollectiveTest, CopyRejectsMismatches) {
  auto mesh = Mesh({CpuBackend::Get(), CpuBackend::Get(Precision::kBf16)});
  const Tensor src = FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor shape = *CpuBackend::Get()->Zeros({3, 2});
  absl::Status s = mesh->Copy(src, shape);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("[3, 2]"));
  Tensor dtype = *CpuBackend::Get()->Empty({2, 3}, DType::kI64);
  EXPECT_EQ(mesh->Copy(src, dtype).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh->Copy(Tensor(), shape).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Read(shape), std::vector<float>(6, 0.0f));
}

// Device d holds a[i] = i + 10 d and b[i] = (d + 1) * 0.5 * i: after the
// reduction device 0 holds the closed forms sum_d a = n i + 10 n (n - 1) / 2
// and sum_d b = 0.5 i n (n + 1) / 2; the others are unchanged.
TEST(MeshCollectiveTest, ReduceSumsOntoTheFirstDevice) {
  Backend* fp32 = CpuBackend::Get();
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  for (const std::vector<Backend*>& backends :
       {std::vector<Backend*>{fp32}, std::vector<Backend*>{fp32, fp32},
        std::vector<Backend*>{fp32, bf16, fp32},
        std::vector<Backend*>{bf16, fp32, bf16, fp32}}) {
    const int n = static_cast<int>(backends.size());
    SCOPED_TRACE(n);
    auto mesh = Mesh(backends);
    std::vector<std::vector<Tensor>> per(2);
    std::vector<std::vector<float>> before_a, before_b;
    for (int d = 0; d < n; ++d) {
      std::vector<float> a(6), b(4);
      for (int i = 0; i < 6; ++i) a[i] = static_cast<float>(i + 10 * d);
      for (int i = 0; i < 4; ++i) b[i] = static_cast<float>((d + 1) * 0.5 * i);
      per[0].push_back(On(backends[d], {2, 3}, a));
      per[1].push_back(On(backends[d], {4}, b));
      before_a.push_back(a);
      before_b.push_back(b);
    }
    ASSERT_TRUE(mesh->ReduceSumToFirst(per).ok());
    std::vector<float> want_a(6), want_b(4);
    for (int i = 0; i < 6; ++i) {
      want_a[i] = static_cast<float>(n * i + 10 * n * (n - 1) / 2);
    }
    for (int i = 0; i < 4; ++i) {
      want_b[i] = static_cast<float>(0.5 * i * n * (n + 1) / 2);
    }
    EXPECT_EQ(Read(per[0][0]), want_a);
    EXPECT_EQ(Read(per[1][0]), want_b);
    for (int d = 1; d < n; ++d) {
      EXPECT_EQ(Read(per[0][d]), before_a[d]);
      EXPECT_EQ(Read(per[1][d]), before_b[d]);
    }
  }
}

TEST(MeshCollectiveTest, BroadcastCopiesTheFirstDevice) {
  Backend* fp32 = CpuBackend::Get();
  Backend* bf16 = CpuBackend::Get(Precision::kBf16);
  auto mesh = Mesh({fp32, bf16, fp32});
  std::vector<std::vector<Tensor>> per(2);
  const std::vector<float> first = {0.1f, -0.2f, 0.3f};
  per[0] = {On(fp32, {3}, first), *bf16->Zeros({3}), *fp32->Zeros({3})};
  per[1] = {Ids({2}, {4, 5}), *bf16->Empty({2}, DType::kI64),
            *fp32->Empty({2}, DType::kI64)};
  ASSERT_TRUE(mesh->BroadcastFromFirst(per).ok());
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(Read(per[0][d]), first) << d;
    std::vector<int64_t> got(2);
    ASSERT_TRUE(
        per[1][d].backend()->CopyToHost(per[1][d], got.data(), 16).ok());
    EXPECT_EQ(got, (std::vector<int64_t>{4, 5})) << d;
  }
}

// A bad call is refused before anything is written.
TEST(MeshCollectiveTest, ReduceAndBroadcastRejectBadGroupsUntouched) {
  Backend* fp32 = CpuBackend::Get();
  auto mesh = Mesh({fp32, fp32});
  const Tensor ok0 = On(fp32, {2}, {1, 2}), ok1 = On(fp32, {2}, {3, 4});
  {
    // Too few copies for the mesh, after a good group.
    absl::Status s = mesh->ReduceSumToFirst({{ok0, ok1}, {ok0}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("1 copies for a mesh of 2"));
    EXPECT_EQ(Read(ok0), (std::vector<float>{1, 2}));
  }
  {
    const Tensor other = On(fp32, {1, 2}, {5, 6});
    absl::Status s = mesh->BroadcastFromFirst({{ok0, other}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("device 1"));
    EXPECT_EQ(Read(other), (std::vector<float>{5, 6}));
  }
  {
    absl::Status s = mesh->ReduceSumToFirst({{ok0, ok1}, {ok0, Tensor()}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("undefined"));
    EXPECT_EQ(Read(ok0), (std::vector<float>{1, 2}));
  }
  {
    // Sums are f32 only.
    absl::Status s =
        mesh->ReduceSumToFirst({{Ids({2}, {1, 2}), Ids({2}, {3, 4})}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("f32"));
  }
}

}  // namespace
}  // namespace conveyor::engine
