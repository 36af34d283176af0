// The call gate on its own: the kubelet's calls served, held and forwarded
// through a handoff, by a caller that leaves a resume callback and by one
// that waits.
#include "proxy/kubelet_side/call_gate.h"

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using Mode = CallGate::Mode;
using Admission = CallGate::Admission;

bool Never() { return false; }

TEST(CallGateTest, ServedCallsAreCountedUntilDone) {
  CallGate gate;
  std::string to;
  EXPECT_EQ(gate.Admit(nullptr, nullptr, &to), Mode::kServe);
  EXPECT_EQ(gate.AdmitWaiting(Never, absl::InfiniteFuture(), &to), Admission::kServe);
  EXPECT_TRUE(to.empty());
  EXPECT_FALSE(gate.WaitForServed(absl::ZeroDuration()));
  gate.Done();
  EXPECT_FALSE(gate.WaitForServed(absl::ZeroDuration()));
  gate.Done();
  EXPECT_TRUE(gate.WaitForServed(absl::ZeroDuration()));
}

TEST(CallGateTest, AHeldCallResumesWhenForwardedAndIsForwardedThen) {
  CallGate gate;
  gate.Hold();
  int key = 0, resumed = 0;
  std::string to;
  EXPECT_EQ(gate.Admit(&key, [&] { ++resumed; }, &to), Mode::kHold);
  // Held calls are not in progress: a handoff waits only for those served.
  EXPECT_TRUE(gate.WaitForServed(absl::ZeroDuration()));
  EXPECT_EQ(resumed, 0);
  EXPECT_EQ(gate.Forward("/run/new.sock"), 1u);
  EXPECT_EQ(resumed, 1);
  // The resumed call asks again and is forwarded.
  EXPECT_EQ(gate.Admit(&key, [&] { ++resumed; }, &to), Mode::kForward);
  EXPECT_EQ(to, "/run/new.sock");
  EXPECT_FALSE(gate.Unhold(&key));  // no longer held
  gate.Done();
  EXPECT_TRUE(gate.WaitForServed(absl::ZeroDuration()));
}

TEST(CallGateTest, AHeldCallWhoseCallerLeftIsNotResumed) {
  CallGate gate;
  gate.Hold();
  int a = 0, b = 0, resumed = 0;
  std::string to;
  gate.Admit(&a, [&] { resumed += 1; }, &to);
  gate.Admit(&b, [&] { resumed += 10; }, &to);
  EXPECT_TRUE(gate.Unhold(&a));
  EXPECT_FALSE(gate.Unhold(&a));
  gate.Serve();  // a handoff given up: served here again
  EXPECT_EQ(resumed, 10);
  EXPECT_EQ(gate.Admit(&b, nullptr, &to), Mode::kServe);
  EXPECT_TRUE(to.empty());
}

TEST(CallGateTest, AWaitingCallIsRefusedAtItsDeadlineOrCancellationWhileHeld) {
  CallGate gate;
  gate.Hold();
  std::string to;
  EXPECT_EQ(gate.AdmitWaiting(Never, absl::Now() + absl::Milliseconds(50), &to),
            Admission::kRefuse);
  EXPECT_EQ(gate.AdmitWaiting([] { return true; }, absl::InfiniteFuture(), &to),
            Admission::kRefuse);
  EXPECT_TRUE(gate.WaitForServed(absl::ZeroDuration()));  // refusals are not in progress
}

TEST(CallGateTest, AWaitingCallGoesOnWhenTheGateForwards) {
  CallGate gate;
  gate.Hold();
  absl::Notification asking;
  Admission got = Admission::kRefuse;
  std::string to;
  std::thread caller([&] {
    asking.Notify();
    got = gate.AdmitWaiting(Never, absl::Now() + absl::Seconds(30), &to);
  });
  ASSERT_TRUE(asking.WaitForNotificationWithTimeout(absl::Seconds(10)));
  gate.Forward("/run/new.sock");
  caller.join();
  EXPECT_EQ(got, Admission::kForward);
  EXPECT_EQ(to, "/run/new.sock");
  gate.Done();
}

TEST(CallGateTest, AStoppedGateRefusesWaitingCallsAndSaysSoOnce) {
  CallGate gate;
  gate.Hold();
  absl::Notification asking;
  Admission got = Admission::kServe;
  std::thread caller([&] {
    std::string to;
    asking.Notify();
    got = gate.AdmitWaiting(Never, absl::Now() + absl::Seconds(30), &to);
  });
  ASSERT_TRUE(asking.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(gate.Stop());
  EXPECT_FALSE(gate.Stop());
  caller.join();
  EXPECT_EQ(got, Admission::kRefuse);
}

}  // namespace
}  // namespace dpproxy
