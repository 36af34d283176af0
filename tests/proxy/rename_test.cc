// Renames, ID maps and compact IDs changed while pods hold devices, and
// static backends removed: at a restart and by a reload. The kubelet knows
// those allocations by their old name and ID only; the device they hold is
// never shown free under the new ones until the pod is gone, and a name no
// longer served gives no device to a new pod.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/core/resource.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kLegacy[] = "legacy.com/gpu";  // what the plugin calls it
constexpr char kVendor[] = "vendor.com/gpu";

std::function<void(ProxyConfig&)> PassesByHand() {
  return [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();  // passes run by hand
    c.reconcile_grace = absl::ZeroDuration();
  };
}

// What the kubelet sees of a resource: id -> health.
std::map<std::string, std::string> KubeletView(ProxyHarness& h, const std::string& resource) {
  std::map<std::string, std::string> out;
  const sim::State st = h.sim().GetState();
  const sim::ResourceState* r = h.Resource(st, resource);
  if (r == nullptr) return out;
  for (const auto& d : r->devices()) out[d.id()] = d.health();
  return out;
}

// The kubelet has `count` devices of `resource`, every one Unhealthy.
bool AllShownUnhealthy(ProxyHarness& h, const std::string& resource, size_t count) {
  const auto seen = KubeletView(h, resource);
  if (seen.size() != count) return false;
  for (const auto& [id, health] : seen) {
    if (health != "Unhealthy") return false;
  }
  return true;
}

class RenameTest : public ::testing::Test {
 protected:
  RenameTest() : h_(Personality::kV1Beta1Sync, false, PassesByHand()) {}

  // The plugin serves kLegacy; a pod holds one device under that name.
  void HoldOneUnderTheOldName() {
    ASSERT_TRUE(h_.sim().Start().ok());
    ASSERT_TRUE(h_.proxy().Start().ok());
    sample::SamplePluginOptions o = h_.PluginOptions(ApiVersion::kV1Beta1);
    o.resource = kLegacy;
    ASSERT_NE(h_.StartPlugin(o), nullptr);
    ASSERT_TRUE(h_.sim().WaitForResource(kLegacy, 4, kWait));
    absl::StatusOr<sim::AllocateResponse> a =
        h_.sim().Allocate(testing::PodRequest("train", {{"main", 1}}, kLegacy));
    ASSERT_TRUE(a.ok()) << a.status();
    pod_uid_ = a->pod_uid();
    held_ = a->allocations(0).device_ids(0);
    ASSERT_TRUE(h_.proxy().ReconcileOnce().ok());  // names the pod
  }

  std::map<std::string, std::string> Seen(const std::string& resource) {
    return KubeletView(h_, resource);
  }
  bool AllUnhealthy(const std::string& resource) { return AllShownUnhealthy(h_, resource, 4); }

  // The renamed resource as the kubelet must see it: every device, the
  // one the pod holds Unhealthy.
  bool HeldShownUnhealthyUnderTheNewName() {
    const auto seen = Seen(kVendor);
    if (seen.size() != 4 || seen.count(held_) == 0) return false;
    for (const auto& [id, health] : seen) {
      if (health != (id == held_ ? "Unhealthy" : "Healthy")) return false;
    }
    return true;
  }

  // The pod goes: released after two passes that do not see it.
  void EndThePod() {
    ASSERT_TRUE(h_.sim().DeletePod(pod_uid_).ok());
    ASSERT_TRUE(h_.proxy().ReconcileOnce().ok());
    ASSERT_TRUE(h_.proxy().ReconcileOnce().ok());
  }

  ProxyHarness h_;
  std::string pod_uid_, held_;
};

