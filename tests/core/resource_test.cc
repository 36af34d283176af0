// Resource, the per-resource core, driven by a strict mock backend whose
// callbacks the test calls (no sockets): what the kubelet is shown, and what a
// list update costs in calls to the state keeper.
#include "proxy/core/resource.h"

#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "tests/testing/mock_backend.h"

namespace dpproxy {
namespace {

using ::testing::_;
using ::testing::AnyNumber;
using ::testing::SaveArg;
using ::testing::StrictMock;
using MockBackend = StrictMock<testing::MockBackend>;

// A backend whose ListAndWatch is the test: its callbacks are called as the
// stream reader would. Any call but Start and Stop fails the test.
std::shared_ptr<MockBackend> StreamOnlyBackend(const std::string& endpoint = "/run/mock.sock") {
  auto b = std::make_shared<MockBackend>("vendor.com/gpu", endpoint);
  EXPECT_CALL(*b, Start(_)).WillOnce(SaveArg<0>(&b->callbacks));
  EXPECT_CALL(*b, Stop()).Times(AnyNumber());
  return b;
}

std::vector<v1beta1::Device> Devices(int n, const std::string& prefix) {
  std::vector<v1beta1::Device> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)].set_id(absl::StrCat(prefix, i));
    out[static_cast<size_t>(i)].set_health("Healthy");
  }
  return out;
}

// Issue 7.19: a changed list cost O(n^2) under the lock Allocate needs, and
// asked the state keeper about every old device. It is O(n) with hashing,
// and the keeper is asked only about devices that vanished.
TEST(ResourceTest, ListUpdatesAskOnlyAboutVanishedDevices) {
  EventLog events("test");
  std::atomic<int> asked{0};
  const std::set<std::string> allocated = {"gpu-7"};
  ResourceHooks hooks;
  hooks.is_allocated = [&](const std::string& id) {
    ++asked;
    return allocated.count(id) > 0;
  };
  Resource r("vendor.com/gpu", ResourcePolicy(), &events, hooks);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  constexpr int kDevices = 20000;
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(kDevices, "gpu-")));
  EXPECT_EQ(r.Current().list->size(), kDevices);
  EXPECT_EQ(asked.load(), 0);

  // One device changes health: nothing vanished, nobody asked.
  std::vector<v1beta1::Device> flip = Devices(kDevices, "gpu-");
  flip[3].set_health("Unhealthy");
  backend->callbacks.on_devices(DeviceList::FromDevices(flip));
  EXPECT_EQ(asked.load(), 0);
  EXPECT_EQ(r.DeviceHealth("gpu-3"), "Unhealthy");

  // Two devices vanish: the keeper is asked about exactly those two; the
  // allocated one stays listed Unhealthy, the other is dropped.
  std::vector<v1beta1::Device> fewer = Devices(kDevices, "gpu-");
  fewer.erase(fewer.begin() + 7);  // gpu-7 (allocated)
  fewer.erase(fewer.begin() + 7);  // gpu-8
  backend->callbacks.on_devices(DeviceList::FromDevices(fewer));
  EXPECT_EQ(asked.load(), 2);
  EXPECT_EQ(r.DeviceHealth("gpu-7"), "Unhealthy");
  EXPECT_FALSE(r.DeviceHealth("gpu-8").has_value());
  EXPECT_EQ(r.Current().list->size(), kDevices - 1);

  // A whole new list of 20,000: asked once per vanished device, no more.
  asked = 0;
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(kDevices, "uuid-")));
  EXPECT_EQ(asked.load(), kDevices - 1);
  EXPECT_TRUE(r.HasDevice("uuid-19999"));
  EXPECT_TRUE(r.HasDevice("gpu-7"));  // still held by an allocation
  r.Shutdown();
}

