#include "proxy/kubelet_side/dra/resource_slices.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/kubelet_side/dra/device_names.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

PoolSpec Pool() {
  PoolSpec p;
  p.driver = "gpu.vendor.com";
  p.node = "node-1";
  p.resource = "vendor.com/gpu";
  p.generation = 7;
  return p;
}

TEST(ResourceSlicesTest, APoolOfHealthyDevicesWithIdsAndNumaNodes) {
  std::vector<SliceDevice> devices = {
      {"gpu-0", true, {0}},
      {"GPU-6f3a9c1e", true, {1}},
      {"gpu-2", false, {1}},  // unhealthy: not published
      {"gpu-3", true, {}},
  };
  absl::StatusOr<std::vector<Json>> slices = BuildResourceSlices(Pool(), devices);
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 1u);
  const Json& s = (*slices)[0];
  EXPECT_EQ(s["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(s["kind"], "ResourceSlice");
  EXPECT_EQ(s["spec"]["driver"], "gpu.vendor.com");
  EXPECT_EQ(s["spec"]["nodeName"], "node-1");
  EXPECT_EQ(s["spec"]["pool"],
            Json({{"name", "node-1/vendor.com-gpu"}, {"generation", 7}, {"resourceSliceCount", 1}}));
  const Json& d = s["spec"]["devices"];
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], Json::parse(R"({"name":"gpu-0","attributes":{
      "deviceID":{"string":"gpu-0"},"resource.kubernetes.io/numaNode":{"int":0}}})"));
  EXPECT_EQ(d[1]["name"], DraDeviceName("GPU-6f3a9c1e"));  // not a DNS label: hashed
  EXPECT_EQ(d[1]["attributes"]["deviceID"]["string"], "GPU-6f3a9c1e");  // the ID kept
  EXPECT_EQ(d[2]["name"], "gpu-3");
  EXPECT_FALSE(d[2]["attributes"].contains(kNumaNodeAttribute));  // no topology: none
  // An Unhealthy device is left out, never published with a device taint
  // (docs/dra.md, "Device taints"): no device carries one.
  for (const Json& dev : d) EXPECT_FALSE(dev.contains("taints")) << dev.dump();
  const std::string name = s["metadata"]["name"];
  EXPECT_TRUE(absl::StartsWith(name, "node-1-gpu.vendor.com-")) << name;
  EXPECT_TRUE(absl::EndsWith(name, "-0")) << name;
  EXPECT_LE(name.size(), 253u);
}

TEST(ResourceSlicesTest, LargePoolsAreSplitIntoSlicesOf128WithOneGenerationAndCount) {
  std::vector<SliceDevice> devices;
  for (int i = 0; i < 300; ++i) devices.push_back({absl::StrCat("gpu-", i), true, {}});
  absl::StatusOr<std::vector<Json>> slices = BuildResourceSlices(Pool(), devices);
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 3u);
  std::set<std::string> names, device_names;
  for (const Json& s : *slices) {
    EXPECT_EQ(s["spec"]["pool"]["generation"], 7);
    EXPECT_EQ(s["spec"]["pool"]["resourceSliceCount"], 3);
    EXPECT_LE(s["spec"]["devices"].size(), 128u);
    names.insert(s["metadata"]["name"].get<std::string>());
    for (const Json& d : s["spec"]["devices"]) device_names.insert(d["name"]);
  }
  EXPECT_EQ(names.size(), 3u);            // distinct objects
  EXPECT_EQ(device_names.size(), 300u);  // every device once
  EXPECT_EQ((*slices)[2]["spec"]["devices"].size(), 300u - 256u);
  // The same input: the same objects (a re-publish updates, never duplicates).
  EXPECT_EQ(*BuildResourceSlices(Pool(), devices), *slices);
}

TEST(ResourceSlicesTest, NoHealthyDeviceStillPublishesTheEmptyPool) {
  absl::StatusOr<std::vector<Json>> slices =
      BuildResourceSlices(Pool(), {{"gpu-0", false, {}}});
  ASSERT_TRUE(slices.ok());
  ASSERT_EQ(slices->size(), 1u);
  EXPECT_TRUE((*slices)[0]["spec"]["devices"].empty());
  EXPECT_EQ((*slices)[0]["spec"]["pool"]["resourceSliceCount"], 1);
}

TEST(ResourceSlicesTest, V1Beta1PutsAttributesUnderBasicAndUnknownVersionsAreRefused) {
  PoolSpec p = Pool();
  p.api_version = "resource.k8s.io/v1beta1";
  absl::StatusOr<std::vector<Json>> slices = BuildResourceSlices(p, {{"gpu-0", true, {0}}});
  ASSERT_TRUE(slices.ok());
  const Json& d = (*slices)[0]["spec"]["devices"][0];
  EXPECT_FALSE(d.contains("attributes"));
  EXPECT_EQ(d["basic"]["attributes"]["deviceID"]["string"], "gpu-0");
  p.api_version = "resource.k8s.io/v1alpha3";
  absl::StatusOr<std::vector<Json>> old = BuildResourceSlices(p, {});
  ASSERT_FALSE(old.ok());
  EXPECT_THAT(std::string(old.status().message()), HasSubstr("v1alpha3"));
}

TEST(ResourceSlicesTest, TwoIdsWithOneNameAreRefused) {
  const std::string hashed = DraDeviceName("GPU-X");
  absl::StatusOr<std::vector<Json>> slices =
      BuildResourceSlices(Pool(), {{"GPU-X", true, {}}, {hashed, true, {}}});
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dpproxy