TEST_F(RenameTest, ARenameAtRestartNeverShowsAHeldDeviceFree) {
  ASSERT_NO_FATAL_FAILURE(HoldOneUnderTheOldName());
  h_.RestartProxy([](ProxyConfig& c) { c.renames[kLegacy] = kVendor; });
  ASSERT_TRUE(h_.proxy().Start().ok());
  ASSERT_TRUE(h_.WaitFor([&] { return HeldShownUnhealthyUnderTheNewName(); }))
      << "vendor.com/gpu as the kubelet sees it: " << Seen(kVendor).size() << " devices";
  // The old name stays registered (its pod's allocation is there) but gives
  // nothing to a new pod.
  EXPECT_TRUE(h_.WaitFor([&] { return AllUnhealthy(kLegacy); }));
  const ProxyStatus st = h_.proxy().Status();
  ASSERT_EQ(st.held_elsewhere.size(), 1u);
  EXPECT_EQ(st.held_elsewhere[0].resource, kVendor);
  EXPECT_EQ(st.held_elsewhere[0].device, held_);
  EXPECT_EQ(st.held_elsewhere[0].held_as_resource, kLegacy);
  EXPECT_EQ(st.held_elsewhere[0].pod, "default/train");
  ASSERT_NE(st.Find(kLegacy), nullptr);
  EXPECT_EQ(st.Find(kLegacy)->now_served_as, kVendor);
  EXPECT_THAT(StatusTable(st), HasSubstr("HELD UNDER ANOTHER NAME OR ID"));
  EXPECT_THAT(h_.MetricsText(),
              HasSubstr("dpproxy_devices_held_elsewhere{resource=\"vendor.com/gpu\"} 1"));

  // A pod asking the new name for every free device gets the other three.
  absl::StatusOr<sim::AllocateResponse> b =
      h_.sim().Allocate(testing::PodRequest("infer", {{"main", 3}}, kVendor));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(testing::DeviceIdsOf(b->allocations(0)), ::testing::Not(Contains(held_)));
  // Recorded with the plugin's name: a later rename keeps them apart too.
  const state::State journal = h_.proxy().state()->Snapshot();
  ASSERT_EQ(journal.allocations_size(), 2);
  EXPECT_EQ(journal.allocations(1).resource(), kVendor);
  EXPECT_EQ(journal.allocations(1).backend_resource(), kLegacy);

  // The old pod goes: its device is free under the new name.
  ASSERT_NO_FATAL_FAILURE(EndThePod());
  EXPECT_TRUE(h_.WaitFor([&] { return Seen(kVendor)[held_] == "Healthy"; }));
  EXPECT_TRUE(h_.proxy().Status().held_elsewhere.empty());
  // Nothing holds a device under the old name any more: the next start
  // leaves it out.
  h_.RestartProxy();
  ASSERT_TRUE(h_.proxy().Start().ok());
  EXPECT_TRUE(h_.proxy().events().WaitForEvent("resource_retired",
                                               {{"resource", kLegacy}, {"served_as", kVendor}},
                                               kWait));
  EXPECT_EQ(h_.proxy().Status().Find(kLegacy), nullptr);
}

TEST_F(RenameTest, AReloadRenamesLiveAndKeepsTheHeldDeviceAway) {
  ASSERT_NO_FATAL_FAILURE(HoldOneUnderTheOldName());
  ProxyConfig next = h_.config();
  next.renames[kLegacy] = kVendor;
  const ProxyServer::ReloadResult r = h_.proxy().Reload(next);
  EXPECT_THAT(r.applied, ElementsAre("renames.legacy.com/gpu: (none) -> vendor.com/gpu"));
  EXPECT_TRUE(r.needs_restart.empty());
  EXPECT_TRUE(h_.proxy().events().WaitForEvent(
      "resource_renamed", {{"resource", kLegacy}, {"served_as", kVendor}}, kWait));
  ASSERT_TRUE(h_.WaitFor([&] { return HeldShownUnhealthyUnderTheNewName(); }));
  EXPECT_TRUE(h_.WaitFor([&] { return AllUnhealthy(kLegacy); }));
  // The new name reaches the plugin, with the plugin's IDs.
  absl::StatusOr<sim::AllocateResponse> b =
      h_.sim().Allocate(testing::PodRequest("infer", {{"main", 3}}, kVendor));
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<std::string> given = testing::DeviceIdsOf(b->allocations(0));
  EXPECT_THAT(given, ::testing::Not(Contains(held_)));
  EXPECT_EQ(b->allocations(0).response().envs().at("SAMPLE_GPU_DEVICES"),
            absl::StrJoin(given, ","));
  // The old pod goes: its device is free under the new name.
  ASSERT_NO_FATAL_FAILURE(EndThePod());
  EXPECT_TRUE(h_.WaitFor([&] { return Seen(kVendor)[held_] == "Healthy"; }));
  // Back to the old name: the allocations made under the new one now keep
  // their devices away from the old one.
  const ProxyServer::ReloadResult back = h_.proxy().Reload(h_.config());
  EXPECT_THAT(back.applied, ElementsAre("renames.legacy.com/gpu: vendor.com/gpu -> (none)"));
  EXPECT_TRUE(h_.WaitFor([&] {
    const auto seen = Seen(kLegacy);
    int unhealthy = 0;
    for (const std::string& id : given) unhealthy += seen.count(id) && seen.at(id) == "Unhealthy";
    return seen.size() == 4 && unhealthy == 3 && seen.at(held_) == "Healthy";
  }));
  EXPECT_TRUE(h_.WaitFor([&] { return AllUnhealthy(kVendor); }));
}

