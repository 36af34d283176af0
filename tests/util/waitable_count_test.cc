#include "proxy/util/waitable_count.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

// A waiter wakes when another thread raises the count to what it waits
// for, not before; a count that never gets there ends the wait at its
// deadline, saying so.
TEST(WaitableCountTest, WakesWhenTheCountIsReachedAndEndsAtTheDeadlineOtherwise) {
  WaitableCount count;
  absl::Notification first_seen;
  std::thread raiser([&] {
    count.Add();
    first_seen.WaitForNotification();
    count.Add();
  });
  EXPECT_TRUE(count.WaitFor(1, absl::Seconds(10)));
  EXPECT_EQ(count.Get(), 1);
  first_seen.Notify();
  EXPECT_TRUE(count.WaitFor(2, absl::Seconds(10)));
  raiser.join();
  EXPECT_EQ(count.Get(), 2);
  EXPECT_FALSE(count.WaitFor(3, absl::Milliseconds(20)));
  EXPECT_TRUE(count.WaitFor(2, absl::ZeroDuration()));  // already there
}

}  // namespace
}  // namespace dpproxy
