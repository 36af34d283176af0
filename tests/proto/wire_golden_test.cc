// Golden byte encodings for at least one message of every service, worked out
// by hand from the field numbers of the kubelet's .proto files: a tag byte is
// (field_number << 3) | wire_type, wire type 0 = varint, 2 = length-delimited.
// If a field number or type in our .proto files drifts from the wire, these
// fail.
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"

namespace dpproxy {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

std::string Serialize(const google::protobuf::Message& m) {
  std::string out;
  EXPECT_TRUE(m.SerializeToString(&out));
  return out;
}

// --- deviceplugin (v1alpha, Kubernetes 1.9) -----------------------------------

TEST(WireGoldenTest, V1AlphaRegisterRequest) {
  deviceplugin::RegisterRequest r;
  r.set_version("v1alpha2");     // field 1, string: tag 0x0a
  r.set_endpoint("a.sock");      // field 2, string: tag 0x12
  r.set_resource_name("x.io/y");  // field 3, string: tag 0x1a
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 8, 'v', '1', 'a', 'l', 'p', 'h', 'a', '2',  //
                                 0x12, 6, 'a', '.', 's', 'o', 'c', 'k',            //
                                 0x1a, 6, 'x', '.', 'i', 'o', '/', 'y'}));
}

TEST(WireGoldenTest, V1AlphaAllocateRequestAndResponse) {
  deviceplugin::AllocateRequest req;
  req.add_devicesids("d0");  // field 1, repeated string
  EXPECT_EQ(Serialize(req), Bytes({0x0a, 2, 'd', '0'}));

  deviceplugin::AllocateResponse resp;
  (*resp.mutable_envs())["K"] = "V";  // field 1, map entry {1: key, 2: value}
  auto* m = resp.add_mounts();        // field 2
  m->set_read_only(true);             //   Mount.read_only = 3, varint: 0x18 0x01
  EXPECT_EQ(Serialize(resp), Bytes({0x0a, 6, 0x0a, 1, 'K', 0x12, 1, 'V',  //
                                    0x12, 2, 0x18, 1}));
}

TEST(WireGoldenTest, V1AlphaListAndWatchResponse) {
  deviceplugin::ListAndWatchResponse r;
  auto* d = r.add_devices();  // field 1
  d->set_id("g");             //   Device.ID = 1
  d->set_health("Healthy");   //   Device.health = 2
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 12, 0x0a, 1, 'g', 0x12, 7, 'H', 'e', 'a', 'l', 't',
                                 'h', 'y'}));
}

// --- v1beta1 --------------------------------------------------------------------

TEST(WireGoldenTest, V1Beta1RegisterRequestWithOptions) {
  v1beta1::RegisterRequest r;
  r.set_version("v1beta1");
  r.set_endpoint("e");
  r.set_resource_name("r");
  r.mutable_options()->set_pre_start_required(true);                   // 1: 0x08 0x01
  r.mutable_options()->set_get_preferred_allocation_available(true);  // 2: 0x10 0x01
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 7, 'v', '1', 'b', 'e', 't', 'a', '1',  //
                                 0x12, 1, 'e', 0x1a, 1, 'r',                  //
                                 0x22, 4, 0x08, 1, 0x10, 1}));
}

TEST(WireGoldenTest, V1Beta1DeviceWithTopology) {
  v1beta1::Device d;
  d.set_id("g");
  d.set_health("Healthy");
  d.mutable_topology()->add_nodes()->set_id(1);  // 3 -> TopologyInfo{1 -> NUMANode{1: 1}}
  EXPECT_EQ(Serialize(d), Bytes({0x0a, 1, 'g', 0x12, 7, 'H', 'e', 'a', 'l', 't', 'h', 'y',
                                 0x1a, 4, 0x0a, 2, 0x08, 1}));
}

TEST(WireGoldenTest, V1Beta1AllocateRequest) {
  v1beta1::AllocateRequest r;
  r.add_container_requests()->add_devices_ids("d0");  // 1 -> ContainerAllocateRequest{1}
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 4, 0x0a, 2, 'd', '0'}));
}

