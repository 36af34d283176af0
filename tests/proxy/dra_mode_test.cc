// dpproxy in DRA mode end to end: a v1beta1 sample plugin registers at
// dpproxy as at a kubelet; dpproxy publishes its devices as ResourceSlices
// in the API-server simulator (over HTTP, found through a kubeconfig),
// registers as a DRA driver through the plugin watcher, and prepares a
// claim the scheduler allocated by calling the plugin's Allocate and
// writing a CDI spec. The kubelet sim never sees a device plugin.
#include <grpcpp/client_context.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/dra/cdi_spec.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tests/proxy/proxy_harness.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using sample::SamplePlugin;
using sim::Personality;
using testing::ProxyHarness;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;
namespace drav1 = ::k8s::io::kubelet::pkg::apis::dra::v1;

constexpr char kDriver[] = "gpu.vendor.com";
constexpr char kPool[] = "node-1/vendor.com-gpu";

int PublishedDevices(sim::ApiServerSim& api, std::set<std::string>* names = nullptr) {
  int n = 0;
  for (const auto& [slice, s] : api.Slices()) {
    for (const Json& d : s["spec"]["devices"]) {
      ++n;
      if (names != nullptr) names->insert(d["name"].get<std::string>());
    }
  }
  return n;
}

TEST(DraModeTest, APluginsDevicesArePublishedAndItsClaimsPrepared) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  const std::string kubeconfig = dir.Sub("kubeconfig");
  ASSERT_TRUE(WriteFileAtomic(kubeconfig, absl::StrCat(R"(current-context: node
contexts: [{name: node, context: {cluster: sim, user: agent}}]
clusters: [{name: sim, cluster: {server: ")", api.url(), R"("}}]
users: [{name: agent, user: {token: node-token}}]
)")).ok());
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    c.dra.enabled = true;
    c.dra.driver = kDriver;
    c.dra.node_name = "node-1";
    c.dra.kubeconfig = kubeconfig;
    c.dra.cdi_dir = dir.Sub("cdi");
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  SamplePlugin* plugin = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_NE(plugin, nullptr);

  // The devices reach the API server as the driver's pool.
  std::set<std::string> names;
  ASSERT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }));
  PublishedDevices(api, &names);
  EXPECT_EQ(names, (std::set<std::string>{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}));
  const Json slice = api.Slices().begin()->second;
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["spec"]["driver"], kDriver);
  EXPECT_EQ(slice["spec"]["pool"]["name"], kPool);
  // No device plugin reached the kubelet: it would win over DRA.
  EXPECT_TRUE(h.sim().GetState().resources().empty());
  // Each write counted: at least the one with the four devices.
  EXPECT_TRUE(h.WaitFor([&] {
    const std::string text = h.MetricsText();
    const std::string key =
        "dpproxy_dra_pool_writes_total{resource=\"vendor.com/gpu\",result=\"ok\"} ";
    const size_t at = text.find(key);
    return at != std::string::npos && std::atof(text.c_str() + at + key.size()) >= 1;
  }));

  // The kubelet's plugin watcher registers the driver.
  const std::string reg_socket =
      absl::StrCat(h.config().kubelet.kubelet_root, "/plugins_registry/", kDriver, "-reg.sock");
  auto reg = pluginregistration::Registration::NewStub(MakeUnixChannel(reg_socket));
  grpc::ClientContext info_ctx;
  pluginregistration::PluginInfo info;
  ASSERT_TRUE(reg->GetInfo(&info_ctx, pluginregistration::InfoRequest(), &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  grpc::ClientContext notify_ctx;
  pluginregistration::RegistrationStatus st;
  st.set_plugin_registered(true);
  pluginregistration::RegistrationStatusResponse ignored;
  ASSERT_TRUE(reg->NotifyRegistrationStatus(&notify_ctx, st, &ignored).ok());
  bool ready = false;
  for (const HealthCheck& c : h.proxy().Readiness()) {
    if (c.name == "dra-registered") ready = c.ok;
  }
  EXPECT_TRUE(ready);

  // The scheduler allocated two devices to a claim; the kubelet prepares it.
  Json claim = {{"metadata", {{"namespace", "default"}, {"name", "train"}}},
                {"status",
                 {{"allocation",
                   {{"devices",
                     {{"results",
                       {{{"request", "gpu"}, {"driver", kDriver}, {"pool", kPool},
                         {"device", "gpu-1"}},
                        {{"request", "gpu"}, {"driver", kDriver}, {"pool", kPool},
                         {"device", "gpu-2"}}}}}}}}}}};
  const std::string uid = api.PutClaim(claim)["metadata"]["uid"];
  auto dra = drav1::DRAPlugin::NewStub(MakeUnixChannel(info.endpoint()));
  drav1::NodePrepareResourcesRequest req;
  auto* c = req.add_claims();
  c->set_namespace_("default");
  c->set_name("train");
  c->set_uid(uid);
  grpc::ClientContext prep_ctx;
  drav1::NodePrepareResourcesResponse resp;
  ASSERT_TRUE(dra->NodePrepareResources(&prep_ctx, req, &resp).ok());
  const auto& prepared = resp.claims().at(uid);
  ASSERT_EQ(prepared.error(), "");
  ASSERT_EQ(prepared.devices_size(), 2);
  // The claim's own CDI device, then the plugin's CDI names for the request.
  EXPECT_THAT(prepared.devices(0).cdi_device_ids(),
              ElementsAre(absl::StrCat(kDriver, "/claim=", uid, "-gpu"), "vendor.com/gpu=gpu-1",
                          "vendor.com/gpu=gpu-2"));
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
  // The CDI spec carries what the plugin answered for those two devices.
  absl::StatusOr<std::string> spec =
      ReadFile(ClaimCdiSpecPath(dir.Sub("cdi"), kDriver, uid));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(*spec, HasSubstr("gpu-1"));
  EXPECT_THAT(*spec, HasSubstr("gpu-2"));

  // A device turns Unhealthy: it leaves the pool, at the next generation.
  const int64_t generation = api.Slices().begin()->second["spec"]["pool"]["generation"];
  ASSERT_TRUE(plugin->SetHealth("gpu-3", "Unhealthy").ok());
  EXPECT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 3; }));
  EXPECT_EQ(api.Slices().begin()->second["spec"]["pool"]["generation"], generation + 1);

  // A kubelet start deletes the node's slices: dpproxy publishes them again
  // (within its 30 s full pass; woken here by the next device change).
  ASSERT_EQ(api.DeleteSlicesOfNode("node-1"), 1);
  ASSERT_TRUE(plugin->SetHealth("gpu-3", "Healthy").ok());
  EXPECT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }));
}

}  // namespace
}  // namespace dpproxy