// Issues 7.16 and 7.19: the state keeper (which may be waiting on the
// disk) is never asked under the lock Allocate's device checks need.
TEST(ResourceTest, AllocateChecksNeverWaitForTheStateKeeper) {
  EventLog events("test");
  absl::Notification in_keeper, release_keeper;
  ResourceHooks hooks;
  hooks.is_allocated = [&](const std::string&) {
    if (!in_keeper.HasBeenNotified()) in_keeper.Notify();
    release_keeper.WaitForNotification();  // a keeper stuck on fdatasync
    return false;
  };
  Resource r("vendor.com/gpu", ResourcePolicy(), &events, hooks);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(4, "gpu-")));
  std::thread update([&] { backend->callbacks.on_devices(DeviceList::FromDevices(Devices(2, "gpu-"))); });  // two vanish
  ASSERT_TRUE(in_keeper.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::Notification answered;
  std::optional<std::string> health;
  std::thread check([&] {
    health = r.DeviceHealth("gpu-0");  // what Allocate asks
    answered.Notify();
  });
  const bool ok = answered.WaitForNotificationWithTimeout(absl::Seconds(10));
  release_keeper.Notify();
  check.join();
  update.join();
  EXPECT_TRUE(ok) << "an Allocate check waited for the state keeper";
  EXPECT_EQ(health, "Healthy");
  EXPECT_EQ(r.Current().list->size(), 2);
  r.Shutdown();
}

TEST(ResourceTest, DevicesShownUnhealthyStaySoUntilLifted) {
  EventLog events("test");
  Resource r("vendor.com/gpu", ResourcePolicy(), &events);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(4, "gpu-")));
  r.SetShownUnhealthy({"gpu-1"});
  EXPECT_EQ(r.DeviceHealth("gpu-1"), "Unhealthy");
  EXPECT_EQ(r.DeviceHealth("gpu-0"), "Healthy");
  // A new list from the backend does not undo it.
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(4, "gpu-")));
  EXPECT_EQ(r.DeviceHealth("gpu-1"), "Unhealthy");
  // The state file keeps the backend's health, not the override's.
  for (const auto& d : r.ReportedDevices()->ToDevices()) {
    EXPECT_EQ(d.health(), "Healthy") << d.id();
  }
  r.SetShownUnhealthy({});
  EXPECT_EQ(r.DeviceHealth("gpu-1"), "Healthy");
  r.Shutdown();
}


// An ID listed more than once is one device, at its first place, Healthy
// if any entry is (the kubelet's healthy set holds it then), with the last
// entry's topology (the kubelet's map keeps the last); the count is told once.
TEST(ResourceTest, DuplicateIdsCollapseHealthyIfAnyEntryIs) {
  EventLog events("test");
  Resource r("vendor.com/kvm", ResourcePolicy(), &events);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  std::vector<v1beta1::Device> list = Devices(3, "d-");  // d-0 d-1 d-2, Healthy
  v1beta1::Device again = list[0];
  again.set_health("Unhealthy");
  again.mutable_topology()->add_nodes()->set_id(1);
  list.push_back(again);  // d-0 again, Unhealthy, on node 1
  v1beta1::Device sick = list[1];
  sick.set_health("Unhealthy");
  list[1] = sick;
  list.push_back(sick);  // d-1 twice, both Unhealthy
  backend->callbacks.on_devices(DeviceList::FromDevices(list));
  const std::vector<v1beta1::Device> shown = r.Current().list->ToDevices();
  ASSERT_EQ(shown.size(), 3u);
  EXPECT_EQ(shown[0].id(), "d-0");
  EXPECT_EQ(shown[0].health(), "Healthy");
  ASSERT_EQ(shown[0].topology().nodes_size(), 1);
  EXPECT_EQ(shown[0].topology().nodes(0).id(), 1);
  EXPECT_EQ(shown[1].id(), "d-1");
  EXPECT_EQ(shown[1].health(), "Unhealthy");
  EXPECT_EQ(shown[2].id(), "d-2");
  EXPECT_TRUE(r.list_refused().empty());
  EXPECT_TRUE(events.WaitForEvent("device_ids_collapsed", {{"entries", 2}, {"devices", 3}},
                                  absl::ZeroDuration()));
  // The same list again is not told again.
  backend->callbacks.on_devices(DeviceList::FromDevices(list));
  int told = 0;
  for (const auto& e : events.Snapshot()) told += e.contains("event") && e["event"] == "device_ids_collapsed";
  EXPECT_EQ(told, 1);
  r.Shutdown();
}

