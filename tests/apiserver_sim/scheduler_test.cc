// The scheduler stand-in against the API-server simulator over real HTTP:
// devices picked from the newest generation of the driver's pools, those
// in other claims skipped, a shortfall refused naming the pools with
// nothing created.
#include "tools/apiserver_sim/scheduler.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy::sim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kSlices[] = "/apis/resource.k8s.io/v1/resourceslices";

Json Slice(const std::string& name, const std::string& node, const std::string& pool,
           int64_t generation, const std::vector<std::string>& devices) {
  Json ds = Json::array();
  for (const std::string& d : devices) ds.push_back({{"name", d}});
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"driver", "gpu.vendor.com"},
            {"nodeName", node},
            {"pool", {{"name", pool}, {"generation", generation}, {"resourceSliceCount", 1}}},
            {"devices", ds}}}};
}

std::vector<std::string> Picked(const Json& claim) {
  std::vector<std::string> out;
  for (const Json& r : claim["status"]["allocation"]["devices"]["results"]) {
    out.push_back(absl::StrCat(r["pool"].get<std::string>(), "/", r["device"].get<std::string>()));
  }
  return out;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.Start().ok());
    KubeConfig c;
    c.server = api_.url();
    c.token = "t";
    client_ = *KubeClient::Create(c);
    // node-1's pool at generation 2 (a leftover slice of generation 1 with
    // a device since gone), node-2's pool, another driver's slice.
    ASSERT_TRUE(client_->Post(kSlices, Slice("a-old", "node-1", "p1", 1, {"gone"})).ok());
    ASSERT_TRUE(client_->Post(kSlices, Slice("a", "node-1", "p1", 2, {"gpu-0", "gpu-1"})).ok());
    ASSERT_TRUE(client_->Post(kSlices, Slice("b", "node-2", "p2", 1, {"gpu-0"})).ok());
    Json other = Slice("c", "node-1", "p3", 1, {"nic-0"});
    other["spec"]["driver"] = "nic.vendor.com";
    ASSERT_TRUE(client_->Post(kSlices, other).ok());
  }
  ClaimAllocation Ask(const std::string& name, int count) {
    ClaimAllocation a;
    a.name = name;
    a.driver = "gpu.vendor.com";
    a.count = count;
    return a;
  }

  ApiServerSim api_{ApiServerSim::Options{"", "", "t", {"v1"}}};
  std::unique_ptr<KubeClient> client_;
};

TEST_F(SchedulerTest, FreeDevicesOfTheNewestGenerationArePickedOnce) {
  absl::StatusOr<Json> first = CreateAllocatedClaim(client_.get(), Ask("first", 2));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Picked(*first), (std::vector<std::string>{"p1/gpu-0", "p1/gpu-1"}));
  EXPECT_FALSE((*first)["metadata"]["uid"].get<std::string>().empty());
  // The next claim gets what is left, not a device the first holds.
  absl::StatusOr<Json> second = CreateAllocatedClaim(client_.get(), Ask("second", 1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Picked(*second), (std::vector<std::string>{"p2/gpu-0"}));
  // Stored as returned: the driver reads the same allocation.
  absl::StatusOr<Json> got =
      client_->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/second");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Picked(*got), Picked(*second));
}

// A claim of several requests: each result names its own.
TEST_F(SchedulerTest, EachDeviceCanBeForARequestOfItsOwn) {
  ClaimAllocation a = Ask("two", 2);
  a.requests = {"first", "second"};
  absl::StatusOr<Json> c = CreateAllocatedClaim(client_.get(), a);
  ASSERT_TRUE(c.ok()) << c.status();
  const Json results = (*c)["status"]["allocation"]["devices"]["results"];
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["request"], "first");
  EXPECT_EQ(results[1]["request"], "second");
  a.name = "three";
  a.requests = {"only"};
  EXPECT_EQ(CreateAllocatedClaim(client_.get(), a).status().message(),
            "1 request(s) for 2 device(s)");
}

