#include "tools/kubelet_sim/device_manager.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dpproxy::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

std::vector<v1beta1::Device> Devices(std::initializer_list<std::pair<const char*, const char*>> d) {
  std::vector<v1beta1::Device> out;
  for (const auto& [id, health] : d) {
    v1beta1::Device dev;
    dev.set_id(id);
    dev.set_health(health);
    out.push_back(dev);
  }
  return out;
}

ContainerAllocation Alloc(const std::string& uid, const std::string& container,
                          const std::string& resource, std::vector<std::string> ids) {
  ContainerAllocation a;
  a.set_pod_uid(uid);
  a.set_pod_name("pod-" + uid);
  a.set_pod_namespace("default");
  a.set_container(container);
  a.set_resource(resource);
  for (auto& id : ids) a.add_device_ids(id);
  (*a.mutable_response()->mutable_envs())["DEV"] = "x";
  return a;
}

void AddRunningPod(DeviceManager& m, const std::string& uid) {
  PodState p;
  p.set_uid(uid);
  p.set_name("pod-" + uid);
  p.set_namespace_("default");
  p.set_phase("Running");
  m.AddPod(p);
}

class DeviceManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.RegisterEndpoint("vendor.com/gpu", "/dp/gpu.sock", "v1beta1", "kubelet.sock", {}, 1);
    ASSERT_TRUE(m_.UpdateDevices("vendor.com/gpu", 1, false,
                                 Devices({{"g0", "Healthy"}, {"g1", "Healthy"},
                                          {"g2", "Unhealthy"}})));
  }
  DeviceManager m_;
};

TEST_F(DeviceManagerTest, CapacityCountsAllAllocatableCountsHealthy) {
  EXPECT_EQ(m_.Capacity("vendor.com/gpu"), 3);
  EXPECT_EQ(m_.Allocatable("vendor.com/gpu"), 2);
  EXPECT_EQ(m_.Capacity("vendor.com/none"), 0);
}

TEST_F(DeviceManagerTest, ListIsReplacedWholesale) {
  ASSERT_TRUE(m_.UpdateDevices("vendor.com/gpu", 1, false, Devices({{"g9", "Healthy"}})));
  EXPECT_EQ(m_.Capacity("vendor.com/gpu"), 1);
  EXPECT_EQ(m_.Find("vendor.com/gpu")->devices.count("g0"), 0u);
}

// A device listed more than once is one device, Healthy if any of its
// entries is, as the kubelet's device manager keeps it
// (genericDeviceUpdateCallback: a map by ID and a healthy set).
TEST_F(DeviceManagerTest, AnIdListedTwiceIsOneDeviceHealthyIfAnyEntryIs) {
  ASSERT_TRUE(m_.UpdateDevices("vendor.com/gpu", 1, false,
                               Devices({{"kvm", "Healthy"}, {"kvm", "Unhealthy"},
                                        {"tun", "Unhealthy"}, {"tun", "Unhealthy"}})));
  EXPECT_EQ(m_.Allocatable("vendor.com/gpu"), 1);
  EXPECT_EQ(m_.Find("vendor.com/gpu")->devices.size(), 2u);
  EXPECT_EQ(m_.Find("vendor.com/gpu")->devices.at("kvm").health, "Healthy");
  EXPECT_EQ(m_.Find("vendor.com/gpu")->devices.at("tun").health, "Unhealthy");
}

TEST_F(DeviceManagerTest, StaleEndpointCannotUpdateOrDisconnectItsSuccessor) {
  m_.RegisterEndpoint("vendor.com/gpu", "/dp/gpu2.sock", "v1beta1", "kubelet.sock", {}, 2);
  EXPECT_FALSE(m_.UpdateDevices("vendor.com/gpu", 1, false, Devices({{"old", "Healthy"}})));
  EXPECT_FALSE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  EXPECT_TRUE(m_.Find("vendor.com/gpu")->connected);
  // Devices are kept until the new endpoint's first list.
  EXPECT_EQ(m_.Capacity("vendor.com/gpu"), 3);
}

