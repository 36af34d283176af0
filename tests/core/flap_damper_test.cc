// The flap damper on its own (flap_damper.h), on a clock the test moves:
// a device held after more than the configured turns within the window,
// the hold doubling per turn while held and capped, each episode told
// once at its start and once at its end, and off as pass-through.
#include "proxy/core/flap_damper.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class FlapDamperTest : public ::testing::Test {
 protected:
  FlapDamperTest() { damper_.SetSettings({3, absl::Minutes(1), absl::Seconds(10), absl::Seconds(35)}, t0_); }
  absl::Time At(double s) { return t0_ + absl::Seconds(s); }
  // One flip to Unhealthy and back at second `s`.
  void Flip(double s, const std::string& device = "gpu-0") {
    damper_.Observe(device, false, At(s));
    damper_.Observe(device, true, At(s + 0.001));
  }
  std::vector<std::string> Devices(const std::vector<FlapDamper::Episode>& e) {
    std::vector<std::string> out;
    for (const auto& x : e) out.push_back(x.device);
    return out;
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1700000000);
  FlapDamper damper_;
};

TEST_F(FlapDamperTest, MoreTurnsThanAllowedWithinTheWindowHoldTheDeviceOnce) {
  damper_.Observe("gpu-0", true, At(0));
  damper_.Observe("gpu-1", true, At(0));
  for (double s : {1, 2, 3}) Flip(s);
  EXPECT_FALSE(damper_.damped("gpu-0"));  // three turns: allowed
  EXPECT_TRUE(damper_.TakeStarted().empty());
  Flip(4);
  EXPECT_TRUE(damper_.damped("gpu-0"));
  EXPECT_FALSE(damper_.damped("gpu-1"));
  FlapDamper::Changes c = damper_.TakeStarted();
  EXPECT_THAT(Devices(c.started), ElementsAre("gpu-0"));
  EXPECT_EQ(c.started[0].flaps, 4);
  EXPECT_EQ(c.started[0].held_for, absl::Seconds(10));
  EXPECT_TRUE(damper_.TakeStarted().empty());  // told once
  EXPECT_EQ(damper_.next_release(), At(14));
  EXPECT_TRUE(damper_.Tick(At(13)).empty());
  FlapDamper::Changes ended = damper_.Tick(At(14));
  EXPECT_THAT(Devices(ended.ended), ElementsAre("gpu-0"));
  EXPECT_FALSE(damper_.damped("gpu-0"));
}

TEST_F(FlapDamperTest, EachTurnWhileHeldDoublesTheHoldUpToTheCap) {
  damper_.Observe("gpu-0", true, At(0));
  for (double s : {1, 2, 3, 4}) Flip(s);  // held 10 s from 4
  Flip(5);                                 // 20 s from 5
  EXPECT_EQ(damper_.next_release(), At(25));
  Flip(6);                                 // 35 s (capped) from 6
  EXPECT_EQ(damper_.next_release(), At(41));
  Flip(7);
  EXPECT_EQ(damper_.next_release(), At(42));  // still capped
  EXPECT_EQ(damper_.TakeStarted().started.size(), 1u);  // one episode
  EXPECT_TRUE(damper_.Tick(At(41)).empty());
  EXPECT_EQ(damper_.Tick(At(42)).ended.size(), 1u);
}

TEST_F(FlapDamperTest, TurnsOutsideTheWindowAndAFirstSightAreNoFlaps) {
  damper_.Observe("gpu-0", false, At(0));  // first seen Unhealthy: no turn
  damper_.Observe("gpu-0", true, At(1));
  for (double s : {10, 40, 80, 120, 160}) Flip(s);  // never four within a minute
  EXPECT_FALSE(damper_.damped("gpu-0"));
  EXPECT_THAT(damper_.Damped(), IsEmpty());
}

TEST_F(FlapDamperTest, OffPassesHealthThroughAndEndsEveryHold) {
  damper_.Observe("gpu-0", true, At(0));
  for (double s : {1, 2, 3, 4}) Flip(s);
  ASSERT_TRUE(damper_.damped("gpu-0"));
  FlapDamper::Changes c = damper_.SetSettings({}, At(5));
  EXPECT_THAT(Devices(c.ended), ElementsAre("gpu-0"));
  EXPECT_FALSE(damper_.damped("gpu-0"));
  for (double s = 6; s < 20; s += 1) Flip(s);
  EXPECT_FALSE(damper_.damped("gpu-0"));
  EXPECT_TRUE(damper_.TakeStarted().empty());
}

}  // namespace
}  // namespace dpproxy
