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
#include "proxy/dra/cdi_spec.h"
#include "proxy/util/files.h"
#include "tests/proxy/proxy_harness.h"
#include "tools/apiserver_sim/apiserver_sim.h"

namespace dpproxy {
namespace {

using sample::SamplePlugin;
using sim::Personality;
using testing::ProxyHarness;
using ::testing::HasSubstr;
using Json = nlohmann::json;

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
  // A 1.34 kubelet: DRA v1 and the plugin watcher.
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
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

  // The kubelet's plugin watcher registers the driver, on DRA v1.
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait));
  ASSERT_TRUE(h.sim().dra_driver(kDriver).has_value());
  EXPECT_EQ(h.sim().dra_driver(kDriver)->service, "v1.DRAPlugin");
  EXPECT_TRUE(h.WaitFor([&] {
    for (const HealthCheck& c : h.proxy().Readiness()) {
      if (c.name == "dra-registered") return c.ok;
    }
    return false;
  }));
  ASSERT_TRUE(h.proxy().Status().dra.has_value());
  EXPECT_TRUE(h.proxy().Status().dra->registered);
  EXPECT_EQ(h.proxy().Status().dra->api_version, "resource.k8s.io/v1");
  EXPECT_EQ(h.proxy().Status().resources[0].kubelet_api, "dra (gpu.vendor.com)");

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
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");
  ASSERT_EQ((*prepared)[uid]["devices"].size(), 2u);
  // The claim's own CDI device, then the plugin's CDI names for the request.
  EXPECT_EQ((*prepared)[uid]["devices"][0]["cdi_device_ids"],
            Json({absl::StrCat(kDriver, "/claim=", uid, "-gpu"), "vendor.com/gpu=gpu-1",
                  "vendor.com/gpu=gpu-2"}));
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
  // The plugin's container annotation has no place in DRA: counted.
  EXPECT_EQ(h.proxy().losses().Count("vendor.com/gpu", "annotations"), 1);
  // The CDI spec carries what the plugin answered for those two devices.
  absl::StatusOr<std::string> spec =
      ReadFile(ClaimCdiSpecPath(dir.Sub("cdi"), kDriver, uid));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(*spec, HasSubstr("gpu-1"));
  EXPECT_THAT(*spec, HasSubstr("gpu-2"));
  // An unknown claim is that claim's error; the call succeeds.
  absl::StatusOr<Json> missing = h.sim().PrepareClaims(kDriver, {{"default", "absent", "u0"}});
  ASSERT_TRUE(missing.ok());
  EXPECT_THAT((*missing)["u0"]["error"].get<std::string>(), HasSubstr("not found"));

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

  // A 1.33 kubelet knows only v1beta1.DRAPlugin: it registers the driver
  // on that, and the prepared claim gets the same answer (no new Allocate).
  const size_t from = h.sim().events().Size();
  ASSERT_TRUE(h.sim().Restart(*sim::ParseKubeletVersion("1.33")).ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait, from));
  EXPECT_EQ(h.sim().dra_driver(kDriver)->service, "v1beta1.DRAPlugin");
  absl::StatusOr<Json> again = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[uid]["devices"], (*prepared)[uid]["devices"]);
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
  // The pod ends: unprepared, its CDI spec gone.
  absl::StatusOr<Json> un = h.sim().UnprepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(un.ok());
  EXPECT_EQ((*un)[uid]["error"], "");
  EXPECT_FALSE(PathExists(ClaimCdiSpecPath(dir.Sub("cdi"), kDriver, uid)));
}

}  // namespace
}  // namespace dpproxy