TEST_F(RenameTest, CompactIdsSwitchedOnLiveKeepAHeldDeviceAwayUnderItsNewId) {
  ASSERT_NO_FATAL_FAILURE(HoldOneUnderTheOldName());
  ProxyConfig next = h_.config();
  next.compact_ids.insert(kLegacy);
  const ProxyServer::ReloadResult r = h_.proxy().Reload(next);
  EXPECT_THAT(r.applied, ElementsAre("compact_ids[0]: (none) -> legacy.com/gpu"));
  EXPECT_TRUE(h_.proxy().events().WaitForEvent("resource_ids_changed",
                                               {{"resource", kLegacy}}, kWait));
  const std::string held_compact = CompactDeviceId(held_);
  // Four compact IDs, the held one Unhealthy; its old ID stays listed,
  // Unhealthy, while the pod holds it.
  ASSERT_TRUE(h_.WaitFor([&] {
    const auto seen = Seen(kLegacy);
    if (seen.size() != 5 || seen.count(held_) == 0 || seen.count(held_compact) == 0) {
      return false;
    }
    int healthy = 0;
    for (const auto& [id, health] : seen) healthy += health == "Healthy";
    return healthy == 3 && seen.at(held_) == "Unhealthy" &&
           seen.at(held_compact) == "Unhealthy";
  }));
  // A new pod's compact IDs reach the plugin as its own.
  absl::StatusOr<sim::AllocateResponse> b =
      h_.sim().Allocate(testing::PodRequest("infer", {{"main", 3}}, kLegacy));
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<std::string> plugin_ids;
  for (int i = 0; i < 4; ++i) {
    const std::string id = "gpu-" + std::to_string(i);
    if (id != held_) plugin_ids.push_back(id);
  }
  std::vector<std::string> got = absl::StrSplit(
      b->allocations(0).response().envs().at("SAMPLE_GPU_DEVICES"), ',');
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, plugin_ids);
  const state::State journal = h_.proxy().state()->Snapshot();
  ASSERT_EQ(journal.allocations_size(), 2);
  EXPECT_EQ(journal.allocations(1).backend_device_ids_size(), 3);
  // The old pod goes: its device is free under its compact ID, and the old
  // ID is dropped with the plugin's next list.
  ASSERT_NO_FATAL_FAILURE(EndThePod());
  EXPECT_TRUE(h_.WaitFor([&] { return Seen(kLegacy)[held_compact] == "Healthy"; }));
}

// A sample plugin dpproxy dials itself (a static backend) at
// <plugin_dir>/static-nic.sock, serving vendor.com/nic.
sample::SamplePluginOptions StaticNic(ProxyHarness& h, const testing::ShortTempDir& plugin_dir) {
  sample::SamplePluginOptions nic = h.PluginOptions(ApiVersion::kV1Beta1);
  nic.resource = "vendor.com/nic";
  nic.registration = sample::RegistrationMode::kNone;
  nic.socket_name = "static-nic.sock";
  nic.kubelet_socket = plugin_dir.Sub("unused.sock");
  return nic;
}

