#include "common/hmac.h"

#include <string>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

std::string Hex(absl::string_view key, absl::string_view message) {
  absl::StatusOr<std::string> mac = HmacSha256Hex(key, message);
  EXPECT_TRUE(mac.ok()) << mac.status();
  return mac.ok() ? *mac : "";
}

// RFC 4231, section 4: test cases 1, 2 and 6 (a key longer than SHA-256's
// 64-byte block, which HMAC hashes first).
TEST(HmacSha256Test, MatchesRfc4231Vectors) {
  EXPECT_EQ(Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hex(std::string(131, '\xaa'),
                "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256Test, RawMacIs32BytesAndMatchesTheHex) {
  absl::StatusOr<std::string> mac =
      HmacSha256("Jefe", "what do ya want for nothing?");
  ASSERT_TRUE(mac.ok()) << mac.status();
  ASSERT_EQ(mac->size(), kHmacSha256Bytes);
  EXPECT_EQ(static_cast<uint8_t>((*mac)[0]), 0x5b);
  EXPECT_EQ(static_cast<uint8_t>((*mac)[31]), 0x43);
}

TEST(HmacSha256Test, KeyAndMessageMayHoldAnyBytes) {
  const std::string key("k\0y", 3);
  const std::string message("m\0\xff", 3);
  EXPECT_EQ(Hex(key, message).size(), 2 * kHmacSha256Bytes);
  // The bytes after a NUL count: no C-string truncation anywhere.
  EXPECT_NE(Hex(key, message), Hex("k", message));
  EXPECT_NE(Hex(key, message), Hex(key, "m"));
  EXPECT_EQ(Hex("", "").size(), 2 * kHmacSha256Bytes);
}

}  // namespace
}  // namespace conveyor
