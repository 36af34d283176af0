#include "proxy/kubelet_side/dra/device_names.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/kubelet_rules/kubelet_rules.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

TEST(DeviceNamesTest, DnsLabelsAreCheckedAsKubernetesDoes) {
  for (const std::string& ok :
       std::vector<std::string>{"gpu-0", "a", "0", "dev-3b-00-0", std::string(63, 'a')}) {
    EXPECT_TRUE(IsDnsLabel(ok)) << ok;
  }
  for (const std::string& bad :
       std::vector<std::string>{"", "GPU-0", "-gpu", "gpu-", "gpu_0", "gpu.0", "0000:3b:00.0",
                                std::string(64, 'a')}) {
    EXPECT_FALSE(IsDnsLabel(bad)) << bad;
  }
}

TEST(DeviceNamesTest, LabelsStayAndOtherIdsGetAStableHashedLabel) {
  EXPECT_EQ(DraDeviceName("gpu-0"), "gpu-0");
  const std::string uuid = "GPU-6f3a9c1e-8d2b-4c6a-9e1f-0a1b2c3d4e5f";
  const std::string name = DraDeviceName(uuid);
  EXPECT_TRUE(IsDnsLabel(name)) << name;
  EXPECT_EQ(name.size(), 14u);
  EXPECT_EQ(DraDeviceName(uuid), name);  // the same every time
  EXPECT_NE(DraDeviceName("GPU-0"), DraDeviceName("GPU-1"));
  EXPECT_TRUE(IsDnsLabel(DraDeviceName(std::string(200, 'x'))));
}

TEST(DeviceNamesTest, NamesMapBothWays) {
  absl::StatusOr<DraDeviceNames> n = DraDeviceNames::For({"gpu-0", "0000:3b:00.0", "GPU-X"});
  ASSERT_TRUE(n.ok()) << n.status();
  for (const char* id : {"gpu-0", "0000:3b:00.0", "GPU-X"}) {
    const std::string name = n->NameOf(id);
    EXPECT_TRUE(IsDnsLabel(name)) << id;
    EXPECT_EQ(n->IdOf(name), id);
  }
  EXPECT_EQ(n->NameOf("gpu-9"), "");
  EXPECT_EQ(n->IdOf("gpu-9"), "");
}

TEST(DeviceNamesTest, TwoIdsWithOneNameAreRefusedNamingBoth) {
  // An ID that is itself the hashed name of another.
  const std::string hashed = DraDeviceName("GPU-X");
  absl::StatusOr<DraDeviceNames> n = DraDeviceNames::For({"GPU-X", hashed});
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("GPU-X"));
  EXPECT_THAT(std::string(n.status().message()), HasSubstr(hashed));
  // The same ID twice is one device, not a clash.
  EXPECT_TRUE(DraDeviceNames::For({"gpu-0", "gpu-0"}).ok());
}

}  // namespace
}  // namespace dpproxy
