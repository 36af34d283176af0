// The pod-resources view's addition: each device a claim of dpproxy's
// driver gave a container, found in the journal by claim, pool and DRA
// device name, is listed the device-plugin way (resource, plugin's ID);
// other drivers' devices, devices no claim allocation holds, and devices
// the container lists already are left alone. The view served over a
// socket in front of the kubelet sim runs in tests/proxy/dra_mode_test.cc.
#include "proxy/holders/pod_resources_view.h"

#include <grpcpp/grpcpp.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/events/event_log.h"
#include "proxy/kubelet_side/dra/device_names.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "proxy/state/state_store.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;

constexpr char kDriver[] = "gpu.vendor.com";
constexpr char kPool[] = "node-1/vendor.com-gpu";

void AddAllocation(state::State* s, uint64_t id, const std::string& device,
                   const std::string& claim) {
  state::Allocation* a = s->add_allocations();
  a->set_id(id);
  a->set_resource("vendor.com/gpu");
  a->add_device_ids(device);
  if (!claim.empty()) {
    a->mutable_claim()->set_namespace_("default");
    a->mutable_claim()->set_name(claim);
    a->mutable_claim()->set_uid("uid-" + claim);
  }
}

void AddClaimDevice(v1::ContainerResources* c, const std::string& claim,
                    const std::string& driver, const std::string& pool,
                    const std::string& device) {
  v1::DynamicResource* dr = nullptr;
  for (auto& existing : *c->mutable_dynamic_resources()) {
    if (existing.claim_name() == claim) dr = &existing;
  }
  if (dr == nullptr) {
    dr = c->add_dynamic_resources();
    dr->set_claim_name(claim);
    dr->set_claim_namespace("default");
  }
  v1::ClaimResource* cr = dr->add_claim_resources();
  cr->set_driver_name(driver);
  cr->set_pool_name(pool);
  cr->set_device_name(device);
}

std::vector<std::string> Devices(const v1::ContainerResources& c) {
  std::vector<std::string> out;
  for (const auto& d : c.devices()) {
    for (const std::string& id : d.device_ids()) out.push_back(d.resource_name() + " " + id);
  }
  return out;
}

TEST(PodResourcesViewTest, ClaimDevicesAreListedAsThePluginsDevices) {
  testing::ShortTempDir dir;
  state::State saved;
  AddAllocation(&saved, 1, "GPU-6F3A", "train");  // not a DNS label: a hashed DRA name
  AddAllocation(&saved, 2, "gpu-1", "train");
  AddAllocation(&saved, 3, "gpu-2", "");  // a pod of the extended resource
  saved.set_next_allocation_id(4);
  ASSERT_TRUE(FileStateStore(dir.Sub("state.pb")).Save(saved).ok());
  EventLog events{"test"};
  StateKeeper keeper(dir.Sub("state.pb"), &events);
  ASSERT_TRUE(keeper.Load().ok());
  const ClaimDeviceIndex index = ClaimDeviceIndex::From(keeper, kDriver, "node-1");

  v1::PodResources pod;
  pod.set_name("train");
  v1::ContainerResources* main = pod.add_containers();
  main->set_name("main");
  AddClaimDevice(main, "train", kDriver, kPool, DraDeviceName("GPU-6F3A"));
  AddClaimDevice(main, "train", "nic.vendor.com", "node-1/nic", "gpu-1");  // another driver's
  AddClaimDevice(main, "train", kDriver, "node-2/vendor.com-gpu", "gpu-1");  // another pool
  v1::ContainerResources* side = pod.add_containers();
  side->set_name("side");
  AddClaimDevice(side, "train", kDriver, kPool, "gpu-1");
  AddClaimDevice(side, "train", kDriver, kPool, "gpu-2");  // held by no claim
  v1::ContainerDevices* listed = side->add_devices();   // listed already
  listed->set_resource_name("vendor.com/gpu");
  listed->add_device_ids("gpu-1");

  EXPECT_EQ(AddClaimDevices(kDriver, index, &pod), 1);
  EXPECT_THAT(Devices(*main), ElementsAre("vendor.com/gpu GPU-6F3A"));
  EXPECT_THAT(Devices(*side), ElementsAre("vendor.com/gpu gpu-1"));
  // The kubelet's entries stay as they were.
  EXPECT_EQ(main->dynamic_resources(0).claim_resources_size(), 3);
  // Without a driver (no DRA side), nothing is added.
  EXPECT_EQ(AddClaimDevices("", index, &pod), 0);
}

v1beta1::Device Device(const std::string& id, const std::string& health, int numa = -1) {
  v1beta1::Device d;
  d.set_id(id);
  d.set_health(health);
  if (numa >= 0) d.mutable_topology()->add_nodes()->set_id(numa);
  return d;
}