// A resource served both ways: what each path holds is hidden from the
// other side only. The device-plugin side streams claim-held devices as
// Unhealthy, the DRA side leaves pod-held ones out of its pool, and the
// real list (what Allocate checks) keeps every device's own health.
TEST(ResourceTest, DevicesHeldOnOnePathAreHiddenFromTheOtherSideOnly) {
  EventLog events("test");
  Resource r("vendor.com/gpu", ResourcePolicy(), &events);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(4, "gpu-")));
  std::vector<Resource::Snapshot> published;
  const uint64_t watcher =
      r.AddWatcher([&](const Resource::Snapshot& s) { published.push_back(s); });
  auto health = [](const DeviceList& list) {
    std::map<std::string, std::string> out;
    for (const auto& d : list.ToDevices()) out[d.id()] = d.health();
    return out;
  };
  r.SetHeldAcrossPaths({"gpu-1"}, {}, {"gpu-2"});
  ASSERT_EQ(published.size(), 1u);
  const Resource::Snapshot s = r.Current();
  EXPECT_EQ(health(*s.list), (std::map<std::string, std::string>{{"gpu-0", "Healthy"},
                                                                   {"gpu-1", "Healthy"},
                                                                   {"gpu-2", "Healthy"},
                                                                   {"gpu-3", "Healthy"}}));
  EXPECT_EQ(health(*s.to_device_plugins),
            (std::map<std::string, std::string>{{"gpu-0", "Healthy"},
                                                {"gpu-1", "Unhealthy"},
                                                {"gpu-2", "Healthy"},
                                                {"gpu-3", "Healthy"}}));
  EXPECT_EQ(*s.left_out_of_pool, (std::set<std::string>{"gpu-2"}));
  EXPECT_EQ(r.DeviceHealth("gpu-1"), "Healthy");
  // The same again publishes nothing; a new list from the plugin keeps it.
  r.SetHeldAcrossPaths({"gpu-1"}, {}, {"gpu-2"});
  EXPECT_EQ(published.size(), 1u);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(4, "gpu-")));
  EXPECT_EQ(health(*r.Current().to_device_plugins)["gpu-1"], "Unhealthy");
  // Released: the device-plugin side streams the list itself again.
  r.SetHeldAcrossPaths({}, {}, {});
  EXPECT_EQ(r.Current().to_device_plugins, r.Current().list);
  EXPECT_TRUE(r.Current().left_out_of_pool->empty());
  // A claim the scheduler made for a pod of the extended resource: the
  // scheduler counts that pod's request itself, so its device keeps its
  // health toward the kubelet, and answers steer around it instead.
  r.SetForgotten({{"gpu-3", "default/old/main"}});
  r.SetHeldAcrossPaths({"gpu-0", "gpu-1"}, {"gpu-1"}, {});
  EXPECT_EQ(health(*r.Current().to_device_plugins),
            (std::map<std::string, std::string>{{"gpu-0", "Unhealthy"},
                                                {"gpu-1", "Healthy"},
                                                {"gpu-2", "Healthy"},
                                                {"gpu-3", "Healthy"}}));
  std::shared_ptr<const Resource::Forgotten> steer = r.steer_around();
  EXPECT_EQ(steer->size(), 2u);
  EXPECT_EQ(steer->count("gpu-1"), 1u);
  EXPECT_EQ(steer->at("gpu-3"), "default/old/main");
  EXPECT_EQ(r.forgotten()->size(), 1u);
  r.SetHeldAcrossPaths({}, {}, {});
  EXPECT_EQ(*r.steer_around(), *r.forgotten());
  r.RemoveWatcher(watcher);
  r.Shutdown();
}

// A list larger than the kubelet accepts in one message, whose devices pods
// hold under their IDs (so compact IDs, which would rename them, stay off),
// is reported when it appears and when it fits again; the list itself is
// kept whole (a smaller one may follow, and the state keeps what the plugin
// said).
TEST(ResourceTest, AListTooLargeForTheKubeletIsReported) {
  EventLog events("test");
  ResourceHooks hooks;
  hooks.is_allocated = [](const std::string& id) { return absl::EndsWith(id, "-slice-3"); };
  Resource r("vendor.com/gpu", ResourcePolicy(), &events, hooks);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  // UUID-named MIG slices: ~60 bytes each on the wire.
  const std::string prefix = "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-";
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(1000, prefix)));
  EXPECT_LT(r.Current().list->bytes(), Resource::kKubeletMaxListBytes);
  EXPECT_FALSE(events.WaitForEvent("device_list_too_large", {}, absl::ZeroDuration()));
  constexpr int kMany = 100000;
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(kMany, prefix)));
  const Resource::Snapshot big = r.Current();
  EXPECT_EQ(big.list->size(), kMany);
  EXPECT_EQ(big.list->bytes(), big.list->ToMessage().ByteSizeLong());
  EXPECT_GT(big.list->bytes(), Resource::kKubeletMaxListBytes);
  std::optional<Json> e = events.WaitForEvent("device_list_too_large",
                                              {{"resource", "vendor.com/gpu"}, {"devices", kMany}},
                                              absl::Seconds(1));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)["bytes"].get<size_t>(), big.list->bytes());
  EXPECT_EQ((*e)["limit"].get<size_t>(), Resource::kKubeletMaxListBytes);
  // Reported once, not on every list while it stays too large.
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(kMany + 1, prefix)));
  const auto counts = events.Counts();
  EXPECT_EQ(counts.at(std::make_pair(std::string("device_list_too_large"),
                                     std::string("vendor.com/gpu"))),
            1);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(1000, prefix)));
  EXPECT_TRUE(events.WaitForEvent("device_list_fits", {{"resource", "vendor.com/gpu"}},
                                  absl::Seconds(1)));
  EXPECT_FALSE(events.WaitForEvent("compact_ids_on", {}, absl::ZeroDuration()));
}