// A kubelet that takes lists by name (1.10 on) takes a replaced client's
// too, even after the resource's endpoint was lost: the devices turn
// Healthy while the endpoint stays stopped.
TEST_F(DeviceManagerTest, AListByNameFromAReplacedClientReachesAStoppedEndpointsDevices) {
  m_.RegisterEndpoint("vendor.com/gpu", "/dp/gpu2.sock", "v1beta1", "kubelet.sock", {}, 2);
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 2, kT0));
  ASSERT_TRUE(m_.UpdateDevices("vendor.com/gpu", 1, true, Devices({{"g0", "Healthy"}})));
  EXPECT_EQ(m_.Find("vendor.com/gpu")->devices.at("g0").health, "Healthy");
  EXPECT_FALSE(m_.Find("vendor.com/gpu")->connected);
}

TEST_F(DeviceManagerTest, LostPluginMakesDevicesUnhealthyThenGraceRemovesResource) {
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  EXPECT_EQ(m_.Capacity("vendor.com/gpu"), 3);  // capacity kept during grace
  EXPECT_EQ(m_.Allocatable("vendor.com/gpu"), 0);
  EXPECT_THAT(m_.ExpireResources(kT0 + absl::Minutes(4), absl::Minutes(5)), IsEmpty());
  EXPECT_THAT(m_.ExpireResources(kT0 + absl::Minutes(5), absl::Minutes(5)),
              ElementsAre("vendor.com/gpu"));
  EXPECT_EQ(m_.Find("vendor.com/gpu"), nullptr);
}

TEST_F(DeviceManagerTest, ZeroGraceDropsAtOnceLikeKubernetes19) {
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  EXPECT_THAT(m_.ExpireResources(kT0, absl::ZeroDuration()), ElementsAre("vendor.com/gpu"));
}

TEST_F(DeviceManagerTest, ReRegistrationWithinGraceKeepsResource) {
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  m_.RegisterEndpoint("vendor.com/gpu", "/dp/gpu.sock", "v1beta1", "kubelet.sock", {}, 2);
  EXPECT_THAT(m_.ExpireResources(kT0 + absl::Hours(1), absl::Minutes(5)), IsEmpty());
}

TEST_F(DeviceManagerTest, AvailableExcludesUnhealthyAndAllocated) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "c", "vendor.com/gpu", {"g0"}));
  absl::StatusOr<std::vector<std::string>> a = m_.AvailableFor("vendor.com/gpu", 1);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(*a, ElementsAre("g1"));
}

TEST_F(DeviceManagerTest, AdmissionErrorsUseKubeletTexts) {
  EXPECT_EQ(m_.AvailableFor("vendor.com/nic", 1).status().message(),
            "cannot allocate unregistered device vendor.com/nic");
  EXPECT_EQ(m_.AvailableFor("vendor.com/gpu", 3).status().message(),
            "requested number of devices unavailable for vendor.com/gpu. Requested: 3, "
            "Available: 2");
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  EXPECT_EQ(m_.AvailableFor("vendor.com/gpu", 1).status().message(),
            "no healthy devices present; cannot allocate unhealthy devices vendor.com/gpu");
}

TEST_F(DeviceManagerTest, FailedAndDeletedPodsFreeTheirDevices) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "c", "vendor.com/gpu", {"g0", "g1"}));
  EXPECT_FALSE(m_.AvailableFor("vendor.com/gpu", 1).ok());
  m_.FailPod("u1", "UnexpectedAdmissionError", "x");
  EXPECT_TRUE(m_.AvailableFor("vendor.com/gpu", 2).ok());
  EXPECT_EQ(m_.pods().at("u1").phase(), "Failed");
  EXPECT_TRUE(m_.DeletePod("u1").ok());
  EXPECT_EQ(m_.DeletePod("u1").code(), absl::StatusCode::kNotFound);
}

TEST_F(DeviceManagerTest, ReadmitPassesWhenDevicesAreHealthy) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "c", "vendor.com/gpu", {"g0"}));
  std::vector<ReadmitResult> r = m_.Readmit();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].admitted());
  EXPECT_EQ(m_.pods().at("u1").phase(), "Running");
}