// The node's allocatable devices: a resource served through DRA only is
// absent from the kubelet's answer, and one served both ways lacks the
// devices claims hold (Unhealthy to the device manager). Its Healthy
// devices the answer lacks are added, with their topology; nothing twice.
TEST(PodResourcesViewTest, DevicesOfResourcesServedThroughDraAreAllocatable) {
  v1::AllocatableResourcesResponse resp;
  v1::ContainerDevices* listed = resp.add_devices();
  listed->set_resource_name("vendor.com/gpu");
  listed->add_device_ids("gpu-0");
  DraResources resources = {
      {"vendor.com/gpu", DeviceList::FromDevices({Device("gpu-0", "Healthy"),
                                                  Device("gpu-1", "Healthy", 1),
                                                  Device("gpu-2", "Unhealthy")})},
      {"vendor.com/fpga", DeviceList::FromDevices({Device("f-0", "Healthy")})},
      {"vendor.com/nic", nullptr}};
  EXPECT_EQ(AddDraDevices(resources, &resp), 2);
  ASSERT_EQ(resp.devices_size(), 3);
  EXPECT_EQ(resp.devices(1).resource_name(), "vendor.com/gpu");
  EXPECT_THAT(resp.devices(1).device_ids(), ElementsAre("gpu-1"));
  ASSERT_EQ(resp.devices(1).topology().nodes_size(), 1);
  EXPECT_EQ(resp.devices(1).topology().nodes(0).id(), 1);
  EXPECT_EQ(resp.devices(2).resource_name(), "vendor.com/fpga");
  EXPECT_FALSE(resp.devices(2).has_topology());
  EXPECT_EQ(AddDraDevices(resources, &resp), 0);
}

// A 1.37 kubelet's pod-resources service, answering one pod with pod-level
// exclusive CPUs and memory (PodResources fields 4 and 5) and containers
// with their own, and allocatable memory.
class PodLevelKubelet final : public v1::PodResourcesLister::Service {
 public:
  static v1::PodResources Pod() {
    v1::PodResources pod;
    pod.set_name("train");
    pod.set_namespace_("default");
    pod.add_cpu_ids(2);
    pod.add_cpu_ids(3);
    v1::ContainerMemory* m = pod.add_memory();
    m->set_memory_type("hugepages-1Gi");
    m->set_size(2ull << 30);
    m->mutable_topology()->add_nodes()->set_id(1);
    v1::ContainerResources* c = pod.add_containers();
    c->set_name("main");
    c->add_cpu_ids(2);
    v1::ContainerMemory* cm = c->add_memory();
    cm->set_memory_type("memory");
    cm->set_size(1ull << 30);
    return pod;
  }
  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    *resp->add_pod_resources() = Pod();
    return grpc::Status::OK;
  }
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest*,
                   v1::GetPodResourcesResponse* resp) override {
    *resp->mutable_pod_resources() = Pod();
    return grpc::Status::OK;
  }
  grpc::Status GetAllocatableResources(grpc::ServerContext*,
                                       const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* resp) override {
    resp->add_cpu_ids(2);
    resp->add_cpu_ids(3);
    v1::ContainerMemory* m = resp->add_memory();
    m->set_memory_type("memory");
    m->set_size(8ull << 30);
    return grpc::Status::OK;
  }
};

// The view passes a 1.37 kubelet's pod-level exclusive CPUs and memory on
// unchanged, as it does the containers' own and the node's allocatable
// memory, over real sockets, whether or not it has a DRA driver to add
// devices for.
TEST(PodResourcesViewTest, PodLevelCpusAndMemoryPassUnchanged) {
  for (const std::string driver : {"", kDriver}) {
    testing::ShortTempDir dir;
    EventLog events{"test"};
    StateKeeper keeper(dir.Sub("state.pb"), &events);
    ASSERT_TRUE(keeper.Load().ok());
    PodLevelKubelet kubelet;
    grpc::ServerBuilder b;
    b.AddListeningPort(UnixAddress(dir.Sub("kubelet.sock")), grpc::InsecureServerCredentials());
    b.RegisterService(&kubelet);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    ASSERT_NE(server, nullptr);
    PodResourcesView view({dir.Sub("view.sock"), dir.Sub("kubelet.sock"), driver, "node-1", {}},
                          &keeper);
    ASSERT_TRUE(view.Start().ok());
    auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(dir.Sub("view.sock")));
    const std::string want = PodLevelKubelet::Pod().SerializeAsString();
    {
      grpc::ClientContext ctx;
      v1::ListPodResourcesResponse resp;
      ASSERT_TRUE(stub->List(&ctx, v1::ListPodResourcesRequest(), &resp).ok());
      ASSERT_EQ(resp.pod_resources_size(), 1);
      EXPECT_EQ(resp.pod_resources(0).SerializeAsString(), want) << resp.DebugString();
      EXPECT_THAT(resp.pod_resources(0).cpu_ids(), ElementsAre(2, 3));
      ASSERT_EQ(resp.pod_resources(0).memory_size(), 1);
      EXPECT_EQ(resp.pod_resources(0).memory(0).memory_type(), "hugepages-1Gi");
    }
    {
      grpc::ClientContext ctx;
      v1::GetPodResourcesRequest req;
      req.set_pod_name("train");
      req.set_pod_namespace("default");
      v1::GetPodResourcesResponse resp;
      ASSERT_TRUE(stub->Get(&ctx, req, &resp).ok());
      EXPECT_EQ(resp.pod_resources().SerializeAsString(), want) << resp.DebugString();
    }
    {
      grpc::ClientContext ctx;
      v1::AllocatableResourcesResponse resp;
      ASSERT_TRUE(
          stub->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &resp).ok());
      EXPECT_THAT(resp.cpu_ids(), ElementsAre(2, 3));
      ASSERT_EQ(resp.memory_size(), 1);
      EXPECT_EQ(resp.memory(0).size(), 8ull << 30);
    }
    view.Stop();
    server->Shutdown();
  }
}

}  // namespace
}  // namespace dpproxy
