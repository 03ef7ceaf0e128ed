#include "engine/tensor.h"

#include "gtest/gtest.h"
#include "tests/engine/test_util.h"

namespace conveyor::engine {
namespace {

using testing_util::FromVector;
using testing_util::ToVector;

TEST(TensorTest, ShapeHelpers) {
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({2, 0, 3}), 0);
  EXPECT_EQ(ShapeString({2, 3}), "[2, 3]");
  Tensor t = FromVector({2, 3, 4}, std::vector<float>(24, 1.0f));
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.bytes(), 96u);
  EXPECT_EQ(t.As2D().shape(), (Shape{6, 4}));
}

TEST(TensorTest, ViewsShareTheBuffer) {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i);
  Tensor t = FromVector({4, 3}, v);
  Tensor rows = t.Rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(ToVector(rows), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  rows.data<float>()[0] = 100.0f;
  EXPECT_EQ(t.data<float>()[3], 100.0f);
  Tensor flat = t.Reshape({12});
  EXPECT_EQ(flat.data<float>()[3], 100.0f);
}

TEST(TensorDeathTest, MisuseIsABugThatAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor t = FromVector({2, 2}, {1, 2, 3, 4});
  EXPECT_DEATH(t.Reshape({3}), "reshape must keep the element count");
  EXPECT_DEATH(t.Rows(1, 3), "row range out of bounds");
  EXPECT_DEATH(t.data<int64_t>(), "tensor element type mismatch");
  EXPECT_DEATH(Tensor().raw(), "data of an undefined tensor");
}

TEST(TensorTest, EmptyRejectsNegativeDimensions) {
  auto t = CpuBackend::Get()->Empty({2, -1}, DType::kF32);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorTest, EmptyRejectsSizesThatOverflowInsteadOfWrapping) {
  // 2^40 * 2^40 elements wraps 64 bits; a wrapped size would allocate a tiny
  // buffer that later writes overrun.
  auto t = CpuBackend::Get()->Empty({int64_t{1} << 40, int64_t{1} << 40},
                                    DType::kF32);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(t.status().message()).find("too large to address"),
            std::string::npos);
  // Representable but impossible: out of memory, not a crash.
  auto huge = CpuBackend::Get()->Empty({int64_t{1} << 60}, DType::kU8);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace conveyor::engine