TEST_F(DeviceManagerTest, ReadmitFailsForEachOfTheKubeletsThreeReasons) {
  // Previously allocated device no longer healthy.
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "c", "vendor.com/gpu", {"g2"}));
  // Resource never registered.
  AddRunningPod(m_, "u2");
  m_.AddAllocation(Alloc("u2", "c", "vendor.com/nic", {"n0"}));
  std::vector<ReadmitResult> r = m_.Readmit();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_FALSE(r[0].admitted());
  EXPECT_EQ(r[0].reason(), "UnexpectedAdmissionError");
  EXPECT_EQ(r[0].message(),
            "Allocate failed due to previously allocated devices are no longer healthy; "
            "cannot allocate unhealthy devices vendor.com/gpu, which is unexpected");
  EXPECT_EQ(r[1].message(),
            "Allocate failed due to cannot allocate unregistered device vendor.com/nic, "
            "which is unexpected");
  EXPECT_EQ(m_.pods().at("u1").phase(), "Failed");
  EXPECT_EQ(m_.pods().at("u2").reason(), "UnexpectedAdmissionError");
  EXPECT_THAT(m_.allocations(), IsEmpty());

  // No healthy device at all.
  AddRunningPod(m_, "u3");
  m_.AddAllocation(Alloc("u3", "c", "vendor.com/gpu", {"g0"}));
  ASSERT_TRUE(m_.EndpointLost("vendor.com/gpu", 1, kT0));
  r = m_.Readmit();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_THAT(r[0].message(), HasSubstr("no healthy devices present"));
}

TEST_F(DeviceManagerTest, CheckpointHasKubeletLayoutAndRoundTrips) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/gpu", {"g0", "g1"}));
  const std::string ckpt = m_.CheckpointJson(31);
  nlohmann::json j = nlohmann::json::parse(ckpt);
  ASSERT_TRUE(j.contains("Checksum"));
  const auto& entry = j["Data"]["PodDeviceEntries"][0];
  EXPECT_EQ(entry["PodUID"], "u1");
  EXPECT_EQ(entry["ContainerName"], "main");
  EXPECT_EQ(entry["ResourceName"], "vendor.com/gpu");
  EXPECT_EQ(entry["DeviceIDs"]["-1"], nlohmann::json({"g0", "g1"}));  // no topology
  EXPECT_EQ(j["Data"]["RegisteredDevices"]["vendor.com/gpu"], nlohmann::json({"g0", "g1"}));

  DeviceManager restored;
  ASSERT_TRUE(restored.Restore(ckpt, m_.PodsJson(), kT0, 31).ok());
  ASSERT_EQ(restored.allocations().size(), 1u);
  EXPECT_THAT(restored.allocations()[0].device_ids(), ElementsAre("g0", "g1"));
  EXPECT_EQ(restored.allocations()[0].response().envs().at("DEV"), "x");
  EXPECT_EQ(restored.allocations()[0].pod_name(), "pod-u1");
  // As the kubelet: the resource exists, stopped, with no devices until the
  // plugin registers again.
  const ResourceRecord* r = restored.Find("vendor.com/gpu");
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->connected);
  EXPECT_EQ(restored.Capacity("vendor.com/gpu"), 0);
  // ... and its grace period runs from the restore.
  EXPECT_THAT(restored.ExpireResources(kT0 + absl::Minutes(5), absl::Minutes(5)),
              ElementsAre("vendor.com/gpu"));
}