// The same list when no pod holds its devices (the kubelet never saw
// them): compact IDs go on by themselves, the list fits, and every ID maps
// back to the plugin's.
TEST(ResourceTest, AListTooLargeThatNoPodHoldsGetsCompactIdsByItself) {
  EventLog events("test");
  Resource r("vendor.com/gpu", ResourcePolicy(), &events);
  auto backend = StreamOnlyBackend();
  r.AttachBackend(backend);
  const std::string prefix = "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-";
  constexpr int kMany = 100000;
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(kMany, prefix)));
  const Resource::Snapshot snap = r.Current();
  EXPECT_EQ(snap.list->size(), kMany);
  EXPECT_LT(snap.list->bytes(), Resource::kKubeletMaxListBytes);
  EXPECT_TRUE(events.WaitForEvent("compact_ids_on", {{"resource", "vendor.com/gpu"},
                                                     {"devices", kMany}},
                                  absl::ZeroDuration()));
  EXPECT_FALSE(events.WaitForEvent("device_list_too_large", {}, absl::ZeroDuration()));
  const std::string compact = CompactDeviceId(prefix + "42");
  EXPECT_TRUE(r.HasDevice(compact));
  EXPECT_EQ(r.ToBackendId(compact), prefix + "42");
  EXPECT_TRUE(r.maps_ids());
  // For good: a later list that would fit keeps the IDs the kubelet knows.
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(10, prefix)));
  EXPECT_TRUE(r.HasDevice(CompactDeviceId(prefix + "3")));
  r.Shutdown();
}

// Long IDs (sliced GPUs) can make a list too large for the kubelet. With
// compact IDs it fits, every ID maps back to the backend's exactly, and the
// same devices get the same IDs in another run (nothing to persist).
TEST(ResourceTest, CompactIdsFitTheKubeletAndMapBackExactly) {
  constexpr int kDevices = 100000;
  auto uuid_devices = [] {
    std::vector<v1beta1::Device> out = Devices(kDevices, "");
    for (auto& d : out) {
      d.set_id(absl::StrCat("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-", d.id()));
    }
    return out;
  };
  EventLog events("test");
  ResourcePolicy plain_policy;
  // Pods hold its devices: compact IDs do not go on by themselves.
  ResourceHooks holding;
  holding.is_allocated = [](const std::string&) { return true; };
  Resource plain("vendor.com/gpu", plain_policy, &events, holding);
  auto b1 = StreamOnlyBackend();
  plain.AttachBackend(b1);
  b1->callbacks.on_devices(DeviceList::FromDevices(uuid_devices()));
  EXPECT_GT(plain.Current().list->bytes(), Resource::kKubeletMaxListBytes);

  ResourcePolicy policy;
  policy.compact_ids = true;
  policy.id_map = {{"MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-7", "seven"}};
  auto shown = [&] {
    Resource r("vendor.com/gpu", policy, &events);
    auto b = StreamOnlyBackend();
    r.AttachBackend(b);
    b->callbacks.on_devices(DeviceList::FromDevices(uuid_devices()));
    const Resource::Snapshot snap = r.Current();
    EXPECT_LT(snap.list->bytes(), Resource::kKubeletMaxListBytes);
    std::vector<std::string> ids;
    std::set<std::string> unique;
    for (const auto& d : snap.list->ToDevices()) {
      ids.push_back(d.id());
      unique.insert(d.id());
      const std::string backend = r.ToBackendId(d.id());
      EXPECT_EQ(r.ToKubeletId(backend), d.id());
    }
    EXPECT_EQ(unique.size(), static_cast<size_t>(kDevices));
    EXPECT_EQ(r.ToBackendId("seven"), "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-7");
    const std::string compact = CompactDeviceId("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-8");
    EXPECT_EQ(compact.size(), 14u);
    EXPECT_TRUE(r.HasDevice(compact));
    EXPECT_EQ(r.ToBackendId(compact), "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-8");
    EXPECT_EQ(r.ToBackendId("no-such-device"), "no-such-device");  // passes through
    r.Shutdown();
    return ids;
  };
  const std::vector<std::string> first = shown();
  EXPECT_EQ(shown(), first);  // another run: the same IDs
  EXPECT_EQ(first[7], "seven");  // the ID map wins
  plain.Shutdown();
}

