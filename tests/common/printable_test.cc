#include "common/printable.h"

#include <string>

#include "gtest/gtest.h"

namespace conveyor {
namespace {

TEST(PrintableTest, EscapesControlCharactersOnly) {
  EXPECT_EQ(Printable("plain name-1"), "plain name-1");
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe2\x9c\x93"), "caf\xc3\xa9 \xe2\x9c\x93");
  EXPECT_EQ(Printable("evil\x1b[2Jname"), "evil\\x1b[2Jname");
  EXPECT_EQ(Printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Printable("\x01\x7f\n\t"), "\\x01\\x7f\\x0a\\x09");
}

TEST(PrintableTest, HasControlCharacters) {
  EXPECT_FALSE(HasControlCharacters("ok \xc3\xa9"));
  EXPECT_TRUE(HasControlCharacters("bell\x07"));
  EXPECT_TRUE(HasControlCharacters("del\x7f"));
  EXPECT_TRUE(HasControlCharacters(std::string("\0", 1)));
}

}  // namespace
}  // namespace conveyor
