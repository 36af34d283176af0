// The hold index on its own: which device has which holder, and the two
// refusals read from it (one holder across the device-plugin and DRA
// paths; a forgotten allocation's device).
#include "proxy/state/hold_index.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proxy/state/allocation_table.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {
namespace {

constexpr char kGpu[] = "vendor.com/gpu";

state::Allocation Pod(uint64_t id, const std::vector<std::string>& devices) {
  state::Allocation a;
  a.set_id(id);
  a.set_resource(kGpu);
  for (const std::string& d : devices) a.add_device_ids(d);
  a.set_pod_namespace("default");
  a.set_pod_name("pod-" + std::to_string(id));
  a.set_container("c");
  return a;
}

state::Allocation Claim(uint64_t id, const std::string& uid, const std::vector<std::string>& devices,
                        bool extended_resource = false) {
  state::Allocation a;
  a.set_id(id);
  a.set_resource(kGpu);
  for (const std::string& d : devices) a.add_device_ids(d);
  a.mutable_claim()->set_uid(uid);
  a.mutable_claim()->set_namespace_("default");
  a.mutable_claim()->set_name("claim-" + uid);
  a.mutable_claim()->set_extended_resource(extended_resource);
  return a;
}

// Both the table and the index, as the keeper keeps them.
struct Held {
  AllocationTable table;
  HoldIndex index;
  void Add(const state::Allocation& a) {
    table.Put(a);
    index.Add(a);
  }
  void Remove(const state::Allocation& a) {
    table.Erase(a.id(), nullptr);
    index.Remove(a);
  }
};

TEST(HoldIndexTest, AnAllocationHoldsItsDevicesUntilRemoved) {
  Held h;
  const state::Allocation a = Pod(1, {"gpu-0", "gpu-1"});
  h.Add(a);
  EXPECT_TRUE(h.index.Holds(kGpu, "gpu-0"));
  EXPECT_TRUE(h.index.Holds(kGpu, "gpu-1"));
  EXPECT_FALSE(h.index.Holds(kGpu, "gpu-2"));
  EXPECT_FALSE(h.index.Holds("vendor.com/nic", "gpu-0"));
  // Two holders of one device (two paths with the rule off): it stays held
  // until both are gone.
  const state::Allocation b = Pod(2, {"gpu-1"});
  h.Add(b);
  h.Remove(a);
  EXPECT_FALSE(h.index.Holds(kGpu, "gpu-0"));
  EXPECT_TRUE(h.index.Holds(kGpu, "gpu-1"));
  h.Remove(b);
  EXPECT_FALSE(h.index.Holds(kGpu, "gpu-1"));
}

TEST(HoldIndexTest, WithTheRuleOffEachPathRulesItsOwnDevices) {
  Held h;
  h.Add(Claim(1, "u1", {"gpu-0"}));
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/false, h.table).has_value());
  h.Add(Pod(2, {"gpu-1"}));
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-1", /*claim=*/true, h.table).has_value());
  EXPECT_TRUE(h.index.HeldAcrossPaths().empty());
}

TEST(HoldIndexTest, AClaimsDeviceIsRefusedToAPodNamingTheClaim) {
  Held h;
  h.index.SetOneHolderAcrossPaths(true);
  h.Add(Claim(1, "u1", {"gpu-0"}));
  auto r = h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/false, h.table);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, "DRA claim default/claim-u1 (UID u1)");
  EXPECT_EQ(r->message,
            "device gpu-0 of vendor.com/gpu is held by DRA claim default/claim-u1 (UID u1); "
            "refused: a device has one holder");
  // Another claim may share it (DRA's own rules decide), and a free device
  // is anyone's.
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/true, h.table).has_value());
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-1", /*claim=*/false, h.table).has_value());
}

TEST(HoldIndexTest, APodsDeviceIsRefusedToAClaimNamingThePod) {
  Held h;
  h.index.SetOneHolderAcrossPaths(true);
  h.Add(Pod(1, {"gpu-0"}));
  auto r = h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/true, h.table);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, "pod default/pod-1 container c, a pod of the extended resource");
  h.Remove(Pod(1, {"gpu-0"}));
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/true, h.table).has_value());
}