TEST_F(SchedulerTest, ANodeOrPoolNarrowsThePickAndAShortfallCreatesNothing) {
  ClaimAllocation on2 = Ask("on-2", 1);
  on2.node = "node-2";
  absl::StatusOr<Json> c = CreateAllocatedClaim(client_.get(), on2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Picked(*c), (std::vector<std::string>{"p2/gpu-0"}));
  ClaimAllocation more = Ask("more", 3);
  more.pool = "p1";
  absl::Status s = CreateAllocatedClaim(client_.get(), more).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("cannot allocate 3 device(s) of driver gpu.vendor.com"),
                    HasSubstr("2 free in pool(s) p1")));
  EXPECT_EQ(client_->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/more")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  // Devices named by the caller are taken as they are.
  ClaimAllocation named;
  named.name = "named";
  named.driver = "gpu.vendor.com";
  named.pool = "p1";
  named.devices = {"gpu-1"};
  absl::StatusOr<Json> n = CreateAllocatedClaim(client_.get(), named);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(Picked(*n), (std::vector<std::string>{"p1/gpu-1"}));
}

constexpr char kClasses[] = "/apis/resource.k8s.io/v1/deviceclasses";

Json DeviceClass(const std::string& name, const std::string& expression,
                 const std::string& extended_resource) {
  Json c = {{"metadata", {{"name", name}}},
            {"spec", {{"selectors", {{{"cel", {{"expression", expression}}}}}}}}};
  if (!extended_resource.empty()) c["spec"]["extendedResourceName"] = extended_resource;
  return c;
}

TEST_F(SchedulerTest, AnExtendedResourceGoesToTheDevicePluginWhileTheNodeHasItElseToDra) {
  // No class names it: only a device plugin can serve it.
  absl::StatusOr<ExtendedResourceRoute> r = RouteExtendedResource(client_.get(), "vendor.com/gpu", 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, ExtendedResourceRoute::kNone);
  ASSERT_TRUE(client_
                  ->Post(kClasses, DeviceClass("gpu", R"(device.driver == "gpu.vendor.com")",
                                               "vendor.com/gpu"))
                  .ok());
  r = RouteExtendedResource(client_.get(), "vendor.com/gpu", 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, ExtendedResourceRoute::kDevicePlugin);  // allocatable above 0: the plugin's
  r = RouteExtendedResource(client_.get(), "vendor.com/gpu", 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, ExtendedResourceRoute::kDra);
  r = RouteExtendedResource(client_.get(), "vendor.com/nic", 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, ExtendedResourceRoute::kNone);
}

