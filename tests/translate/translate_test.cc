// One test per row of docs/translation.md, for the pure conversions. The
// rows that need a live backend or kubelet (fan-out, PreStart after
// Allocate, negotiation) are tested end to end in tests/proxy.
#include "proxy/translate/translate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

v1beta1::ContainerAllocateResponse FullResponse() {
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_envs())["A"] = "1";
  auto* m = r.add_mounts();
  m->set_container_path("/c");
  m->set_host_path("/h");
  m->set_read_only(true);
  auto* d = r.add_devices();
  d->set_container_path("/dev/c");
  d->set_host_path("/dev/h");
  d->set_permissions("rw");
  (*r.mutable_annotations())["k"] = "v";
  (*r.mutable_annotations())["k2"] = "v2";
  r.add_cdi_devices()->set_name("vendor.com/gpu=0");
  return r;
}

// Row: Allocate with N container requests -> one v1alpha Allocate each.
TEST(TranslateTest, ContainerRequestBecomesOneV1AlphaRequest) {
  v1beta1::ContainerAllocateRequest c;
  c.add_devices_ids("a");
  c.add_devices_ids("b");
  EXPECT_THAT(ToV1AlphaAllocate(c).devicesids(), ElementsAre("a", "b"));
}

// Row: a v1alpha kubelet's Allocate is one container request.
TEST(TranslateTest, V1AlphaKubeletAllocateIsOneContainerRequest) {
  deviceplugin::AllocateRequest r;
  r.add_devicesids("x");
  v1beta1::AllocateRequest b = FromV1AlphaAllocate(r);
  ASSERT_EQ(b.container_requests_size(), 1);
  EXPECT_THAT(b.container_requests(0).devices_ids(), ElementsAre("x"));
}

// Row: v1alpha responses carry envs, mounts, devices (and annotations of
// later v1alpha protos) unchanged.
TEST(TranslateTest, V1AlphaResponseKeepsEverythingItHas) {
  deviceplugin::AllocateResponse a;
  (*a.mutable_envs())["A"] = "1";
  auto* m = a.add_mounts();
  m->set_container_path("/c");
  m->set_host_path("/h");
  m->set_read_only(true);
  auto* d = a.add_devices();
  d->set_container_path("/dev/c");
  d->set_host_path("/dev/h");
  d->set_permissions("r");
  (*a.mutable_annotations())["k"] = "v";
  v1beta1::ContainerAllocateResponse b = FromV1AlphaResponse(a);
  EXPECT_EQ(b.envs().at("A"), "1");
  ASSERT_EQ(b.mounts_size(), 1);
  EXPECT_EQ(b.mounts(0).host_path(), "/h");
  EXPECT_TRUE(b.mounts(0).read_only());
  ASSERT_EQ(b.devices_size(), 1);
  EXPECT_EQ(b.devices(0).permissions(), "r");
  EXPECT_EQ(b.annotations().at("k"), "v");
  EXPECT_EQ(b.cdi_devices_size(), 0);
}

// Rows: annotations and cdi_devices toward a 1.9 kubelet are dropped and
// counted; everything else is carried.
TEST(TranslateTest, TowardV1AlphaKubeletAnnotationsAndCdiAreDroppedAndCounted) {
  Loss loss;
  deviceplugin::AllocateResponse a = ToV1AlphaResponse(FullResponse(), &loss);
  EXPECT_EQ(a.envs().at("A"), "1");
  EXPECT_EQ(a.mounts(0).container_path(), "/c");
  EXPECT_EQ(a.devices(0).host_path(), "/dev/h");
  EXPECT_TRUE(a.annotations().empty());
  EXPECT_EQ(loss.annotations, 2);
  EXPECT_EQ(loss.cdi_devices, 1);
  // No unknown fields smuggled through either.
  std::string bytes;
  a.SerializeToString(&bytes);
  deviceplugin::AllocateResponse back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_TRUE(back.GetReflection()->GetUnknownFields(back).empty());
}

// Row: Device.topology toward a v1alpha kubelet is dropped and counted.
TEST(TranslateTest, TopologyDroppedTowardV1Alpha) {
  v1beta1::ListAndWatchResponse l;
  auto* d = l.add_devices();
  d->set_id("g0");
  d->set_health("Healthy");
  d->mutable_topology()->add_nodes()->set_id(1);
  auto* e = l.add_devices();
  e->set_id("g1");
  e->set_health("Unhealthy");
  Loss loss;
  deviceplugin::ListAndWatchResponse a = ToV1AlphaList(l, &loss);
  ASSERT_EQ(a.devices_size(), 2);
  EXPECT_EQ(a.devices(0).id(), "g0");
  EXPECT_EQ(a.devices(1).health(), "Unhealthy");
  EXPECT_EQ(loss.topology, 1);
}

// Row: devices from a v1alpha backend have no topology: read from the
// stream's bytes without it (DeviceListFromWireTest.V1AlphaReadingDropsTopology).

// Rows: GetDevicePluginOptions for a v1alpha backend is answered by the
// proxy: no PreStart, no preferred allocation. What the kubelet is told is
// checked through the proxy on every kubelet generation, beside a v1beta1
// plugin that asks for both (MatrixTest.PreStartContainer and
// MatrixTest.GetPreferredAllocation).

TEST(LossCounterTest, FirstLossPerKindAndResourceIsReportedOnce) {
  LossCounter c;
  Loss l;
  l.annotations = 2;
  l.cdi_devices = 1;
  EXPECT_THAT(c.Add("a.com/x", l), UnorderedElementsAre("annotations", "cdi_devices"));
  EXPECT_THAT(c.Add("a.com/x", l), ::testing::IsEmpty());
  EXPECT_THAT(c.Add("b.com/y", l), UnorderedElementsAre("annotations", "cdi_devices"));
  EXPECT_EQ(c.Count("a.com/x", "annotations"), 4);
  EXPECT_EQ(c.Count("a.com/x", "topology"), 0);
  EXPECT_THAT(c.Add("a.com/x", Loss()), ::testing::IsEmpty());
}

}  // namespace
}  // namespace dpproxy