// Two paths asking for one device at the same instant: the first one
// queued holds it before it is written.
TEST(HoldIndexTest, ARecordOnItsWayToTheJournalHoldsAgainstTheOtherPath) {
  Held h;
  h.index.SetOneHolderAcrossPaths(true);
  const state::Allocation c = Claim(1, "u1", {"gpu-0"});
  h.index.StartInFlight(c);
  auto r = h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/false, h.table);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, "DRA claim default/claim-u1 (UID u1)");
  h.index.EndInFlight(c);
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-0", /*claim=*/false, h.table).has_value());

  const state::Allocation p = Pod(2, {"gpu-1"});
  h.index.StartInFlight(p);
  r = h.index.CheckOtherPath(kGpu, "gpu-1", /*claim=*/true, h.table);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, "an allocation being recorded, a pod of the extended resource");
  h.index.EndInFlight(p);
  EXPECT_FALSE(h.index.CheckOtherPath(kGpu, "gpu-1", /*claim=*/true, h.table).has_value());
}

TEST(HoldIndexTest, HeldAcrossPathsSaysWhichPathHoldsEachDevice) {
  Held h;
  h.index.SetOneHolderAcrossPaths(true);
  h.Add(Claim(1, "u1", {"gpu-0"}));
  h.Add(Claim(2, "u2", {"gpu-1"}, /*extended_resource=*/true));
  h.Add(Pod(3, {"gpu-2"}));
  auto held = h.index.HeldAcrossPaths();
  ASSERT_EQ(held.count(kGpu), 1u);
  EXPECT_EQ(held[kGpu].by_claims, (std::set<std::string>{"gpu-0", "gpu-1"}));
  EXPECT_EQ(held[kGpu].by_pod_claims, (std::set<std::string>{"gpu-1"}));
  EXPECT_EQ(held[kGpu].by_pods, (std::set<std::string>{"gpu-2"}));
  EXPECT_EQ(h.index.ClaimAllocationCount(), 2);
  // The last allocation gone: the resource stays listed, holding nothing.
  h.Remove(Claim(1, "u1", {"gpu-0"}));
  h.Remove(Claim(2, "u2", {"gpu-1"}, true));
  h.Remove(Pod(3, {"gpu-2"}));
  held = h.index.HeldAcrossPaths();
  ASSERT_EQ(held.count(kGpu), 1u);
  EXPECT_TRUE(held[kGpu].by_claims.empty());
  EXPECT_TRUE(held[kGpu].by_pods.empty());
}

TEST(HoldIndexTest, AForgottenAllocationsDeviceIsRefusedNamingItsHolder) {
  Held h;
  state::Allocation a = Pod(7, {"gpu-3"});
  a.set_quarantined(true);
  h.table.Put(a);
  h.table.Put(Pod(8, {"gpu-4"}));
  h.index.Rebuild(h.table);
  EXPECT_TRUE(h.index.AnyQuarantined());
  auto r = h.index.CheckForgotten(kGpu, "gpu-3", h.table);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->holder, "pod default/pod-7 container c");
  EXPECT_EQ(r->message,
            "device gpu-3 of vendor.com/gpu is still in use by pod default/pod-7 container c, "
            "which the kubelet lost track of (it counts the device free); refused");
  EXPECT_FALSE(h.index.CheckForgotten(kGpu, "gpu-4", h.table).has_value());
  // Its pod ended: the forgotten allocation is released.
  h.table.Erase(7, nullptr);
  h.index.Remove(a);
  h.index.RebuildQuarantined(h.table);
  EXPECT_FALSE(h.index.AnyQuarantined());
  EXPECT_FALSE(h.index.CheckForgotten(kGpu, "gpu-3", h.table).has_value());
}

TEST(HoldIndexTest, AClaimsAllocationsAreFoundByItsUidAfterAMove) {
  Held h;
  h.Add(Claim(1, "reserved", {"gpu-0"}));
  h.index.MoveClaim(1, "reserved", "u9");
  ASSERT_EQ(h.index.claims().count("u9"), 1u);
  EXPECT_EQ(h.index.claims().at("u9"), (std::set<uint64_t>{1}));
  EXPECT_EQ(h.index.claims().count("reserved"), 0u);
}

TEST(HoldIndexTest, HolderNamesSayWhatIsKnown) {
  state::Allocation a;
  a.set_id(5);
  EXPECT_EQ(HoldIndex::HolderOf(a), "allocation 5");
  a.set_pod_uid("uid-1");
  EXPECT_EQ(HoldIndex::HolderOf(a), "a container of pod UID uid-1");
}

}  // namespace
}  // namespace dpproxy
