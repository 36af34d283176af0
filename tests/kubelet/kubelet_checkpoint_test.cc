#include "proxy/kubelet/kubelet_checkpoint.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Layout = KubeletCheckpoint::Layout;

// Made-up values in each layout a kubelet has written (the device manager's
// checkpoint, kubernetes/kubernetes pkg/kubelet/cm/devicemanager/checkpoint).
TEST(KubeletCheckpointTest, ReadsEveryLayout) {
  struct Case {
    const char* text;
    Layout layout;
  } cases[] = {
      {R"({"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main",
           "ResourceName":"vendor.com/gpu","DeviceIDs":["gpu-0","gpu-1"],"AllocResp":"Cg=="}],
           "RegisteredDevices":{"vendor.com/gpu":["gpu-0","gpu-1","gpu-2"]}})",
       Layout::kV19},
      {R"({"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main",
           "ResourceName":"vendor.com/gpu","DeviceIDs":["gpu-0","gpu-1"],"AllocResp":"Cg=="}],
           "RegisteredDevices":{"vendor.com/gpu":["gpu-0","gpu-1","gpu-2"]}},"Checksum":123})",
       Layout::kDeviceList},
      {R"({"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"main",
           "ResourceName":"vendor.com/gpu","DeviceIDs":{"-1":["gpu-0"],"1":["gpu-1"]},
           "AllocResp":"Cg=="}],"RegisteredDevices":{"vendor.com/gpu":["gpu-0","gpu-1",
           "gpu-2"]}},"Checksum":2})",
       Layout::kDevicesPerNuma},
  };
  for (const Case& c : cases) {
    absl::StatusOr<KubeletCheckpoint> k = ParseKubeletCheckpoint(c.text);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(k->layout, c.layout);
    ASSERT_EQ(k->entries.size(), 1u);
    EXPECT_EQ(k->entries[0].pod_uid, "u1");
    EXPECT_EQ(k->entries[0].container, "main");
    EXPECT_EQ(k->entries[0].resource, "vendor.com/gpu");
    EXPECT_THAT(k->entries[0].device_ids, ElementsAre("gpu-0", "gpu-1"));
    EXPECT_THAT(k->registered["vendor.com/gpu"], ElementsAre("gpu-0", "gpu-1", "gpu-2"));
  }
  // A kubelet with no pods writes null or an empty list.
  absl::StatusOr<KubeletCheckpoint> empty =
      ParseKubeletCheckpoint(R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->entries.empty());
}

TEST(KubeletCheckpointTest, DamageIsNamed) {
  for (const char* bad : {"", "{", "[]", R"({"Data":[]})", R"({"Data":{}})",
                          R"({"PodDeviceEntries":[1]})",
                          R"({"PodDeviceEntries":[{"PodUID":"u"}]})",
                          R"({"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c",
                              "ResourceName":"r","DeviceIDs":7}]})"}) {
    absl::StatusOr<KubeletCheckpoint> k = ParseKubeletCheckpoint(bad);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_THAT(std::string(k.status().message()), HasSubstr("not a kubelet")) << bad;
  }
}

}  // namespace
}  // namespace dpproxy
