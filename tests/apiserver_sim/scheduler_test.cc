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

}  // namespace
}  // namespace dpproxy::sim
