#include "engine/dtype.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::engine {
namespace {

TEST(DTypeTest, NamesRoundTripAndSizesMatchTheFormat) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                  DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU8,
                  DType::kU16, DType::kU32, DType::kU64, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_TRUE(IsFloatingPoint(DType::kBF16));
  EXPECT_FALSE(IsFloatingPoint(DType::kU16));
}

TEST(DTypeTest, UnknownNameListsAllowed) {
  auto bad = ParseDType("F8_E4M3");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), testing::HasSubstr("allowed: F32"));
}

}  // namespace
}  // namespace conveyor::engine
