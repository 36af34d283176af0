// Devices whose health flaps, with real processes: dpproxy and a sample
// plugin that flips one device's health every 50 ms as processes, the
// kubelet simulator in the test. With flap damping the kubelet sees the
// device turn Unhealthy no more than the allowed flaps and one more, then
// held Unhealthy while it flaps, told once; once the flapping stops and
// the hold runs out it is Healthy again. Off, every flip passes through.
#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process_node.h"

namespace dpproxy {
namespace {

using testing::ProcessNode;

constexpr absl::Duration kWait = ProcessNode::kWait;
constexpr char kGpu[] = "vendor.com/gpu";
constexpr char kFlapping[] = "dev-1";

// dev-1's health in a "devices" event of the simulated kubelet ("" if the
// event is another).
std::string Dev1(const Json& e) {
  if (e.value("event", "") != "devices" || e.value("resource", "") != kGpu) return "";
  for (const Json& d : e["devices"]) {
    if (d.value("id", "") == kFlapping) return d.value("health", "");
  }
  return "";
}

class FlapDampingTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& proxy_flags, int flips) {
    ASSERT_TRUE(sim().Start().ok());
    proxy_ = node_.SpawnProxy(proxy_flags);
    ASSERT_NE(proxy_, nullptr);
    plugin_ = node_.SpawnPlugin(kGpu, {absl::StrCat("--flip_device=", kFlapping),
                                       "--flip_interval=50ms",
                                       absl::StrCat("--flip_count=", flips)});
    ASSERT_NE(plugin_, nullptr);
  }

  sim::KubeletSim& sim() { return node_.sim(); }
  // The lines of dpproxy's events file with `event`, once there are `n`.
  std::vector<std::string> ProxyEvents(const std::string& event, size_t n) {
    return node_.ProxyLines({ProcessNode::Event(event)}, n);
  }

  // How many times the kubelet saw dev-1 turn from Healthy to Unhealthy.
  int Turns() {
    int turns = 0;
    std::string last;
    for (const Json& e : sim().events().Snapshot()) {
      const std::string h = Dev1(e);
      if (h.empty()) continue;
      turns += last == "Healthy" && h == "Unhealthy";
      last = h;
    }
    return turns;
  }

  ProcessNode node_;
  std::unique_ptr<ChildProcess> proxy_;
  std::unique_ptr<ChildProcess> plugin_;
};

TEST_F(FlapDampingTest, AFlappingDeviceIsHeldUnhealthyOnceThenReleased) {
  // 40 flips, 2 s: the fourth turn within the minute starts the hold, each
  // later one doubles it (2 s, capped at 4 s); it ends Healthy.
  Start({"--flap_damping_flaps=3", "--flap_damping_window=1m", "--flap_damping_backoff=2s",
         "--flap_damping_max_backoff=4s"},
        40);
  ASSERT_EQ(ProxyEvents("device_flapping", 1).size(), 1u);
  const size_t held = sim().events().Size();
  const std::vector<std::string> ended = ProxyEvents("device_flapping_ended", 1);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(sim().events()
                  .WaitFor([](const Json& e) { return Dev1(e) == "Healthy"; }, kWait, held)
                  .has_value());
  // Told once, and the kubelet saw at most the three allowed turns and the
  // one that started the hold (fewer where two flips reached it as one
  // list): never the twenty the plugin made.
  EXPECT_EQ(ProxyEvents("device_flapping", 1).size(), 1u);
  EXPECT_GE(Turns(), 1);
  EXPECT_LE(Turns(), 4);
  EXPECT_TRUE(absl::StrContains(ProxyEvents("device_flapping", 1)[0], "\"flaps\":4"));
}

TEST_F(FlapDampingTest, OffEveryFlipPassesThrough) {
  Start({}, 40);
  // Forty flips, twenty turns to Unhealthy: the kubelet sees more than
  // damping would ever let through (a loaded machine may deliver two
  // flips as one list, so not necessarily all twenty). The predicate sees
  // each event once, in order.
  int turns = 0;
  std::string last;
  EXPECT_TRUE(sim().events()
                  .WaitFor(
                      [&](const Json& e) {
                        const std::string h = Dev1(e);
                        if (h.empty()) return false;
                        turns += last == "Healthy" && h == "Unhealthy";
                        last = h;
                        return turns == 5;
                      },
                      kWait)
                  .has_value());
  EXPECT_TRUE(ProxyEvents("device_flapping", 0).empty());
}

}  // namespace
}  // namespace dpproxy