TEST_F(DeviceManagerTest, CorruptCheckpointIsDetectedAndStateStartsEmpty) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/gpu", {"g0"}));
  std::string ckpt = m_.CheckpointJson(31);
  std::string tampered = ckpt;
  tampered.replace(tampered.find("g0"), 2, "g9");
  DeviceManager restored;
  absl::Status s = restored.Restore(tampered, "", kT0, 31);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum"));
  EXPECT_THAT(restored.allocations(), IsEmpty());
  EXPECT_EQ(restored.Restore(ckpt.substr(0, ckpt.size() / 2), "", kT0, 31).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(restored.Restore("[]", "", kT0, 31).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(restored.Restore("", "", kT0, 31).ok());  // no checkpoint: fresh node
}

TEST_F(DeviceManagerTest, CheckpointKeysDevicesByNumaNode) {
  v1beta1::Device d;
  d.set_id("t0");
  d.set_health("Healthy");
  d.mutable_topology()->add_nodes()->set_id(1);
  m_.RegisterEndpoint("vendor.com/tpu", "/dp/tpu.sock", "v1beta1", "kubelet.sock", {}, 7);
  ASSERT_TRUE(m_.UpdateDevices("vendor.com/tpu", 7, false, {d}));
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/tpu", {"t0"}));
  nlohmann::json j = nlohmann::json::parse(m_.CheckpointJson(31));
  EXPECT_EQ(j["Data"]["PodDeviceEntries"][0]["DeviceIDs"]["1"], nlohmann::json({"t0"}));
}

// The device manager's checkpoint: each release writes its own layout.
TEST_F(DeviceManagerTest, CheckpointLayoutFollowsTheRelease) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/gpu", {"g0", "g1"}));
  const nlohmann::json v19 = nlohmann::json::parse(m_.CheckpointJson(9));
  EXPECT_FALSE(v19.contains("Data"));
  EXPECT_FALSE(v19.contains("Checksum"));
  EXPECT_EQ(v19["PodDeviceEntries"][0]["DeviceIDs"], nlohmann::json({"g0", "g1"}));
  EXPECT_EQ(v19["RegisteredDevices"]["vendor.com/gpu"], nlohmann::json({"g0", "g1"}));
  for (int minor : {11, 19}) {
    const nlohmann::json j = nlohmann::json::parse(m_.CheckpointJson(minor));
    EXPECT_TRUE(j.contains("Checksum")) << minor;
    EXPECT_EQ(j["Data"]["PodDeviceEntries"][0]["DeviceIDs"], nlohmann::json({"g0", "g1"}))
        << minor;
  }
  for (int minor : {20, 22}) {  // no topology: NUMA node "0"
    const nlohmann::json j = nlohmann::json::parse(m_.CheckpointJson(minor));
    EXPECT_EQ(j["Data"]["PodDeviceEntries"][0]["DeviceIDs"],
              nlohmann::json({{"0", {"g0", "g1"}}}))
        << minor;
  }
  const nlohmann::json v123 = nlohmann::json::parse(m_.CheckpointJson(23));
  EXPECT_EQ(v123["Data"]["PodDeviceEntries"][0]["DeviceIDs"],
            nlohmann::json({{"-1", {"g0", "g1"}}}));
}

// Which release reads which release's file: the upgrade paths users met
// (kubernetes#102880: 1.19 -> 1.20/1.21 lost the allocations; 1.22-1.30
// read the old layout; 1.31 dropped it again, #123398).
TEST_F(DeviceManagerTest, EachReleaseReadsOnlyTheLayoutsItKnows) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/gpu", {"g0"}));
  struct Case {
    int written_by, read_by;
    bool readable;
  };
  const Case cases[] = {
      {9, 9, true},    {10, 10, true},  {19, 19, true},  {11, 19, true},
      {19, 20, false}, {19, 21, false}, {19, 22, true},  {19, 30, true},
      {19, 31, false}, {19, 36, false}, {22, 31, true},  {23, 20, true},
      {23, 19, false}, {9, 11, false},  {23, 36, true},
  };
  for (const Case& c : cases) {
    DeviceManager restored;
    const absl::Status s =
        restored.Restore(m_.CheckpointJson(c.written_by), m_.PodsJson(), kT0, c.read_by);
    SCOPED_TRACE(absl::StrCat("written by 1.", c.written_by, ", read by 1.", c.read_by));
    if (c.readable) {
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(restored.allocations().size(), 1u);
      EXPECT_THAT(restored.allocations()[0].device_ids(), ElementsAre("g0"));
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(restored.allocations(), IsEmpty());
    }
  }
  // A 1.9 kubelet decodes a newer file into its own layout: nothing, no error.
  DeviceManager old;
  EXPECT_TRUE(old.Restore(m_.CheckpointJson(23), "", kT0, 9).ok());
  EXPECT_THAT(old.allocations(), IsEmpty());
  // The error names the reason, as the kubelet's log line does.
  DeviceManager v131;
  EXPECT_THAT(std::string(v131.Restore(m_.CheckpointJson(19), "", kT0, 31).message()),
              HasSubstr("cannot unmarshal array"));
}

TEST_F(DeviceManagerTest, StateViewShowsHolders) {
  AddRunningPod(m_, "u1");
  m_.AddAllocation(Alloc("u1", "main", "vendor.com/gpu", {"g1"}));
  State st;
  m_.FillState(kT0, &st);
  ASSERT_EQ(st.resources_size(), 1);
  EXPECT_EQ(st.resources(0).capacity(), 3);
  EXPECT_EQ(st.resources(0).allocatable(), 2);
  EXPECT_EQ(st.resources(0).devices(1).allocated_to(), "default/pod-u1/main");
  EXPECT_EQ(st.resources(0).devices(0).allocated_to(), "");
}