TEST_F(SchedulerTest, APodsExtendedResourceClaimHasARequestPerContainerAndResource) {
  ASSERT_TRUE(client_
                  ->Post(kClasses, DeviceClass("gpu", R"(device.driver=="gpu.vendor.com")",
                                               "vendor.com/gpu"))
                  .ok());
  // node-1 has gpu-0 and gpu-1; a claim holds gpu-0 already.
  ASSERT_TRUE(CreateAllocatedClaim(client_.get(), [&] {
                ClaimAllocation a = Ask("held", 1);
                a.node = "node-1";
                return a;
              }()).ok());
  ExtendedResourcePod pod;
  pod.name = "train";
  pod.node = "node-1";
  pod.containers.push_back({"prep", {{"cpu", 1}}});
  // "cpu" sorts before the resource: its request is the container's second.
  pod.containers.push_back({"main", {{"cpu", 2}, {"vendor.com/gpu", 1}}});
  absl::StatusOr<GeneratedClaim> made = CreateExtendedResourceClaim(client_.get(), pod);
  ASSERT_TRUE(made.ok()) << made.status();
  const Json& claim = made->claim;
  const std::string name = claim["metadata"]["name"];
  EXPECT_THAT(name, ::testing::StartsWith("train-extended-resources-"));
  EXPECT_EQ(name.size(), std::string("train-extended-resources-").size() + 5);
  EXPECT_EQ(claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"],
            "true");
  ASSERT_EQ(claim["spec"]["devices"]["requests"].size(), 1u);
  const Json& request = claim["spec"]["devices"]["requests"][0];
  EXPECT_EQ(request["name"], "container-1-request-1");
  EXPECT_EQ(request["exactly"]["deviceClassName"], "gpu");
  EXPECT_EQ(request["exactly"]["count"], 1);
  EXPECT_EQ(Picked(claim), (std::vector<std::string>{"p1/gpu-1"}));
  EXPECT_EQ(claim["status"]["allocation"]["devices"]["results"][0]["request"],
            "container-1-request-1");
  EXPECT_EQ(made->status["resourceClaimName"], name);
  EXPECT_EQ(made->status["requestMappings"],
            Json::parse(R"([{"containerName": "main", "resourceName": "vendor.com/gpu",
                             "requestName": "container-1-request-1"}])"));
  // Stored as returned.
  absl::StatusOr<Json> got =
      client_->Get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/" + name);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Picked(*got), Picked(claim));

  // node-1 has nothing free now: refused, naming the shortfall, nothing made.
  pod.name = "more";
  absl::Status s = CreateExtendedResourceClaim(client_.get(), pod).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("pod more container main"), HasSubstr("0 free"),
                    HasSubstr("on node node-1")));
  absl::StatusOr<Json> all = client_->Get("/apis/resource.k8s.io/v1/resourceclaims");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)["items"].size(), 2u);
  // A pod asking only for what no class names has no claim to make.
  ExtendedResourcePod plain;
  plain.name = "plain";
  plain.containers.push_back({"main", {{"vendor.com/nic", 1}}});
  EXPECT_EQ(CreateExtendedResourceClaim(client_.get(), plain).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, AClassWhoseDriverItCannotReadIsNamed) {
  ASSERT_TRUE(client_
                  ->Post(kClasses, DeviceClass("odd", R"(device.attributes["x"].y == 1)",
                                               "vendor.com/gpu"))
                  .ok());
  absl::Status s = RouteExtendedResource(client_.get(), "vendor.com/gpu", 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("DeviceClass odd"),
                                               HasSubstr("device.driver == ")));
}

// What the scheduler's claims rely on in the API server: generated names,
// deletion, and DeviceClasses checked as the real server checks them.
TEST_F(SchedulerTest, TheApiServerGeneratesNamesDeletesClaimsAndChecksClasses) {
  const std::string claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
  absl::StatusOr<Json> a = client_->Post(claims, {{"metadata", {{"generateName", "p-"}}}});
  absl::StatusOr<Json> b = client_->Post(claims, {{"metadata", {{"generateName", "p-"}}}});
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string name = (*a)["metadata"]["name"];
  EXPECT_THAT(name, ::testing::MatchesRegex("p-[bcdfghjklmnpqrstvwxz2456789]{5}"));
  EXPECT_NE(name, (*b)["metadata"]["name"].get<std::string>());
  absl::Status none = client_->Post(claims, {{"metadata", Json::object()}}).status();
  EXPECT_THAT(std::string(none.message()), HasSubstr("name or generateName is required"));
  ASSERT_TRUE(client_->Delete(claims + "/" + name).ok());
  EXPECT_EQ(client_->Get(claims + "/" + name).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Delete(claims + "/" + name).status().code(), absl::StatusCode::kNotFound);

  absl::Status bad =
      client_->Post(kClasses, DeviceClass("bad", "device.driver == \"x\"", "gpu")).status();
  EXPECT_THAT(std::string(bad.message()), HasSubstr("spec.extendedResourceName: Invalid value"));
  ASSERT_TRUE(client_->Post(kClasses, DeviceClass("gpu", "true", "vendor.com/gpu")).ok());
  EXPECT_THAT(std::string(client_->Post(kClasses, DeviceClass("gpu", "true", "")).status().message()),
              HasSubstr("already exists"));
  absl::StatusOr<Json> one = client_->Get(std::string(kClasses) + "/gpu");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)["spec"]["extendedResourceName"], "vendor.com/gpu");
  EXPECT_EQ(client_->Get(std::string(kClasses) + "/nic").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dpproxy::sim
