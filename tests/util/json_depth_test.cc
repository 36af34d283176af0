#include "proxy/util/json_depth.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(JsonDepthTest, CountsObjectsAndArraysOutsideStrings) {
  EXPECT_EQ(JsonDepth(""), 0);
  EXPECT_EQ(JsonDepth("1"), 0);
  EXPECT_EQ(JsonDepth("{}"), 1);
  EXPECT_EQ(JsonDepth(R"({"a":[{"b":[]}],"c":{}})"), 4);
  // Brackets inside strings, escaped quotes included, are text.
  EXPECT_EQ(JsonDepth(R"({"a":"[[[{{{","b":"\"[[[","c":"\\"})"), 1);
  EXPECT_EQ(JsonDepth(Nested(60000)), 60000);
}

TEST(JsonDepthTest, TooDeepIsRefusedNamingTheLimit) {
  EXPECT_TRUE(CheckJsonDepth(Nested(kMaxJsonDepth)).ok());
  absl::Status s = CheckJsonDepth(Nested(kMaxJsonDepth + 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nested more than 64 levels deep (65 here)"));
  s = CheckJsonDepth(Nested(60000));
  EXPECT_THAT(std::string(s.message()), HasSubstr("60000 here"));
  EXPECT_TRUE(CheckJsonDepth(Nested(3), 3).ok());
  EXPECT_FALSE(CheckJsonDepth(Nested(4), 3).ok());
}

// Unbalanced text is the parser's to refuse: the count neither crashes
// nor goes below zero.
TEST(JsonDepthTest, MalformedTextIsOnlyCounted) {
  EXPECT_EQ(JsonDepth("]]]]["), 1);
  EXPECT_EQ(JsonDepth("[[[\"unterminated"), 3);
  EXPECT_EQ(JsonDepth("\"\\"), 0);
}

}  // namespace
}  // namespace dpproxy