// A restarted kubelet re-admits running pods in creation order against
// allocatable (healthy devices) minus the pods admitted before: with g2
// Unhealthy, 2 are allocatable; the oldest pod (2) fits, the next (1) is
// denied with the kubelet's message, and its containers no longer run.
TEST_F(DeviceManagerTest, RefitDeniesRunningPodsBeyondAllocatableInCreationOrder) {
  for (const auto& [uid, count] : std::vector<std::pair<std::string, int>>{{"old", 2}, {"new", 1}}) {
    PodState p;
    p.set_uid(uid);
    p.set_name("pod-" + uid);
    p.set_namespace_("default");
    p.set_phase("Running");
    ContainerRequest* c = p.add_containers();
    c->set_name("main");
    c->set_resource("vendor.com/gpu");
    c->set_count(count);
    RuntimeDevices* r = p.add_running();
    r->set_container("main");
    r->set_resource("vendor.com/gpu");
    r->add_device_ids(uid == "old" ? "g0" : "g2");
    m_.AddPod(p);
  }
  // The checkpoint was lost: no allocation is recorded for either.
  std::vector<DeviceManager::RefitResult> results = m_.RefitRunningPods();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].pod_uid, "old");
  EXPECT_TRUE(results[0].admitted);
  ASSERT_EQ(results[0].forgotten.size(), 1u);  // it holds no devices in the records
  EXPECT_EQ(results[1].pod_uid, "new");
  EXPECT_FALSE(results[1].admitted);
  EXPECT_EQ(results[1].reason, "OutOfvendor.com/gpu");
  EXPECT_EQ(results[1].message,
            "Node didn't have enough resource: vendor.com/gpu, requested: 1, used: 2, "
            "capacity: 2");
  EXPECT_EQ(m_.pods().at("new").phase(), "Failed");
  EXPECT_THAT(m_.pods().at("new").running(), IsEmpty());
  EXPECT_EQ(m_.pods().at("old").running_size(), 1);
}

// A pod the kubelet still holds devices for is admitted even when its
// devices are Unhealthy: allocatable is raised to what it holds.
TEST_F(DeviceManagerTest, RefitKeepsAPodWhoseDevicesTheKubeletHolds) {
  PodState p;
  p.set_uid("u");
  p.set_name("pod-u");
  p.set_namespace_("default");
  p.set_phase("Running");
  ContainerRequest* c = p.add_containers();
  c->set_name("main");
  c->set_resource("vendor.com/gpu");
  c->set_count(3);
  m_.AddPod(p);
  m_.AddAllocation(Alloc("u", "main", "vendor.com/gpu", {"g0", "g1", "g2"}));
  std::vector<DeviceManager::RefitResult> results = m_.RefitRunningPods();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].admitted) << results[0].message;
  EXPECT_THAT(results[0].forgotten, IsEmpty());
}

// The pod spec and the runtime's devices survive the pods file.
TEST_F(DeviceManagerTest, PodsFileKeepsSpecOrderAndRuntimeDevices) {
  PodState p;
  p.set_uid("u");
  p.set_name("pod-u");
  p.set_phase("Running");
  ContainerRequest* c = p.add_containers();
  c->set_name("main");
  c->set_resource("vendor.com/gpu");
  c->set_count(1);
  RuntimeDevices* r = p.add_running();
  r->set_container("main");
  r->set_resource("vendor.com/gpu");
  r->add_device_ids("g1");
  m_.AddPod(p);
  const std::string pods = m_.PodsJson();
  DeviceManager back;
  ASSERT_TRUE(back.Restore("", pods, kT0, 31).ok());
  const PodState& q = back.pods().at("u");
  EXPECT_EQ(q.created(), 1);
  ASSERT_EQ(q.containers_size(), 1);
  EXPECT_EQ(q.containers(0).count(), 1);
  ASSERT_EQ(q.running_size(), 1);
  EXPECT_THAT(q.running(0).device_ids(), ElementsAre("g1"));
  State st;
  m_.FillState(kT0, &st);
  for (const auto& d : st.resources(0).devices()) {
    if (d.id() == "g1") {
      EXPECT_THAT(d.used_by(), ElementsAre("/pod-u/main"));
    }
  }
}

}  // namespace
}  // namespace dpproxy::sim
