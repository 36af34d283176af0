#include "proxy/holders/held_elsewhere.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Key;
using ::testing::Pair;

state::Allocation* Add(state::State* st, uint64_t id, const std::string& resource,
                       std::vector<std::string> ids, const std::string& backend_resource = "",
                       std::vector<std::string> backend_ids = {}) {
  state::Allocation* a = st->add_allocations();
  a->set_id(id);
  a->set_resource(resource);
  for (const auto& d : ids) a->add_device_ids(d);
  a->set_backend_resource(backend_resource);
  for (const auto& d : backend_ids) a->add_backend_device_ids(d);
  return a;
}

ServedAs Same(const std::string& name) {
  return ServedAs{name, [](const std::string& id) { return id; }};
}

TEST(HeldElsewhereTest, AllocationsUnderTheNameAndIdsShownNowAreNotElsewhere) {
  state::State st;
  Add(&st, 1, "vendor.com/gpu", {"gpu-0"}, "vendor.com/gpu");
  Add(&st, 2, "vendor.com/gpu", {"gpu-1"});  // an older record: no plugin name
  EXPECT_THAT(DevicesHeldElsewhere(st, {{"vendor.com/gpu", Same("vendor.com/gpu")}},
                                   {{"vendor.com/gpu", "vendor.com/gpu"}}),
              IsEmpty());
}

TEST(HeldElsewhereTest, ARenamedResourceShowsTheDevicesHeldUnderItsOldName) {
  state::State st;
  state::Allocation* a = Add(&st, 7, "legacy.com/gpu", {"gpu-0"}, "legacy.com/gpu");
  a->set_pod_namespace("ns");
  a->set_pod_name("train");
  Add(&st, 8, "vendor.com/gpu", {"gpu-1"}, "legacy.com/gpu");  // made after the rename
  // No ID function: the plugin's IDs are shown as they are.
  const auto held =
      DevicesHeldElsewhere(st, {{"legacy.com/gpu", ServedAs{"vendor.com/gpu", nullptr}}}, {});
  ASSERT_THAT(held, ElementsAre(Key("vendor.com/gpu")));
  ASSERT_THAT(held.at("vendor.com/gpu"), ElementsAre(Key("gpu-0")));
  const HeldElsewhere& h = held.at("vendor.com/gpu").at("gpu-0");
  EXPECT_EQ(h.allocation, 7u);
  EXPECT_EQ(h.held_as_resource, "legacy.com/gpu");
  EXPECT_EQ(h.held_as_device, "gpu-0");
  EXPECT_EQ(h.pod, "ns/train");
}

TEST(HeldElsewhereTest, OlderRecordsTakeTheirPluginFromTheSavedBackend) {
  state::State st;
  Add(&st, 1, "legacy.com/gpu", {"gpu-0"});
  EXPECT_THAT(DevicesHeldElsewhere(st, {{"legacy.com/gpu", Same("vendor.com/gpu")}},
                                   {{"legacy.com/gpu", "legacy.com/gpu"}}),
              ElementsAre(Pair("vendor.com/gpu", ElementsAre(Key("gpu-0")))));
  // Nothing says which plugin an older record came from: not guessed.
  EXPECT_THAT(DevicesHeldElsewhere(st, {{"legacy.com/gpu", Same("vendor.com/gpu")}}, {}),
              IsEmpty());
}

TEST(HeldElsewhereTest, AChangedIdMapShowsTheDeviceUnderItsNewIdAsHeld) {
  state::State st;
  // Allocated while the kubelet knew GPU-uuid-0 as "0".
  Add(&st, 3, "vendor.com/gpu", {"0"}, "vendor.com/gpu", {"GPU-uuid-0"});
  // Allocated with no map: the plugin's ID was the kubelet's.
  Add(&st, 4, "vendor.com/gpu", {"GPU-uuid-1"}, "vendor.com/gpu");
  ServedAs compact{"vendor.com/gpu", [](const std::string& id) { return "c-" + id; }};
  const auto held = DevicesHeldElsewhere(st, {{"vendor.com/gpu", compact}}, {});
  ASSERT_THAT(held.at("vendor.com/gpu"),
              ElementsAre(Key("c-GPU-uuid-0"), Key("c-GPU-uuid-1")));
  EXPECT_EQ(held.at("vendor.com/gpu").at("c-GPU-uuid-0").held_as_device, "0");
  // The map that made them is still the one in use: nothing elsewhere.
  ServedAs mapped{"vendor.com/gpu", [](const std::string& id) {
                    return id == "GPU-uuid-0" ? std::string("0") : id;
                  }};
  EXPECT_THAT(DevicesHeldElsewhere(st, {{"vendor.com/gpu", mapped}}, {}), IsEmpty());
}

TEST(HeldElsewhereTest, APluginResourceNotServedNowShowsNothing) {
  state::State st;
  Add(&st, 1, "legacy.com/gpu", {"gpu-0"}, "legacy.com/gpu");
  EXPECT_THAT(DevicesHeldElsewhere(st, {{"other.com/fpga", Same("other.com/fpga")}}, {}),
              IsEmpty());
}

}  // namespace
}  // namespace dpproxy