TEST(WireGoldenTest, V1Beta1ContainerAllocateResponseAllFields) {
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_envs())["K"] = "V";                 // 1
  r.add_mounts()->set_host_path("/h");            // 2 -> Mount.host_path = 2
  r.add_devices()->set_permissions("rw");         // 3 -> DeviceSpec.permissions = 3
  (*r.mutable_annotations())["A"] = "B";          // 4
  r.add_cdi_devices()->set_name("v.io/g=0");      // 5 -> CDIDevice.name = 1
  EXPECT_EQ(Serialize(r),
            Bytes({0x0a, 6, 0x0a, 1, 'K', 0x12, 1, 'V',              //
                   0x12, 4, 0x12, 2, '/', 'h',                       //
                   0x1a, 4, 0x1a, 2, 'r', 'w',                       //
                   0x22, 6, 0x0a, 1, 'A', 0x12, 1, 'B',              //
                   0x2a, 10, 0x0a, 8, 'v', '.', 'i', 'o', '/', 'g', '=', '0'}));
}

TEST(WireGoldenTest, V1Beta1PreferredAllocationRequest) {
  v1beta1::PreferredAllocationRequest r;
  auto* c = r.add_container_requests();
  c->add_available_deviceids("a");    // 1
  c->add_must_include_deviceids("a");  // 2
  c->set_allocation_size(1);           // 3, int32 varint
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 8, 0x0a, 1, 'a', 0x12, 1, 'a', 0x18, 1}));
}

TEST(WireGoldenTest, V1Beta1PreStartContainerRequest) {
  v1beta1::PreStartContainerRequest r;
  r.add_devices_ids("d");  // 1
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 1, 'd'}));
}

TEST(WireGoldenTest, V1AlphaResponseParsesAsV1Beta1ContainerResponse) {
  // Same numbers for envs/mounts/devices/annotations (the v1beta1 API):
  // the kubelet's checkpoint relies on this, and so may a translator.
  deviceplugin::AllocateResponse a;
  (*a.mutable_envs())["K"] = "V";
  a.add_devices()->set_host_path("/dev/x");
  v1beta1::ContainerAllocateResponse b;
  ASSERT_TRUE(b.ParseFromString(Serialize(a)));
  EXPECT_EQ(b.envs().at("K"), "V");
  ASSERT_EQ(b.devices_size(), 1);
  EXPECT_EQ(b.devices(0).host_path(), "/dev/x");
}

// --- pluginregistration -------------------------------------------------------------

TEST(WireGoldenTest, PluginInfo) {
  pluginregistration::PluginInfo i;
  i.set_type("DevicePlugin");          // 1
  i.set_name("x.io/y");                // 2
  i.set_endpoint("/s");                // 3
  i.add_supported_versions("v1beta1");  // 4
  EXPECT_EQ(Serialize(i),
            Bytes({0x0a, 12, 'D', 'e', 'v', 'i', 'c', 'e', 'P', 'l', 'u', 'g', 'i', 'n',  //
                   0x12, 6, 'x', '.', 'i', 'o', '/', 'y',                                //
                   0x1a, 2, '/', 's',                                                    //
                   0x22, 7, 'v', '1', 'b', 'e', 't', 'a', '1'}));
}

TEST(WireGoldenTest, RegistrationStatus) {
  pluginregistration::RegistrationStatus s;
  s.set_plugin_registered(true);  // 1, bool
  s.set_error("e");               // 2
  EXPECT_EQ(Serialize(s), Bytes({0x08, 1, 0x12, 1, 'e'}));
}

// --- podresources (package v1) ---------------------------------------------------------

TEST(WireGoldenTest, ListPodResourcesResponse) {
  v1::ListPodResourcesResponse r;
  auto* p = r.add_pod_resources();  // 1
  p->set_name("p");                 // 1
  p->set_namespace_("n");           // 2
  auto* c = p->add_containers();    // 3
  c->set_name("c");                 // 1
  auto* d = c->add_devices();       // 2
  d->set_resource_name("r");        // 1
  d->add_device_ids("d");           // 2
  // ContainerDevices = 0a 01 72 12 01 64 (6 bytes)
  // ContainerResources = 0a 01 63 12 06 <6> (3 + 2 + 6 = 11 bytes)
  // PodResources = 0a 01 70 12 01 6e 1a 0b <11> (3 + 3 + 2 + 11 = 19 bytes)
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 19, 0x0a, 1, 'p', 0x12, 1, 'n', 0x1a, 11, 0x0a, 1, 'c',
                                 0x12, 6, 0x0a, 1, 'r', 0x12, 1, 'd'}));
}

