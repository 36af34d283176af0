// MoveFence against the API-server simulator over real HTTP, its passes
// driven with explicit times: the node's taint raised before the
// withdrawal, the withdrawal after the settle, the taint lowered once the
// node's status shows the move; a move cancelled before its withdrawal;
// a conflicting node update read again; a refusal (403) that withdraws at
// once; a taint an earlier process left; and the other taints of the node
// kept as they are.
#include "proxy/kubelet_side/dra/move_fence.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAre;

struct FenceFixture {
  FenceFixture() : api(sim::ApiServerSim::Options{"", "", "secret", {"v1"}}) {
    EXPECT_TRUE(api.Start().ok());
    KubeConfig c;
    c.server = api.url();
    c.token = "secret";
    client = *KubeClient::Create(c);
    api.PutNode("node-1", "v1.37.2");
    api.SetNodeAllocatable("node-1", {{"vendor.com/gpu", 4}});
    fence.set_client(client.get());
  }
  // The keys of the node's taints, in order.
  std::vector<std::string> Taints() {
    std::vector<std::string> out;
    for (const Json& t : api.Node("node-1").value("/spec/taints"_json_pointer, Json::array())) {
      out.push_back(t.value("key", ""));
    }
    return out;
  }
  sim::ApiServerSim api;
  std::unique_ptr<KubeClient> client;
  EventLog events{"test"};
  MoveFence fence{"node-1", &events};
  const absl::Time t0 = absl::Now();
};

TEST(MoveFenceTest, TheNodeIsTaintedUntilItsStatusShowsTheMove) {
  FenceFixture f;
  int withdrawn = 0;
  f.fence.Fence("vendor.com/gpu", [&] { ++withdrawn; });
  EXPECT_TRUE(f.fence.busy());
  f.fence.Step(f.t0);
  EXPECT_THAT(f.Taints(), ElementsAre(kMoveTaintKey));
  const Json taint = f.api.Node("node-1")["spec"]["taints"][0];
  EXPECT_EQ(taint["effect"], "NoSchedule");
  EXPECT_EQ(taint["value"], "device-plugin-to-dra");
  EXPECT_EQ(withdrawn, 0);
  ASSERT_TRUE(f.events.WaitForEvent("move_fence_raised", {{"node", "node-1"}},
                                    absl::ZeroDuration()));
  // Within the settle: nothing yet.
  f.fence.Step(f.t0 + MoveFence::kSettle - absl::Milliseconds(1));
  EXPECT_EQ(withdrawn, 0);
  // Settled: withdrawn, once; the status still shows the devices.
  f.fence.Step(f.t0 + MoveFence::kSettle);
  EXPECT_EQ(withdrawn, 1);
  f.fence.Step(f.t0 + MoveFence::kSettle + absl::Seconds(5));
  EXPECT_EQ(withdrawn, 1);
  EXPECT_THAT(f.Taints(), ElementsAre(kMoveTaintKey));
  // The kubelet's status update: the taint goes.
  f.api.SetNodeAllocatable("node-1", {{"vendor.com/gpu", 0}});
  f.fence.Step(f.t0 + MoveFence::kSettle + absl::Seconds(6));
  EXPECT_TRUE(f.Taints().empty());
  EXPECT_FALSE(f.fence.busy());
  EXPECT_TRUE(f.events.WaitForEvent("move_fence_lowered", {{"node", "node-1"}},
                                    absl::ZeroDuration()));
  EXPECT_EQ(withdrawn, 1);
}

TEST(MoveFenceTest, AResourceGoneFromTheStatusCountsAsMoved) {
  FenceFixture f;
  f.fence.Fence("vendor.com/gpu", [] {});
  f.fence.Step(f.t0);
  f.fence.Step(f.t0 + MoveFence::kSettle);
  f.api.SetNodeAllocatable("node-1", {});
  f.fence.Step(f.t0 + MoveFence::kSettle + absl::Seconds(1));
  EXPECT_TRUE(f.Taints().empty());
}

TEST(MoveFenceTest, AStatusThatNeverCatchesUpLiftsTheTaintAtTheLimit) {
  FenceFixture f;
  f.fence.Fence("vendor.com/gpu", [] {});
  f.fence.Step(f.t0);
  f.fence.Step(f.t0 + MoveFence::kSettle);
  f.fence.Step(f.t0 + MoveFence::kSettle + MoveFence::kStatusLimit - absl::Seconds(1));
  EXPECT_THAT(f.Taints(), ElementsAre(kMoveTaintKey));
  f.fence.Step(f.t0 + MoveFence::kSettle + MoveFence::kStatusLimit);
  EXPECT_TRUE(f.Taints().empty());
}

