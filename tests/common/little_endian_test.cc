#include "common/little_endian.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(LittleEndianTest, WritesTheLeastSignificantByteFirst) {
  uint8_t b[8] = {};
  PutU64(b, 0x0807060504030201ull);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[i], i + 1) << i;
  PutU32(b, 0xddccbbaau);
  EXPECT_EQ(b[0], 0xaa);
  EXPECT_EQ(b[3], 0xdd);
  EXPECT_EQ(b[4], 5);  // Untouched past the value's width.
  PutU16(b, 0x1234);
  EXPECT_EQ(b[0], 0x34);
  EXPECT_EQ(b[1], 0x12);
}

TEST(LittleEndianTest, ReadsBackWhatItWroteFromCharBuffersToo) {
  char c[8];
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x80}, ~uint64_t{0},
                     uint64_t{0x8000000000000000ull}}) {
    PutU64(c, v);
    EXPECT_EQ(GetU64(c), v);
    PutU32(c, static_cast<uint32_t>(v));
    EXPECT_EQ(GetU32(c), static_cast<uint32_t>(v));
    PutU16(c, static_cast<uint16_t>(v));
    EXPECT_EQ(GetU16(c), static_cast<uint16_t>(v));
  }
  // Bytes above 0x7f in a (signed) char buffer are not sign-extended.
  const char high[4] = {'\xff', '\x00', '\x80', '\x00'};
  EXPECT_EQ(GetU32(high), 0x008000ffu);
}

}  // namespace
}  // namespace conveyor