// A plugin restart or swap: the new backend serves, the old one is stopped
// exactly once, and a list or an end the old stream still delivers changes
// nothing (the kubelet never sees the old plugin's devices again).
TEST(ResourceTest, AReplacedBackendIsStoppedOnceAndHeardNoMore) {
  EventLog events("test");
  Resource r("vendor.com/gpu", ResourcePolicy(), &events, ResourceHooks());
  auto old_backend = std::make_shared<MockBackend>("vendor.com/gpu", "/run/old.sock");
  EXPECT_CALL(*old_backend, Start(_)).WillOnce(SaveArg<0>(&old_backend->callbacks));
  r.AttachBackend(old_backend);
  old_backend->callbacks.on_devices(DeviceList::FromDevices(Devices(2, "old-")));
  ASSERT_EQ(r.Current().list->size(), 2);

  auto new_backend = StreamOnlyBackend("/run/new.sock");
  new_backend->plugin_options.set_pre_start_required(true);
  EXPECT_CALL(*old_backend, Stop()).Times(1);
  EXPECT_TRUE(r.AttachBackend(new_backend));  // the options changed
  ::testing::Mock::VerifyAndClearExpectations(old_backend.get());
  new_backend->callbacks.on_devices(DeviceList::FromDevices(Devices(3, "new-")));
  EXPECT_EQ(r.Current().list->size(), 3);

  old_backend->callbacks.on_devices(DeviceList::FromDevices(Devices(5, "late-")));
  old_backend->callbacks.on_lost("the old plugin exited");
  EXPECT_EQ(r.Current().list->size(), 3);
  EXPECT_FALSE(r.HasDevice("late-0"));
  EXPECT_TRUE(r.backend_connected());
  EXPECT_EQ(r.last_backend().endpoint, "/run/new.sock");
  EXPECT_TRUE(r.options().pre_start_required());
  r.Shutdown();
}

}  // namespace
}  // namespace dpproxy

namespace dpproxy {
namespace {

// A call that finds no backend waits for one to connect (dpproxy and its
// plugin restarting together), and gives up after its limit.
// A held call goes on once a backend is connected and has sent its first
// device list: a kubelet never calls before a connection's first list, and
// plugins that learn their devices in ListAndWatch rely on that.
TEST(ResourceTest, WaitForBackendWaitsForOneToConnectAndList) {
  EventLog events("test");
  Resource r("vendor.com/gpu", ResourcePolicy(), &events);
  EXPECT_EQ(r.WaitForBackend(absl::Milliseconds(20)), nullptr);
  auto backend = StreamOnlyBackend();
  absl::Notification waiting;
  std::shared_ptr<Backend> got;
  std::thread caller([&] {
    waiting.Notify();
    got = r.WaitForBackend(absl::Seconds(30));
  });
  waiting.WaitForNotification();
  r.AttachBackend(backend);
  EXPECT_EQ(r.backend(), nullptr) << "connected, but no device list yet";
  EXPECT_EQ(r.attached_backend(), backend);
  backend->callbacks.on_devices(DeviceList::FromDevices(Devices(2, "gpu-")));
  caller.join();
  EXPECT_EQ(got, backend);
  EXPECT_EQ(r.WaitForBackend(absl::ZeroDuration()), backend);
  r.Shutdown();
}

}  // namespace
}  // namespace dpproxy