TEST(MoveFenceTest, AMoveCancelledBeforeItsWithdrawalNeverWithdraws) {
  FenceFixture f;
  int withdrawn = 0;
  f.fence.Fence("vendor.com/gpu", [&] { ++withdrawn; });
  f.fence.Step(f.t0);
  EXPECT_TRUE(f.fence.Cancel("vendor.com/gpu"));
  f.fence.Step(f.t0 + MoveFence::kSettle);
  EXPECT_EQ(withdrawn, 0);
  EXPECT_TRUE(f.Taints().empty());  // nothing under way: lowered
  EXPECT_FALSE(f.fence.Cancel("vendor.com/gpu"));
}

TEST(MoveFenceTest, TheNodesOtherTaintsAreKeptAndAConflictIsReadAgain) {
  FenceFixture f;
  Json node = f.api.Node("node-1");
  node["spec"]["taints"] = Json::array(
      {{{"key", "nvidia.com/gpu"}, {"value", "present"}, {"effect", "NoSchedule"}}});
  ASSERT_TRUE(f.client->Put("/api/v1/nodes/node-1", node).ok());
  // The first update loses a race (the kubelet wrote meanwhile).
  f.api.InjectFault({"PUT", "/api/v1/nodes/node-1", 409, 1});
  f.fence.Fence("vendor.com/gpu", [] {});
  f.fence.Step(f.t0);
  EXPECT_THAT(f.Taints(), ElementsAre("nvidia.com/gpu", kMoveTaintKey));
  f.fence.Step(f.t0 + MoveFence::kSettle);
  f.api.SetNodeAllocatable("node-1", {{"vendor.com/gpu", 0}});
  f.fence.Step(f.t0 + MoveFence::kSettle + absl::Seconds(1));
  EXPECT_THAT(f.Taints(), ElementsAre("nvidia.com/gpu"));
}

TEST(MoveFenceTest, WithoutTheRightToUpdateTheNodeTheMoveIsMadeAtOnce) {
  FenceFixture f;
  f.api.InjectFault({"PUT", "/api/v1/nodes/", 403, 1});
  int withdrawn = 0;
  f.fence.Fence("vendor.com/gpu", [&] { ++withdrawn; });
  f.fence.Step(f.t0);
  EXPECT_EQ(withdrawn, 1);
  EXPECT_FALSE(f.fence.busy());
  EXPECT_TRUE(f.Taints().empty());
  std::optional<Json> e = f.events.WaitForEvent("move_fence_failed", {{"node", "node-1"}},
                                                absl::ZeroDuration());
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT((*e)["error"].get<std::string>(), ::testing::HasSubstr("403"));
}

TEST(MoveFenceTest, ANodeUnknownToTheApiServerIsNotFencedEither) {
  FenceFixture f;
  MoveFence other("node-2", &f.events);
  other.set_client(f.client.get());
  int withdrawn = 0;
  other.Fence("vendor.com/gpu", [&] { ++withdrawn; });
  other.Step(f.t0);
  EXPECT_EQ(withdrawn, 1);
}

TEST(MoveFenceTest, ATaintAnEarlierProcessLeftIsLowered) {
  FenceFixture f;
  {
    MoveFence earlier("node-1", &f.events);
    earlier.set_client(f.client.get());
    earlier.Fence("vendor.com/gpu", [] {});
    earlier.Step(f.t0);
    ASSERT_THAT(f.Taints(), ElementsAre(kMoveTaintKey));
    // It stops without lowering it (killed).
  }
  f.fence.Step(f.t0);
  EXPECT_TRUE(f.Taints().empty());
}

TEST(MoveFenceTest, AStopLowersTheTaint) {
  FenceFixture f;
  int withdrawn = 0;
  f.fence.Fence("vendor.com/gpu", [&] { ++withdrawn; });
  f.fence.Step(f.t0);
  ASSERT_THAT(f.Taints(), ElementsAre(kMoveTaintKey));
  f.fence.Stop(f.client.get());
  EXPECT_TRUE(f.Taints().empty());
  EXPECT_EQ(withdrawn, 0);  // the device-plugin side stops anyway
  EXPECT_FALSE(f.fence.busy());
}

}  // namespace
}  // namespace dpproxy