// A static backend whose socket is not there: said at the first failure
// (event, log), shown in status and metrics while it lasts, and cleared
// once the plugin is there and dialled.
TEST(UnreachableStaticBackendTest, IsToldAtOnceAndClearedWhenReached) {
  constexpr char kNic[] = "vendor.com/nic";
  testing::ShortTempDir plugin_dir;
  const std::string socket = plugin_dir.Sub("static-nic.sock");
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    PassesByHand()(c);
    c.static_backends.push_back({kNic, socket, std::nullopt});
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_TRUE(h.proxy().events().WaitForEvent("static_backend_unreachable",
                                              {{"resource", kNic}, {"endpoint", socket}}, kWait));
  ASSERT_TRUE(h.proxy().WaitForStaticDials(2, kWait));
  const ProxyStatus st = h.proxy().Status();
  ASSERT_NE(st.Find(kNic), nullptr);
  EXPECT_GE(st.Find(kNic)->backend_dial_failures, 2);
  EXPECT_THAT(st.Find(kNic)->backend_error, HasSubstr(socket));
  EXPECT_THAT(StatusTable(st), HasSubstr("STATIC BACKEND CANNOT BE DIALLED"));
  EXPECT_THAT(h.MetricsText(),
              HasSubstr("dpproxy_static_backend_dial_failures{resource=\"vendor.com/nic\"}"));
  // Told once, not once per attempt.
  EXPECT_EQ((h.proxy().events().Counts()[{"static_backend_unreachable", kNic}]), 1);

  ASSERT_NE(h.StartPlugin(StaticNic(h, plugin_dir)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kNic, 4, kWait));
  ASSERT_TRUE(h.WaitFor([&] {
    const ProxyStatus st = h.proxy().Status();
    const ResourceStatus* r = st.Find(kNic);
    return r != nullptr && r->backend_connected && r->backend_error.empty() &&
           r->backend_dial_failures == 0;
  }));
  EXPECT_THAT(StatusTable(h.proxy().Status()), Not(HasSubstr("CANNOT BE DIALLED")));
  EXPECT_THAT(h.MetricsText(),
              HasSubstr("dpproxy_static_backend_dial_failures{resource=\"vendor.com/nic\"} 0"));
}

// A static backend removed from the configuration: its connection ends, its
// devices are shown Unhealthy (no new pod gets one), it stays while a pod
// holds one of them, and a start after that pod leaves it out.
TEST(RemovedStaticBackendTest, ItsResourceGivesNothingMoreAndGoesOnceNoPodHoldsIt) {
  constexpr char kNic[] = "vendor.com/nic";
  testing::ShortTempDir plugin_dir;
  const std::string socket = plugin_dir.Sub("static-nic.sock");
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    PassesByHand()(c);
    c.static_backends.push_back({kNic, socket, std::nullopt});
  });
  ASSERT_NE(h.StartPlugin(StaticNic(h, plugin_dir)), nullptr);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kNic, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a =
      h.sim().Allocate(testing::PodRequest("net", {{"main", 1}}, kNic));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  auto all_unhealthy = [&] { return AllShownUnhealthy(h, kNic, 4); };

  ProxyConfig next = h.config();
  next.static_backends.clear();
  const ProxyServer::ReloadResult r = h.proxy().Reload(next);
  EXPECT_THAT(r.applied, Contains(HasSubstr("backends[0].endpoint: ")));
  EXPECT_TRUE(h.proxy().events().WaitForEvent("static_backend_removed", {{"resource", kNic}},
                                              kWait));
  EXPECT_TRUE(h.proxy().events().WaitForEvent("backend_down", {{"resource", kNic}}, kWait));
  ASSERT_TRUE(h.WaitFor(all_unhealthy));
  ASSERT_NE(h.proxy().Status().Find(kNic), nullptr);
  EXPECT_TRUE(h.proxy().Status().Find(kNic)->removed);
  EXPECT_THAT(StatusTable(h.proxy().Status()), HasSubstr("REMOVED from the configuration"));

  // A restart keeps it while the pod holds a device of it, still giving
  // nothing to a new pod.
  const size_t restarted = h.sim().events().Size();
  h.RestartProxy([](ProxyConfig& c) { c.static_backends.clear(); });
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("register_request", {{"resource", kNic}}, kWait,
                                            restarted));
  EXPECT_TRUE(h.WaitFor([&] {
    const ProxyStatus st = h.proxy().Status();
    return st.Find(kNic) != nullptr && st.Find(kNic)->removed && all_unhealthy();
  }));

  // The pod goes: the next start leaves the resource out.
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_EQ(h.proxy().state()->AllocationCount(), 0);
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_TRUE(h.proxy().events().WaitForEvent("resource_retired", {{"resource", kNic}}, kWait));
  EXPECT_EQ(h.proxy().Status().Find(kNic), nullptr);
}

}  // namespace
}  // namespace dpproxy
