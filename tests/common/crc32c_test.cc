#include "common/crc32c.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// A bit-at-a-time CRC-32C straight from the definition, to check the table
// driven one against on arbitrary input.
uint32_t ReferenceCrc32c(std::span<const uint8_t> data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1) != 0 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
  }
  return ~crc;
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c({}), 0u);
  EXPECT_EQ(Crc32c(Bytes("a")), 0xC1D04330u);
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  // RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(Crc32c(std::vector<uint8_t>(32, 0x00)), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::vector<uint8_t>(32, 0xFF)), 0x62A8AB43u);
  std::vector<uint8_t> ascending(32);
  std::vector<uint8_t> descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, MatchesTheBitwiseDefinitionAtEveryLengthAndOffset) {
  std::vector<uint8_t> data(300);
  uint32_t x = 12345;
  for (uint8_t& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 24);
  }
  // Lengths and offsets around the 8-byte blocks exercise the tail loop and
  // unaligned loads.
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t len = 0; len + offset <= data.size(); len += 7) {
      const std::span<const uint8_t> part(data.data() + offset, len);
      ASSERT_EQ(Crc32c(part), ReferenceCrc32c(part))
          << "offset " << offset << " length " << len;
    }
  }
}

TEST(Crc32cTest, ChainingEqualsOneShot) {
  const std::string text =
      "The quick brown fox jumps over the lazy dog, again and again.";
  const uint32_t whole = Crc32c(Bytes(text));
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const std::span<const uint8_t> all = Bytes(text);
    EXPECT_EQ(Crc32c(all.subspan(cut), Crc32c(all.first(cut))), whole)
        << "cut at " << cut;
  }
  // Three pieces, one of them empty.
  const std::span<const uint8_t> all = Bytes(text);
  uint32_t crc = Crc32c(all.first(5));
  crc = Crc32c(all.subspan(5, 0), crc);
  crc = Crc32c(all.subspan(5), crc);
  EXPECT_EQ(crc, whole);
}

TEST(Crc32cTest, DetectsASingleFlippedBit) {
  std::string text(1000, 'x');
  const uint32_t before = Crc32c(Bytes(text));
  text[617] ^= 0x10;
  EXPECT_NE(Crc32c(Bytes(text)), before);
}

}  // namespace
}  // namespace conveyor
