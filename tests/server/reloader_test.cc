// Reloader: which settings a reload applies, in which order, and which
// wait for the next start. The host records what it is asked to do; the
// reload's effects on a running dpproxy are tests/proxy's (proxy_test,
// rename_test).
#include "proxy/server/reloader.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class RecordingHost : public Reloader::Host {
 public:
  void ApplyLossPolicy(const ProxyConfig&) override { calls.push_back("loss"); }
  void ApplyCallSettings(const ProxyConfig&) override { calls.push_back("calls"); }
  void ApplyServedNames(const ProxyConfig&) override { calls.push_back("names"); }
  void ApplyPaths(const ProxyConfig&) override { calls.push_back("paths"); }
  void RemoveStaticBackend(const StaticBackendConfig& b) override {
    calls.push_back(absl::StrCat("remove ", b.endpoint));
  }
  void AddStaticBackend(const StaticBackendConfig& b) override {
    calls.push_back(absl::StrCat("add ", b.endpoint));
  }
  void StaticBackendsApplied(const ProxyConfig& next) override {
    calls.push_back(absl::StrCat("backends ", next.static_backends.size()));
  }
  std::vector<std::string> calls;
};

ProxyConfig Running() {
  ProxyConfig c;
  c.static_backends.push_back({"vendor.com/nic", "/run/nic.sock", std::nullopt});
  return c;
}

TEST(ReloaderTest, EachKindAppliesOnceInOrderNamesBeforeBackends) {
  RecordingHost host;
  EventLog events("test");
  Reloader reloader(&host, &events, /*dra=*/false);
  ProxyConfig next = Running();
  next.policy.loss_policy = LossPolicy::kHold;
  next.policy.hold = absl::Seconds(45);
  next.kubelet.backend_timeout = absl::Seconds(7);
  next.renames["legacy.com/gpu"] = "vendor.com/gpu";
  next.static_backends[0].endpoint = "/run/nic2.sock";  // moved
  next.kubelet.kubelet_root = "/elsewhere";             // start-time only
  const Reloader::Result r = reloader.Reload(Running(), next);
  EXPECT_THAT(host.calls, ElementsAre("loss", "calls", "names", "remove /run/nic.sock",
                                      "add /run/nic2.sock", "backends 1"));
  EXPECT_THAT(r.needs_restart, ElementsAre(HasSubstr("-> /elsewhere")));
  EXPECT_EQ(r.applied.size(), 5u) << ::testing::PrintToString(r.applied);
  EXPECT_TRUE(events.WaitForEvent("config_applied", {{"setting", "backend_loss"},
                                                     {"policy", "hold"}},
                                  absl::ZeroDuration())
                  .has_value());
  EXPECT_TRUE(events.WaitForEvent("config_reloaded", Json::object(), absl::ZeroDuration())
                  .has_value());
}

TEST(ReloaderTest, NothingChangedTouchesNothing) {
  RecordingHost host;
  EventLog events("test");
  Reloader reloader(&host, &events, /*dra=*/false);
  const Reloader::Result r = reloader.Reload(Running(), Running());
  EXPECT_THAT(host.calls, IsEmpty());
  EXPECT_THAT(r.applied, IsEmpty());
  EXPECT_THAT(r.needs_restart, IsEmpty());
}

// A resource's path applies while running only where dpproxy runs both
// sides; otherwise the side it needs is not there until the next start.
TEST(ReloaderTest, PathsApplyWhereBothSidesRun) {
  ProxyConfig next = Running();
  next.paths["vendor.com/gpu"] = KubeletPath::kBoth;
  {
    RecordingHost host;
    EventLog events("test");
    Reloader reloader(&host, &events, /*dra=*/true, /*both_sides=*/true);
    const Reloader::Result r = reloader.Reload(Running(), next);
    EXPECT_THAT(host.calls, ElementsAre("paths"));
    EXPECT_THAT(r.applied, ElementsAre(HasSubstr("paths.vendor.com/gpu")));
    EXPECT_THAT(r.needs_restart, IsEmpty());
  }
  RecordingHost host;
  EventLog events("test");
  Reloader reloader(&host, &events, /*dra=*/false);
  const Reloader::Result r = reloader.Reload(Running(), next);
  EXPECT_THAT(host.calls, IsEmpty());
  EXPECT_THAT(r.needs_restart, ElementsAre(HasSubstr("paths.vendor.com/gpu")));
}

// In DRA mode renames and ID maps change what is published under which
// pool: they wait for the next start.
TEST(ReloaderTest, NamesWaitForTheNextStartInDraMode) {
  RecordingHost host;
  EventLog events("test");
  Reloader reloader(&host, &events, /*dra=*/true);
  ProxyConfig next = Running();
  next.renames["legacy.com/gpu"] = "vendor.com/gpu";
  const Reloader::Result r = reloader.Reload(Running(), next);
  EXPECT_THAT(host.calls, IsEmpty());
  EXPECT_THAT(r.needs_restart, ElementsAre(HasSubstr("renames.legacy.com/gpu")));
}

}  // namespace
}  // namespace dpproxy
