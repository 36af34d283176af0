// The DRA manifests in deploy/ against what the code does: the RBAC grants
// every verb SlicePublisher and ClaimPreparer use, and the example
// DeviceClass selects a driver's devices and names the extended resource.
#include <set>

#include <yaml-cpp/yaml.h>

#include "gtest/gtest.h"
#include "tests/testing/process.h"

namespace dpproxy {
namespace {

std::vector<YAML::Node> Documents(const std::string& file) {
  return YAML::LoadAllFromFile(testing::Runfile(file));
}

TEST(DeployManifestsTest, RbacGrantsWhatDraModeDoes) {
  std::map<std::string, std::set<std::string>> verbs;  // resource -> verbs
  bool bound = false;
  for (const YAML::Node& d : Documents("deploy/dra-rbac.yaml")) {
    const std::string kind = d["kind"].as<std::string>();
    if (kind == "ClusterRole") {
      for (const YAML::Node& rule : d["rules"]) {
        ASSERT_EQ(rule["apiGroups"][0].as<std::string>(), "resource.k8s.io");
        for (const YAML::Node& r : rule["resources"]) {
          for (const YAML::Node& v : rule["verbs"]) verbs[r.as<std::string>()].insert(v.as<std::string>());
        }
      }
    }
    if (kind == "ClusterRoleBinding") {
      bound = d["roleRef"]["name"].as<std::string>() == "dpproxy-dra" &&
              d["subjects"][0]["name"].as<std::string>() == "dpproxy";
    }
  }
  EXPECT_TRUE(bound);
  EXPECT_TRUE(verbs["resourceclaims"].count("get"));  // ClaimPreparer
  for (const char* v : {"list", "create", "update", "delete"}) {  // SlicePublisher
    EXPECT_TRUE(verbs["resourceslices"].count(v)) << v;
  }
}

TEST(DeployManifestsTest, TheDeviceClassSelectsTheDriverAndServesTheExtendedResource) {
  const std::vector<YAML::Node> docs = Documents("deploy/dra-deviceclass.yaml");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0]["apiVersion"].as<std::string>(), "resource.k8s.io/v1");
  EXPECT_EQ(docs[0]["kind"].as<std::string>(), "DeviceClass");
  EXPECT_EQ(docs[0]["spec"]["selectors"][0]["cel"]["expression"].as<std::string>(),
            "device.driver == \"gpu.vendor.com\"");
  EXPECT_EQ(docs[0]["spec"]["extendedResourceName"].as<std::string>(), "vendor.com/gpu");
}

}  // namespace
}  // namespace dpproxy
