#include "baton/common/clock.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(VirtualClock, MovesOnlyWhenTold) {
  VirtualClock clock(100);
  EXPECT_EQ(clock.now_ns(), 100);
  EXPECT_EQ(clock.now_ns(), 100);
  ASSERT_TRUE(clock.advance_to(250).is_ok());
  EXPECT_EQ(clock.now_ns(), 250);
  ASSERT_TRUE(clock.advance_by(50).is_ok());
  EXPECT_EQ(clock.now_ns(), 300);
  ASSERT_TRUE(clock.advance_to(300).is_ok());  // standing still is allowed
  EXPECT_EQ(clock.now_ns(), 300);
}

TEST(VirtualClock, RefusesToGoBack) {
  VirtualClock clock(1000);
  const Status back = clock.advance_to(999);
  EXPECT_EQ(back.code(), StatusCode::kOutOfRange);
  EXPECT_NE(back.message().find("999"), std::string::npos);
  EXPECT_EQ(clock.advance_by(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(clock.now_ns(), 1000);  // unchanged by the refused calls
}

TEST(SteadyClock, IsMonotonic) {
  SteadyClock clock;
  const Clock& c = clock;  // usable through the interface the loop takes
  TimeNs last = c.now_ns();
  for (int i = 0; i < 1000; ++i) {
    const TimeNs now = c.now_ns();
    ASSERT_GE(now, last);
    last = now;
  }
}

}  // namespace
}  // namespace baton
