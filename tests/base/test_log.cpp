// log_escape: client text in a log line can neither end the line nor drive a terminal.
#include <gtest/gtest.h>

#include "base/log.h"

namespace v4 {
namespace {

TEST(LogEscape, ControlCharactersBackslashesAndBadUtf8) {
  EXPECT_EQ(log_escape("plain /v1/models"), "plain /v1/models");
  EXPECT_EQ(log_escape("a\nb\r\tc\\"), "a\\nb\\r\\tc\\\\");
  EXPECT_EQ(log_escape("x\x1b[31m"), "x\\u001b[31m");
  EXPECT_EQ(log_escape("\xc2\x85 \xe2\x80\xa8"), "\\u0085 \\u2028");  // NEL (C1), LINE SEPARATOR
  EXPECT_EQ(log_escape("caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80");
  EXPECT_EQ(log_escape("\xff\xc0\x80 \xe4\xb8"), "\\xff\\xc0\\x80 \\xe4\\xb8");  // stray, overlong, cut
  EXPECT_EQ(log_escape(std::string_view("a\0b", 3)), "a\\u0000b");
}

TEST(LogEscape, KeepsAtMostMaxChars) {
  EXPECT_EQ(log_escape("abcdef", 3), "abc…");
  EXPECT_EQ(log_escape("abc", 3), "abc");
  EXPECT_EQ(log_escape("\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97", 2), "\xe4\xb8\xad\xe6\x96\x87…");
  EXPECT_EQ(log_escape("\n\n\n", 2), "\\n\\n…");
}

}  // namespace
}  // namespace v4