// A DRA claim's device in a container (1.34+): dynamic_resources is the
// container's field 5; a DynamicResource starts at field 2 (1 is gone).
TEST(WireGoldenTest, ContainerDynamicResources) {
  v1::ContainerResources c;
  c.set_name("c");                              // 1
  auto* dr = c.add_dynamic_resources();         // 5
  dr->set_claim_name("k");                      // 2
  dr->set_claim_namespace("n");                 // 3
  auto* cr = dr->add_claim_resources();         // 4
  cr->add_cdi_devices()->set_name("x");         // 1 -> {1: "x"}
  cr->set_driver_name("d");                     // 2
  cr->set_pool_name("p");                       // 3
  cr->set_device_name("g");                     // 4
  // ClaimResource = 0a 03 0a 01 78 12 01 64 1a 01 70 22 01 67 (14 bytes)
  // DynamicResource = 12 01 6b 1a 01 6e 22 0e <14> (22 bytes)
  EXPECT_EQ(Serialize(c), Bytes({0x0a, 1, 'c', 0x2a, 22, 0x12, 1, 'k', 0x1a, 1, 'n', 0x22, 14,
                                 0x0a, 3, 0x0a, 1, 'x', 0x12, 1, 'd', 0x1a, 1, 'p', 0x22, 1,
                                 'g'}));
}

TEST(WireGoldenTest, AllocatableResourcesResponseWithTopology) {
  v1::AllocatableResourcesResponse r;
  auto* d = r.add_devices();                      // 1
  d->set_resource_name("r");                      // 1
  d->mutable_topology()->add_nodes()->set_id(2);  // 3 -> {1 -> {1: 2}}
  r.add_cpu_ids(3);                               // 2, packed repeated int64: 0x12 len 3
  EXPECT_EQ(Serialize(r), Bytes({0x0a, 9, 0x0a, 1, 'r', 0x1a, 4, 0x0a, 2, 0x08, 2,  //
                                 0x12, 1, 3}));
}

// --- Service and method names (the gRPC paths) ----------------------------------------

std::vector<std::string> Methods(const google::protobuf::ServiceDescriptor* s) {
  std::vector<std::string> out;
  for (int i = 0; i < s->method_count(); ++i) {
    out.push_back("/" + s->full_name() + "/" + s->method(i)->name());
  }
  return out;
}

TEST(WireGoldenTest, ServicePaths) {
  using ::testing::ElementsAre;
  const auto* alpha = deviceplugin::RegisterRequest::descriptor()->file();
  EXPECT_THAT(Methods(alpha->FindServiceByName("Registration")),
              ElementsAre("/deviceplugin.Registration/Register"));
  EXPECT_THAT(Methods(alpha->FindServiceByName("DevicePlugin")),
              ElementsAre("/deviceplugin.DevicePlugin/ListAndWatch",
                          "/deviceplugin.DevicePlugin/Allocate"));
  const auto* beta = v1beta1::RegisterRequest::descriptor()->file();
  EXPECT_THAT(Methods(beta->FindServiceByName("Registration")),
              ElementsAre("/v1beta1.Registration/Register"));
  EXPECT_THAT(Methods(beta->FindServiceByName("DevicePlugin")),
              ElementsAre("/v1beta1.DevicePlugin/GetDevicePluginOptions",
                          "/v1beta1.DevicePlugin/ListAndWatch",
                          "/v1beta1.DevicePlugin/GetPreferredAllocation",
                          "/v1beta1.DevicePlugin/Allocate",
                          "/v1beta1.DevicePlugin/PreStartContainer"));
  const auto* reg = pluginregistration::PluginInfo::descriptor()->file();
  EXPECT_THAT(Methods(reg->FindServiceByName("Registration")),
              ElementsAre("/pluginregistration.Registration/GetInfo",
                          "/pluginregistration.Registration/NotifyRegistrationStatus"));
  const auto* pr = v1::ListPodResourcesRequest::descriptor()->file();
  EXPECT_THAT(Methods(pr->FindServiceByName("PodResourcesLister")),
              ElementsAre("/v1.PodResourcesLister/List",
                          "/v1.PodResourcesLister/GetAllocatableResources",
                          "/v1.PodResourcesLister/Get"));
  // The stream flag matters on the wire too.
  EXPECT_TRUE(beta->FindServiceByName("DevicePlugin")
                  ->FindMethodByName("ListAndWatch")
                  ->server_streaming());
  EXPECT_TRUE(alpha->FindServiceByName("DevicePlugin")
                  ->FindMethodByName("ListAndWatch")
                  ->server_streaming());
}

}  // namespace
}  // namespace dpproxy
