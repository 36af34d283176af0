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
        const std::string group = rule["apiGroups"][0].as<std::string>();
        ASSERT_TRUE(group == "resource.k8s.io" || group == "") << group;
        for (const YAML::Node& r : rule["resources"]) {
          const std::string name = group.empty() ? r.as<std::string>()
                                                 : r.as<std::string>() + "." + group;
          for (const YAML::Node& v : rule["verbs"]) verbs[name].insert(v.as<std::string>());
        }
      }
    }
    if (kind == "ClusterRoleBinding") {
      bound = d["roleRef"]["name"].as<std::string>() == "dpproxy-dra" &&
              d["subjects"][0]["name"].as<std::string>() == "dpproxy";
    }
  }
  EXPECT_TRUE(bound);
  EXPECT_TRUE(verbs["resourceclaims.resource.k8s.io"].count("get"));  // ClaimPreparer
  for (const char* v : {"list", "create", "update", "delete"}) {  // SlicePublisher
    EXPECT_TRUE(verbs["resourceslices.resource.k8s.io"].count(v)) << v;
  }
  // DraSide: the kubelet's release, from the node's status; MoveFence: the
  // node's taint while a resource moves to DRA (read, then updated).
  EXPECT_TRUE(verbs["nodes"].count("get"));
  EXPECT_TRUE(verbs["nodes"].count("update"));
  // Nothing else: no other object, and the node is never patched, listed
  // or deleted.
  EXPECT_EQ(verbs.size(), 3u);
  EXPECT_EQ(verbs["nodes"].size(), 2u);
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
