// dpproxy in DRA mode end to end: a v1beta1 sample plugin registers at
// dpproxy as at a kubelet; dpproxy publishes its devices as ResourceSlices
// in the API-server simulator (over HTTP, found through a kubeconfig),
// registers as a DRA driver through the plugin watcher, and prepares a
// claim the scheduler allocated by calling the plugin's Allocate and
// writing a CDI spec. The kubelet sim never sees a device plugin.
#include <grpcpp/client_context.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/kubelet_side/dra/cdi_spec.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tests/proxy/proxy_harness.h"
#include "tools/dpctl/control_commands.h"
#include "proxy/kube/kube_client.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/extended_pods.h"

namespace dpproxy {
namespace {

using sample::SamplePlugin;
using sim::Personality;
using testing::ProxyHarness;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kDriver[] = "gpu.vendor.com";
constexpr char kPool[] = "node-1/vendor.com-gpu";
constexpr absl::Duration kApiWait = absl::Seconds(30);  // past a few 1 s-doubling retries

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

// The names of the devices published now.
std::set<std::string> PoolNames(sim::ApiServerSim& api) {
  std::set<std::string> names;
  PublishedDevices(api, &names);
  return names;
}

// A kubeconfig naming the simulator, for dpproxy and for the kubelet sim.
std::string WriteKubeconfig(const testing::ShortTempDir& dir, const sim::ApiServerSim& api) {
  const std::string path = dir.Sub("kubeconfig");
  EXPECT_TRUE(WriteFileAtomic(path, absl::StrCat(R"(current-context: node
contexts: [{name: node, context: {cluster: sim, user: agent}}]
clusters: [{name: sim, cluster: {server: ")", api.url(), R"("}}]
users: [{name: agent, user: {token: node-token}}]
)")).ok());
  return path;
}

// dpproxy in DRA mode for driver kDriver on node-1, its CDI specs in
// <dir>/cdi; the kubelet sim resolves CDI names there and deletes the
// node's slices at each start.
// Its waits look again at each request the API server answers too.
// `paths` set: DRA for those resources only (ProxyConfig::paths).
// `sim_tweak` changes the simulated kubelet's options last.
std::unique_ptr<ProxyHarness> DraHarness(
    sim::ApiServerSim& api, const std::string& kubeconfig, const std::string& cdi,
    Personality personality = Personality::kV1Beta1Sync,
    std::map<std::string, KubeletPath> paths = {},
    std::function<void(sim::KubeletSimOptions&)> sim_tweak = nullptr) {
  auto h = std::make_unique<ProxyHarness>(
      personality, false,
      [&](ProxyConfig& c) {
        c.dra.enabled = paths.empty();
        c.paths = paths;
        c.dra.driver = kDriver;
        c.dra.node_name = "node-1";
        c.dra.kubeconfig = kubeconfig;
        c.dra.cdi_dir = cdi;
      },
      [&](sim::KubeletSimOptions& so) {
        so.cdi_dirs = {cdi};
        so.kubeconfig = kubeconfig;
        so.node_name = "node-1";
        if (sim_tweak) sim_tweak(so);
      });
  h->Watch(api.events());
  return h;
}

// The kubelet sim as `release`, dpproxy, and a v1beta1 sample plugin behind
// it; nullptr (with the failure reported) if one did not start.
SamplePlugin* StartNode(ProxyHarness& h, const std::string& release) {
  const bool up = h.sim().Start().ok() &&
                  h.sim().Restart(*sim::ParseKubeletVersion(release)).ok() &&
                  h.proxy().Start().ok();
  EXPECT_TRUE(up) << "kubelet " << release << " or dpproxy did not start";
  return up ? h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)) : nullptr;
}

// A node serving vendor.com/gpu both ways, for the tests that run pods
// over both paths: reconciliation frees a gone pod's devices at its second
// pass (after a start grace of 3 s: pod lists are empty just after a
// start), the kubelet sim as `release`, and a v1beta1 sample plugin with
// `devices` devices, all published, Healthy at the kubelet, and the driver
// registered. nullptr (the failure reported) if one did not come up.
SamplePlugin* StartBothWaysNode(ProxyHarness& h, sim::ApiServerSim& api,
                                const std::string& release, int devices,
                                const std::function<void(ProxyConfig&)>& tweak = nullptr) {
  h.RestartProxy([&](ProxyConfig& c) {
    c.reconcile_grace = absl::ZeroDuration();
    c.reconcile_start_grace = absl::Seconds(3);
    if (tweak) tweak(c);
  });
  const bool up = h.sim().Start().ok() &&
                  h.sim().Restart(*sim::ParseKubeletVersion(release)).ok() &&
                  h.proxy().Start().ok();
  EXPECT_TRUE(up) << "kubelet " << release << " or dpproxy did not start";
  if (!up) return nullptr;
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = devices;
  SamplePlugin* plugin = h.StartPlugin(o);
  const std::string last = absl::StrCat("gpu-", devices - 1);
  const bool ready =
      plugin != nullptr && h.WaitFor([&] { return PublishedDevices(api) == devices; }) &&
      h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", last) == "Healthy"; }) &&
      h.sim()
          .events()
          .WaitForEvent("dra_driver_registered", {{"driver", kDriver}}, testing::kWait)
          .has_value();
  EXPECT_TRUE(ready) << "the plugin, its pool or the driver did not come up";
  return ready ? plugin : nullptr;
}

Json Claim(const std::string& name, const std::vector<std::string>& devices) {
  Json results = Json::array();
  for (const std::string& d : devices) {
    results.push_back({{"request", "gpu"}, {"driver", kDriver}, {"pool", kPool}, {"device", d}});
  }
  return {{"metadata", {{"namespace", "default"}, {"name", name}}},
          {"status", {{"allocation", {{"devices", {{"results", results}}}}}}}};
}

HealthCheck Check(ProxyServer& proxy, const std::string& name) {
  for (const HealthCheck& c : proxy.Readiness()) {
    if (c.name == name) return c;
  }
  return HealthCheck{};
}

// The scheduler places a claim on a node as soon as the node's slices list
// its devices, and the kubelet prepares it at once. A pool published
// before the kubelet registered the driver (its plugin watcher registers
// up to a second after the socket appears) has that prepare fail with
// "DRA driver ... is not registered", which a real kubelet retries only at
// the pod's next resync, about a minute later. The devices are published
// once the kubelet has registered the driver.
TEST(DraModeTest, APodScheduledOnTheFirstSlicesIsPreparedAtOnce) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  // A slow plugin watcher, so that the order does not depend on where in
  // its second the registration socket appeared.
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync, {},
                 [](sim::KubeletSimOptions& so) { so.watcher_period = absl::Seconds(3); });
  ProxyHarness& h = *harness;
  ASSERT_NE(StartNode(h, "1.36"), nullptr);
  ASSERT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }));
  const std::string uid = api.PutClaim(Claim("first", {"gpu-1"}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "first", uid}});
  ASSERT_TRUE(prepared.ok()) << "the pool was published before the kubelet registered the "
                                "driver: "
                             << prepared.status();
  EXPECT_EQ((*prepared)[uid]["error"], "");
  EXPECT_EQ((*prepared)[uid]["devices"].size(), 1u);
}

TEST(DraModeTest, APluginsDevicesArePublishedAndItsClaimsPrepared) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"));
  ProxyHarness& h = *harness;
  // A 1.34 kubelet: DRA v1 and the plugin watcher.
  SamplePlugin* plugin = StartNode(h, "1.34");
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
  EXPECT_EQ(h.proxy().Status().resources[0].kubelet_socket, "");  // none served
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(h.dir("k/device-plugins"), ec)) {
    EXPECT_FALSE(absl::StartsWith(f.path().filename().string(), "dpproxy-")) << f.path();
  }

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
  const std::string absent = "0badc0de-0000-4000-8000-000000000000";
  absl::StatusOr<Json> missing = h.sim().PrepareClaims(kDriver, {{"default", "absent", absent}});
  ASSERT_TRUE(missing.ok());
  EXPECT_THAT((*missing)[absent]["error"].get<std::string>(), HasSubstr("not found"));

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

// One resource served both ways at once (paths: both): the kubelet sees
// its device plugin and the API server the driver's pool. Each device has
// one holder. A device a claim holds turns Unhealthy for the kubelet's
// device manager only (the claim keeps it in the pool), and one a pod of
// the extended resource holds leaves the pool only (the kubelet keeps
// seeing it Healthy). A kubelet or a claim asking for a device the other
// path holds anyway is refused with the holder named. The reconciler,
// which knows only the device manager's pods, leaves the claim alone.
TEST(DraModeTest, AResourceServedBothWaysHasOneHolderPerDevice) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync,
                 {{"vendor.com/gpu", KubeletPath::kBoth}});
  ProxyHarness& h = *harness;
  SamplePlugin* plugin = StartNode(h, "1.34");
  ASSERT_NE(plugin, nullptr);
  const std::set<std::string> all = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == all; }));
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy"; }));
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait));
  ASSERT_TRUE(h.WaitFor([&] {
    return h.proxy().Status().resources.size() == 1 &&
           h.proxy().Status().resources[0].kubelet_api == "v1beta1 + dra (gpu.vendor.com)";
  }));
  const std::string socket = h.proxy().Status().resources[0].kubelet_socket;
  ASSERT_NE(socket, "");

  // A claim holds gpu-1: the device manager sees it Unhealthy, the pool
  // keeps it.
  const std::string uid = api.PutClaim(Claim("train", {"gpu-1"}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-1") == "Unhealthy"; }));
  EXPECT_EQ(h.KubeletHealth("vendor.com/gpu", "gpu-0"), "Healthy");
  EXPECT_EQ(PoolNames(api), all);
  // So the kubelet admits no pod onto it: four do not fit, one does.
  EXPECT_FALSE(
      h.sim().Allocate(testing::PodRequest("all-four", {{"c", 4}}, "vendor.com/gpu")).ok());
  absl::StatusOr<sim::AllocateResponse> one =
      h.sim().Allocate(testing::PodRequest("one", {{"c", 1}}, "vendor.com/gpu"));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->allocations_size(), 1);
  const std::string pods = one->allocations(0).device_ids(0);
  ASSERT_NE(pods, "gpu-1");
  // The pod's device leaves the pool; the kubelet still sees it Healthy.
  std::set<std::string> rest = all;
  rest.erase(pods);
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == rest; }));
  EXPECT_EQ(h.KubeletHealth("vendor.com/gpu", pods), "Healthy");
  // Status says which path holds how many.
  const ResourceStatus status = h.proxy().Status().resources.at(0);
  EXPECT_EQ(status.path, "both");
  EXPECT_EQ(status.devices_held_by_claims, 1);
  EXPECT_EQ(status.devices_held_by_pods, 1);
  EXPECT_THAT(StatusTable(h.proxy().Status()),
              HasSubstr("^ held through DRA claims: 1 device(s), Unhealthy to the device "
                        "manager; by pods of the extended resource: 1, out of the DRA pool"));
  EXPECT_EQ(plugin->Status().allocate_calls(), 2);

  // Asked anyway (a kubelet or a scheduler that has not seen the change
  // yet): refused, naming the holder, and the plugin is not called.
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-1");
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status refused =
      v1beta1::DevicePlugin::NewStub(MakeUnixChannel(socket))->Allocate(&ctx, req, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(),
              HasSubstr(absl::StrCat("device gpu-1 of vendor.com/gpu is held by DRA claim "
                                     "default/train (UID ", uid, ")")));
  const std::string uid2 = api.PutClaim(Claim("infer", {pods}))["metadata"]["uid"];
  absl::StatusOr<Json> claimed = h.sim().PrepareClaims(kDriver, {{"default", "infer", uid2}});
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_THAT((*claimed)[uid2]["error"].get<std::string>(),
              HasSubstr(absl::StrCat("device ", pods, " of vendor.com/gpu is held by")));
  EXPECT_THAT((*claimed)[uid2]["error"].get<std::string>(),
              HasSubstr("a pod of the extended resource"));
  EXPECT_EQ(plugin->Status().allocate_calls(), 2);

  // Reconciliation lists the pod, not the claim, which keeps its device.
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  absl::StatusOr<Json> again = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[uid]["devices"], (*prepared)[uid]["devices"]);
  EXPECT_EQ(h.KubeletHealth("vendor.com/gpu", "gpu-1"), "Unhealthy");
  EXPECT_EQ(plugin->Status().allocate_calls(), 2);  // kept, not allocated again

  // The claim's pod ends: gpu-1 is the device manager's to give again.
  absl::StatusOr<Json> un = h.sim().UnprepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(un.ok());
  EXPECT_EQ((*un)[uid]["error"], "");
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-1") == "Healthy"; }));
  EXPECT_EQ(PoolNames(api), rest);
}

// A resource moves from the device plugin to DRA and back, a restart of
// dpproxy at each step, with pods running on each path and no drain. The
// pod of the extended resource keeps its devices (never offered to a claim
// while it runs), the claim keeps its own (never offered to the device
// manager while prepared), and each is given to the other path only once
// its holder ended: the pod found gone by reconciliation, the claim
// unprepared.
TEST(DraModeTest, AResourceMovesBetweenPathsWithPodsRunningOnEach) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync,
                 {{"vendor.com/gpu", KubeletPath::kDevicePlugin}});
  ProxyHarness& h = *harness;
  SamplePlugin* plugin = StartNode(h, "1.34");
  ASSERT_NE(plugin, nullptr);
  auto restart_as = [&](KubeletPath path) {
    const size_t from = h.sim().events().Size();
    h.RestartProxy([&](ProxyConfig& c) {
      // One side only, or both.
      c.dra.enabled = path == KubeletPath::kDra;
      c.paths.clear();
      if (path == KubeletPath::kBoth) c.paths = {{"vendor.com/gpu", path}};
      c.reconcile_grace = absl::ZeroDuration();
    });
    ASSERT_TRUE(h.proxy().Start().ok());
    if (path != KubeletPath::kDevicePlugin) {
      ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                                testing::kWait, from));
    }
  };
  // Device plugin only: a pod holds two devices; nothing is published.
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy"; }));
  absl::StatusOr<sim::AllocateResponse> legacy =
      h.sim().Allocate(testing::PodRequest("legacy", {{"c", 2}}, "vendor.com/gpu"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  const std::vector<std::string> held = testing::DeviceIdsOf(legacy->allocations(0));
  ASSERT_EQ(held.size(), 2u);
  EXPECT_TRUE(PoolNames(api).empty());

  // Both: the pool offers the two devices the pod does not hold; a claim
  // takes one, which the device manager then sees Unhealthy.
  restart_as(KubeletPath::kBoth);
  std::set<std::string> free = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};
  for (const std::string& d : held) free.erase(d);
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == free; }));
  const std::string claimed = *free.begin();
  const std::string uid = api.PutClaim(Claim("train", {claimed}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");
  // (Once the new dpproxy's list reached the kubelet: until then it counts
  // every device unhealthy, as at any restart.)
  EXPECT_TRUE(h.WaitFor([&] {
    return h.KubeletHealth("vendor.com/gpu", claimed) == "Unhealthy" &&
           h.KubeletHealth("vendor.com/gpu", held[0]) == "Healthy" &&
           h.KubeletHealth("vendor.com/gpu", held[1]) == "Healthy";
  }));

  // DRA only: no device plugin any more; the pod runs on, and its devices
  // stay out of the pool while it does.
  restart_as(KubeletPath::kDra);
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == free; }));
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  EXPECT_EQ(PoolNames(api), free);
  // The pod ends: reconciliation releases its devices to the pool.
  ASSERT_TRUE(h.sim().DeletePod(legacy->pod_uid()).ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  EXPECT_TRUE(h.WaitFor(
      [&] { return PoolNames(api) == std::set<std::string>{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}; }));

  // Back to the device plugin with the claim's pod running: its device is
  // Unhealthy to the device manager until the claim is unprepared, which
  // needs the DRA side (both).
  restart_as(KubeletPath::kDevicePlugin);
  ASSERT_TRUE(h.WaitFor([&] {
    return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy" ||
           h.KubeletHealth("vendor.com/gpu", "gpu-0") == "Healthy";
  }));
  EXPECT_TRUE(
      h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", claimed) == "Unhealthy"; }));
  EXPECT_FALSE(
      h.sim().Allocate(testing::PodRequest("too-many", {{"c", 4}}, "vendor.com/gpu")).ok());
  restart_as(KubeletPath::kBoth);
  EXPECT_TRUE(
      h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", claimed) == "Unhealthy"; }));
  absl::StatusOr<Json> un = h.sim().UnprepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(un.ok());
  EXPECT_EQ((*un)[uid]["error"], "");
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", claimed) == "Healthy"; }));
  restart_as(KubeletPath::kDevicePlugin);
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy"; }));
  absl::StatusOr<sim::AllocateResponse> all =
      h.sim().Allocate(testing::PodRequest("all", {{"c", 4}}, "vendor.com/gpu"));
  EXPECT_TRUE(all.ok()) << all.status();
  // One Allocate per holder: the pod's, the claim's, the last pod's.
  EXPECT_EQ(plugin->Status().allocate_calls(), 3);
}

// The first step of the move, device plugin to both, by a takeover
// (--takeover) instead of a restart: the pod keeps its device and runs on,
// and the new dpproxy publishes the pool without it and prepares claims.
TEST(DraModeTest, AResourceGoesBothWaysByATakeover) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync,
                 {{"vendor.com/gpu", KubeletPath::kDevicePlugin}});
  ProxyHarness& h = *harness;
  h.RestartProxy([](ProxyConfig& c) { c.dra.enabled = false; c.paths.clear(); });
  SamplePlugin* plugin = StartNode(h, "1.34");
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy"; }));
  absl::StatusOr<sim::AllocateResponse> legacy =
      h.sim().Allocate(testing::PodRequest("legacy", {{"c", 1}}, "vendor.com/gpu"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  const std::string pods = legacy->allocations(0).device_ids(0);

  const size_t from = h.sim().events().Size();
  ASSERT_TRUE(h.TakeOver(nullptr, [](ProxyConfig& c) {
                 c.paths = {{"vendor.com/gpu", KubeletPath::kBoth}};
               }).ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait, from));
  std::set<std::string> rest = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};
  rest.erase(pods);
  EXPECT_TRUE(h.WaitFor([&] { return PoolNames(api) == rest; }));
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", pods) == "Healthy"; }));
  const std::string claimed = *rest.begin();
  const std::string uid = api.PutClaim(Claim("train", {claimed}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ((*prepared)[uid]["error"], "");
  EXPECT_TRUE(
      h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", claimed) == "Unhealthy"; }));
  EXPECT_EQ(h.sim().GetState().pods(0).phase(), "Running");
}

// The same move by reloads (SIGHUP), where dpproxy runs both sides: no
// restart, and the vendor plugin's stream to dpproxy stays as it is. The
// pod of the extended resource runs on while its resource leaves the
// device manager; the claim's device stays out of the device manager's
// reach while its resource leaves DRA, and unprepares.
TEST(DraModeTest, AResourceMovesBetweenPathsByReloads) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync,
                 {{"vendor.com/gpu", KubeletPath::kBoth}});
  ProxyHarness& h = *harness;
  SamplePlugin* plugin = StartNode(h, "1.34");
  ASSERT_NE(plugin, nullptr);
  auto reload_as = [&](KubeletPath path) {
    ProxyConfig next = h.config();
    next.paths = {{"vendor.com/gpu", path}};
    const ProxyServer::ReloadResult r = h.proxy().Reload(next);
    EXPECT_THAT(r.applied, ::testing::ElementsAre(HasSubstr("paths.vendor.com/gpu")))
        << KubeletPathName(path);
    EXPECT_THAT(r.needs_restart, ::testing::IsEmpty());
  };
  const std::set<std::string> all = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == all; }));
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Healthy"; }));
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait));
  const int64_t streams = plugin->Status().list_and_watch_streams();
  absl::StatusOr<sim::AllocateResponse> legacy =
      h.sim().Allocate(testing::PodRequest("legacy", {{"c", 1}}, "vendor.com/gpu"));
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  const std::string pods = legacy->allocations(0).device_ids(0);
  std::set<std::string> rest = all;
  rest.erase(pods);
  ASSERT_TRUE(h.WaitFor([&] { return PoolNames(api) == rest; }));
  const std::string claimed = *rest.begin();
  const std::string uid = api.PutClaim(Claim("train", {claimed}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");

  // DRA only: the device manager loses the resource (its devices count
  // unhealthy), the pod runs on, and its device stays out of the pool.
  reload_as(KubeletPath::kDra);
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", "gpu-3") == "Unhealthy"; }));
  EXPECT_EQ(PoolNames(api), rest);
  const sim::State st = h.sim().GetState();
  ASSERT_EQ(st.pods_size(), 1);
  EXPECT_EQ(st.pods(0).uid(), legacy->pod_uid());
  EXPECT_EQ(st.pods(0).phase(), "Running");
  EXPECT_EQ(h.proxy().Status().resources[0].kubelet_api, "dra (gpu.vendor.com)");

  // Both again: the device manager has the resource back, with the claim's
  // device Unhealthy and the pod's Healthy.
  reload_as(KubeletPath::kBoth);
  EXPECT_TRUE(h.WaitFor([&] {
    return h.KubeletHealth("vendor.com/gpu", pods) == "Healthy" &&
           h.KubeletHealth("vendor.com/gpu", claimed) == "Unhealthy";
  }));

  // Device plugin only: the pool goes, the claim's device stays out of the
  // device manager's reach until it is unprepared.
  reload_as(KubeletPath::kDevicePlugin);
  EXPECT_TRUE(h.WaitFor([&] { return api.Slices().empty(); }));
  EXPECT_EQ(h.KubeletHealth("vendor.com/gpu", claimed), "Unhealthy");
  absl::StatusOr<Json> un = h.sim().UnprepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(un.ok());
  EXPECT_EQ((*un)[uid]["error"], "");
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth("vendor.com/gpu", claimed) == "Healthy"; }));
  // The plugin was never dialled again, and called once per holder.
  EXPECT_EQ(plugin->Status().list_and_watch_streams(), streams);
  EXPECT_EQ(plugin->Status().allocate_calls(), 2);
}

// A random mix of pods over both paths (2,000 by default; DPP_RANDOM_PODS
// sets how many, e.g. 10000): pods of the extended resource
// admitted by the kubelet and ended, claims allocated from the pool as it
// stands and unprepared, reconciliation, kubelet restarts, and reloads
// that move the resource between both paths and DRA only. After every
// step, no device is held twice: not by a claim and a running pod, not by
// two running pods, not by two claims. Pods and claims that asked for a
// device the other path held were refused, never admitted onto it.
TEST(DraModeTest, ARandomMixOfPodsOverBothPathsNeverHoldsADeviceTwice) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"), Personality::kV1Beta1Sync,
                 {{"vendor.com/gpu", KubeletPath::kBoth}});
  ProxyHarness& h = *harness;
  // A pod found gone by two reconciliations in a row releases its devices
  // at once.
  SamplePlugin* plugin = StartBothWaysNode(h, api, "1.34", 8);
  ASSERT_NE(plugin, nullptr);

  std::mt19937 rng(20261127);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::map<std::string, std::vector<std::string>> pods;    // running pod UID -> devices
  std::map<std::string, std::string> claims;              // prepared claim UID -> device
  std::map<std::string, std::string> claim_names;         // claim UID -> name
  KubeletPath path = KubeletPath::kBoth;
  int admitted = 0, pod_refusals = 0, prepared = 0, claim_refusals = 0;
  // The kubelet's running pods (it may have failed one at a restart's
  // re-admission) and the prepared claims, by device.
  auto check = [&](int step) {
    const sim::State st = h.sim().GetState();
    std::set<std::string> running;
    for (const auto& p : st.pods()) {
      if (p.phase() == "Running") running.insert(p.uid());
    }
    for (auto it = pods.begin(); it != pods.end();) {
      it = running.count(it->first) > 0 ? std::next(it) : pods.erase(it);
    }
    std::map<std::string, std::vector<std::string>> holders;
    for (const auto& a : st.allocations()) {
      if (running.count(a.pod_uid()) == 0 || a.resource() != "vendor.com/gpu") continue;
      for (const std::string& d : a.device_ids()) holders[d].push_back("pod " + a.pod_name());
    }
    for (const auto& [uid, d] : claims) holders[d].push_back("claim " + claim_names[uid]);
    for (const auto& [d, who] : holders) {
      if (who.size() > 1) {
        ADD_FAILURE() << "step " << step << ": device " << d << " held by "
                      << absl::StrJoin(who, ", ");
        return false;
      }
    }
    return true;
  };
  const char* env = std::getenv("DPP_RANDOM_PODS");
  const int kPods = env != nullptr ? std::atoi(env) : 2000;
  std::map<int, absl::Duration> spent;  // per kind of step
  for (int step = 0; step < kPods; ++step) {
    const size_t op = pick(1000) / 10;
    const absl::Time began = absl::Now();
    const int kind = op < 25 ? 0 : op < 50 ? 1 : op < 75 ? 2 : op < 98 ? 3 : 4;
    if (op < 25) {  // a pod of the extended resource
      absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(testing::PodRequest(
          absl::StrCat("pod-", step), {{"c", static_cast<int>(1 + pick(2))}}, "vendor.com/gpu"));
      if (a.ok()) {
        ++admitted;
        pods[a->pod_uid()] = testing::DeviceIdsOf(a->allocations(0));
      } else {
        ++pod_refusals;
      }
    } else if (op < 50) {  // a claim the scheduler allocated from the pool
      std::set<std::string> offered = PoolNames(api);
      for (const auto& [uid, d] : claims) offered.erase(d);
      if (offered.empty()) continue;
      auto it = offered.begin();
      std::advance(it, pick(offered.size()));
      const std::string name = absl::StrCat("claim-", step);
      const std::string uid = api.PutClaim(Claim(name, {*it}))["metadata"]["uid"];
      absl::StatusOr<Json> r = h.sim().PrepareClaims(kDriver, {{"default", name, uid}});
      ASSERT_TRUE(r.ok()) << r.status();
      if ((*r)[uid]["error"] == "") {
        ++prepared;
        claims[uid] = *it;
        claim_names[uid] = name;
      } else {
        ++claim_refusals;
      }
    } else if (op < 75) {  // a pod ends
      if (pods.empty()) continue;
      auto it = pods.begin();
      std::advance(it, pick(pods.size()));
      ASSERT_TRUE(h.sim().DeletePod(it->first).ok());
      pods.erase(it);
      if (pick(2) == 0) {  // reconciliation finds it gone (two passes), or later
        ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
        ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
      }
    } else if (op < 98) {  // a claim's pod ends
      if (claims.empty()) continue;
      auto it = claims.begin();
      std::advance(it, pick(claims.size()));
      absl::StatusOr<Json> un =
          h.sim().UnprepareClaims(kDriver, {{"default", claim_names[it->first], it->first}});
      ASSERT_TRUE(un.ok()) << un.status();
      ASSERT_EQ((*un)[it->first]["error"], "");
      claims.erase(it);
    } else if (op < 99 && step % 7 == 0) {  // the kubelet restarts
      const size_t from = h.sim().events().Size();
      ASSERT_TRUE(h.sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
      // Its plugin watcher registers the driver again before it prepares
      // (a real kubelet retries meanwhile).
      ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                                testing::kWait, from));
    } else if (op >= 99 && step % 5 == 0) {  // the resource moves: both, DRA only
      path = path == KubeletPath::kBoth ? KubeletPath::kDra : KubeletPath::kBoth;
      ProxyConfig next = h.config();
      next.paths = {{"vendor.com/gpu", path}};
      ASSERT_THAT(h.proxy().Reload(next).applied, ::testing::SizeIs(1));
    }
    spent[kind] += absl::Now() - began;
    if (!check(step)) break;
  }
  std::cout << "steps " << kPods << ": pods " << spent[0] << ", claims " << spent[1]
            << ", pods ending " << spent[2] << ", claims ending " << spent[3]
            << ", restarts and reloads " << spent[4] << "\n";
  // Both paths were busy on a node mostly full (refusals: the kubelet's,
  // its devices taken, or dpproxy's, held on the other path).
  // (How busy depends on how soon reconciliation frees pods' devices: 48
  // to 310 claims in 2,000 steps were seen.)
  EXPECT_GT(admitted, kPods / 100);
  EXPECT_GT(prepared, kPods / 100);
  std::cout << "admitted " << admitted << " pods (" << pod_refusals << " refused), prepared "
            << prepared << " claims (" << claim_refusals << " refused)\n";
}

TEST(DraModeTest, ALegacyPluginsClaimOutlivesAnAbsentApiServerRestartsAndAReboot) {
  // The API server is down when the node comes up.
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  const std::string kubeconfig = WriteKubeconfig(dir, api);
  const std::string cdi = dir.Sub("cdi");
  api.Stop();
  std::unique_ptr<ProxyHarness> h = DraHarness(api, kubeconfig, cdi);
  ASSERT_TRUE(h->sim().Start().ok());
  ASSERT_TRUE(h->sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
  // dpproxy starts anyway, says why it is not ready, and registers.
  ASSERT_TRUE(h->proxy().Start().ok());
  HealthCheck api_check = Check(h->proxy(), "dra-api-server");
  EXPECT_FALSE(api_check.ok);
  EXPECT_THAT(api_check.reason, HasSubstr("does not answer"));
  EXPECT_THAT(h->proxy().Status().dra->api_error, HasSubstr("does not answer"));
  EXPECT_THAT(h->MetricsText(),
              HasSubstr("dpproxy_dra_api_server_ok{driver=\"gpu.vendor.com\"} 0"));
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait));
  // A Kubernetes 1.9 plugin (v1alpha) behind it.
  sample::SamplePlugin* plugin = h->StartPlugin(h->PluginOptions(ApiVersion::kV1Alpha));
  ASSERT_NE(plugin, nullptr);

  // The API server comes up: the pool is published, dpproxy is ready.
  ASSERT_TRUE(api.Start().ok());
  ASSERT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 4; }, kApiWait));
  EXPECT_TRUE(h->WaitFor([&] { return Check(h->proxy(), "dra-api-server").ok; }));
  EXPECT_EQ(h->proxy().Status().dra->api_error, "");

  // A pod's claim for two devices: the container gets what the v1alpha
  // plugin answered, through dpproxy's CDI spec, as the runtime resolves it.
  const std::string uid = api.PutClaim(Claim("train", {"gpu-0", "gpu-1"}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h->sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");
  const Json devices = (*prepared)[uid]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]["cdi_device_ids"], Json({absl::StrCat(kDriver, "/claim=", uid, "-gpu")}));
  const Json& runtime = devices[0]["runtime"];
  EXPECT_EQ(runtime["errors"], Json::array());
  EXPECT_EQ(runtime["edits"]["env"],
            Json({"SAMPLE_GPU_DEVICES=gpu-0,gpu-1", "SAMPLE_PLUGIN_API=v1alpha"}));
  ASSERT_EQ(runtime["edits"]["deviceNodes"].size(), 2u);
  EXPECT_EQ(runtime["edits"]["deviceNodes"][0]["path"], "/dev/sample/gpu-0");
  EXPECT_EQ(runtime["edits"]["deviceNodes"][1]["path"], "/dev/sample/gpu-1");
  ASSERT_EQ(runtime["edits"]["mounts"].size(), 2u);
  EXPECT_EQ(runtime["edits"]["mounts"][0]["containerPath"], "/run/sample/gpu-0");
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);

  // dpproxy restarts: the kubelet prepares again and gets the same answer,
  // with no second Allocate.
  size_t from = h->sim().events().Size();
  h->RestartProxy();
  ASSERT_TRUE(h->proxy().Start().ok());
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait, from));
  absl::StatusOr<Json> again = h->sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[uid]["devices"], devices);
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);

  // The kubelet restarts: it deletes the node's slices at start, and
  // dpproxy publishes them again when the kubelet registers it (not at
  // its 30 s pass).
  from = h->sim().events().Size();
  ASSERT_TRUE(h->sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
  ASSERT_TRUE(h->sim().events().WaitForEvent("node_slices_deleted", {{"slices", 1}},
                                             testing::kWait, from));
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait, from));
  EXPECT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 4; }));
  again = h->sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[uid]["devices"], devices);
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);

  // The node reboots: /var/run/cdi (tmpfs) comes back empty, every
  // process starts again. The spec is back before the kubelet asks: it may
  // count the claim prepared and never prepare it again.
  h->StopProxy();
  h->StopPlugins();
  h->sim().Stop();
  testing::RemoveTree(cdi);
  from = h->sim().events().Size();
  ASSERT_FALSE(PathExists(ClaimCdiSpecPath(cdi, kDriver, uid)));
  h->RestartProxy();
  ASSERT_TRUE(h->sim().Start().ok());
  ASSERT_TRUE(h->proxy().Start().ok());
  EXPECT_TRUE(PathExists(ClaimCdiSpecPath(cdi, kDriver, uid)));
  EXPECT_EQ(h->proxy().Status().dra->claims_prepared, 1);  // remembered
  plugin = h->StartPlugin(h->PluginOptions(ApiVersion::kV1Alpha));
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait, from));
  again = h->sim().PrepareClaims(kDriver, {{"default", "train", uid}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[uid]["devices"], devices);  // runtime edits included
  EXPECT_EQ(plugin->Status().allocate_calls(), 0);

  // The pod ends: unprepared, spec and record gone; a repeat succeeds too.
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Json> un = h->sim().UnprepareClaims(kDriver, {{"default", "train", uid}});
    ASSERT_TRUE(un.ok()) << un.status();
    EXPECT_EQ((*un)[uid]["error"], "");
  }
  EXPECT_FALSE(PathExists(ClaimCdiSpecPath(cdi, kDriver, uid)));
  EXPECT_FALSE(PathExists(JoinPath(h->dir("state"), absl::StrCat("dra-claims/", uid, ".json"))));
  EXPECT_EQ(h->proxy().Status().dra->claims_prepared, 0);
  // DRA mode's gauges, as a scrape sees them.
  const std::string metrics = h->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dpproxy_dra_registered{driver=\"gpu.vendor.com\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dpproxy_dra_api_server_ok{driver=\"gpu.vendor.com\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dpproxy_dra_claims_prepared{driver=\"gpu.vendor.com\"} 0"));
}

TEST(DraModeTest, AFailingOrSlowApiServerAndAPluginRestartLoseNothing) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  const std::string cdi = dir.Sub("cdi");
  std::unique_ptr<ProxyHarness> h = DraHarness(api, WriteKubeconfig(dir, api), cdi);
  ASSERT_TRUE(h->sim().Start().ok());
  ASSERT_TRUE(h->sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
  ASSERT_TRUE(h->proxy().Start().ok());
  // A v1beta1 plugin that hands out CDI names, its own spec behind them.
  sample::SamplePluginOptions po = h->PluginOptions(ApiVersion::kV1Beta1);
  po.cdi_dir = cdi;
  sample::SamplePlugin* plugin = h->StartPlugin(po);
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 4; }));
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait));

  // Reading the claim fails once (503): that claim's error says so, and
  // the kubelet's retry prepares it; nothing was allocated in between.
  const std::string uid = api.PutClaim(Claim("infer", {"gpu-3"}))["metadata"]["uid"];
  api.InjectFault({"GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/", 503, 1});
  absl::StatusOr<Json> failed = h->sim().PrepareClaims(kDriver, {{"default", "infer", uid}});
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_THAT((*failed)[uid]["error"].get<std::string>(),
              AllOf(HasSubstr("claim default/infer"), HasSubstr("unable to handle the request")));
  EXPECT_EQ(plugin->Status().allocate_calls(), 0);
  // A slow server (half a second an answer) only delays the prepare.
  api.SetLatency(absl::Milliseconds(500));
  absl::StatusOr<Json> prepared = h->sim().PrepareClaims(kDriver, {{"default", "infer", uid}});
  api.SetLatency(absl::ZeroDuration());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[uid]["error"], "");
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
  // The plugin's CDI name resolves through its own spec, dpproxy's through
  // the claim's: the container gets both.
  const Json device = (*prepared)[uid]["devices"][0];
  EXPECT_EQ(device["cdi_device_ids"], Json({absl::StrCat(kDriver, "/claim=", uid, "-gpu"),
                                            "vendor.com/gpu=gpu-3"}));
  EXPECT_EQ(device["runtime"]["errors"], Json::array());
  std::set<std::string> nodes;
  for (const Json& n : device["runtime"]["edits"]["deviceNodes"]) nodes.insert(n["path"]);
  EXPECT_EQ(nodes, (std::set<std::string>{"/dev/sample/gpu-3", "/dev/sample-cdi/gpu-3"}));

  // Writes that conflict (someone else wrote the slice) are retried from a
  // fresh read: the health change still lands.
  api.InjectFault({"PUT", "/apis/resource.k8s.io/v1/resourceslices/", 409, 2});
  ASSERT_TRUE(plugin->SetHealth("gpu-0", "Unhealthy").ok());
  EXPECT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 3; }, kApiWait));

  // The plugin goes away: its devices leave the pool (none can be
  // prepared), the prepared claim is still answered from dpproxy's record;
  // it comes back and so do its devices.
  h->StopPlugins();
  EXPECT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 0; }, kApiWait));
  absl::StatusOr<Json> kept = h->sim().PrepareClaims(kDriver, {{"default", "infer", uid}});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)[uid]["devices"], (*prepared)[uid]["devices"]);
  plugin = h->StartPlugin(po);
  ASSERT_NE(plugin, nullptr);
  EXPECT_TRUE(h->WaitFor([&] { return PublishedDevices(api) == 4; }, kApiWait));
  EXPECT_EQ(plugin->Status().allocate_calls(), 0);
  // A claim for a device that is not in the pool is refused naming it.
  const std::string stray = api.PutClaim(Claim("stray", {"gpu-9"}))["metadata"]["uid"];
  absl::StatusOr<Json> bad = h->sim().PrepareClaims(kDriver, {{"default", "stray", stray}});
  ASSERT_TRUE(bad.ok());
  EXPECT_THAT((*bad)[stray]["error"].get<std::string>(), HasSubstr("gpu-9"));
}

// A 1.36 kubelet watches every DRA driver's device health
// (v1alpha1.DRAResourceHealth, for pods' status); a 1.37 one watches a
// driver that lists a health service, in v1 where it is listed: dpproxy
// lists and serves both from one state, and streams the plugin's health,
// with Unknown while no plugin is connected.
class DraHealthTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DraHealthTest, TheKubeletSeesThePluginsDeviceHealthOnTheHealthStream) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1"}});
  ASSERT_TRUE(api.Start().ok());
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> h = DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"));
  ASSERT_TRUE(h->sim().Start().ok());
  const size_t started = h->sim().events().Size();
  ASSERT_TRUE(h->sim().Restart(*sim::ParseKubeletVersion(GetParam())).ok());
  ASSERT_TRUE(h->proxy().Start().ok());
  const std::string service = std::string(GetParam()) == "1.37" ? "v1.DRAResourceHealth"
                                                               : "v1alpha1.DRAResourceHealth";
  ASSERT_TRUE(h->sim().events().WaitForEvent(
      "dra_driver_registered", {{"driver", kDriver}, {"health_service", service}},
      testing::kWait, started));
  sample::SamplePlugin* plugin = h->StartPlugin(h->PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_NE(plugin, nullptr);
  auto health = [&](const std::string& device) {
    const auto all = h->sim().DraHealth(kDriver);
    auto it = all.find(absl::StrCat(kPool, "/", device));
    return it == all.end() ? std::string() : it->second.health;
  };
  ASSERT_TRUE(h->sim().events().WaitForEvent(
      "dra_health", {{"driver", kDriver}, {"devices", 4}, {"service", service}}, testing::kWait));
  EXPECT_TRUE(h->WaitFor([&] { return health("gpu-1") == "HEALTHY"; }));
  EXPECT_EQ(h->sim().DraHealth(kDriver).size(), 4u);
  size_t from = h->sim().events().Size();
  ASSERT_TRUE(plugin->SetHealth("gpu-1", "Unhealthy").ok());
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_health", {{"driver", kDriver}, {"unhealthy", 1}},
                                             testing::kWait, from));
  EXPECT_EQ(health("gpu-1"), "UNHEALTHY");
  EXPECT_EQ(health("gpu-0"), "HEALTHY");
  EXPECT_THAT(h->sim().DraHealth(kDriver)[absl::StrCat(kPool, "/gpu-1")].message,
              HasSubstr("reports gpu-1 Unhealthy"));
  EXPECT_GT(h->sim().DraHealth(kDriver)[absl::StrCat(kPool, "/gpu-1")].last_updated_time, 0);
  // A device cordoned by hand: Unhealthy, with the operator's reason.
  from = h->sim().events().Size();
  ASSERT_EQ(RunControlCommand("cordon", {"vendor.com/gpu", "gpu-2"}, h->config().state_dir,
                              "fan failure", "table"),
            0);
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_health", {{"driver", kDriver}, {"unhealthy", 2}},
                                             testing::kWait, from));
  EXPECT_EQ(health("gpu-2"), "UNHEALTHY");
  EXPECT_EQ(h->sim().DraHealth(kDriver)[absl::StrCat(kPool, "/gpu-2")].message,
            "cordoned: fan failure");
  // /readyz?verbose names it, and the node stays ready.
  bool named = false;
  for (const HealthCheck& c : h->proxy().Readiness()) {
    if (c.name != "cordoned:vendor.com/gpu") continue;
    named = true;
    EXPECT_TRUE(c.ok);
    EXPECT_EQ(c.reason, "1 device(s) cordoned: gpu-2 (fan failure)");
  }
  EXPECT_TRUE(named);
  ASSERT_EQ(RunControlCommand("uncordon", {"vendor.com/gpu", "gpu-2"}, h->config().state_dir, "",
                              "table"),
            0);
  EXPECT_TRUE(h->WaitFor([&] { return health("gpu-2") == "HEALTHY"; }));
  // The plugin goes away: nobody can say, so Unknown.
  from = h->sim().events().Size();
  h->StopPlugins();
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_health", {{"driver", kDriver}, {"unknown", 4}},
                                             testing::kWait, from));
  EXPECT_EQ(health("gpu-0"), "UNKNOWN");
  // A 1.34 kubelet (gate off by default) does not watch.
  ASSERT_TRUE(h->sim().Restart(*sim::ParseKubeletVersion("1.34")).ok());
  ASSERT_TRUE(h->sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                             testing::kWait, from));
  EXPECT_TRUE(h->sim().DraHealth(kDriver).empty());
}

INSTANTIATE_TEST_SUITE_P(Kubelets, DraHealthTest, ::testing::Values("1.36", "1.37"),
                         [](const auto& info) {
                           return absl::StrReplaceAll(info.param, {{".", "_"}});
                         });


// A node whose extended resource vendor.com/gpu dpproxy serves both ways
// (`paths`), as a cluster with DRAExtendedResource has it: the API server
// with a DeviceClass naming the resource, a client of it, the simulated
// 1.36 kubelet, dpproxy and a plugin of `devices`. `tweak` changes
// dpproxy's configuration (the node's directory at hand), `sim_tweak` the
// kubelet's options. nullptr, with the failure reported, if a part did
// not come up.
struct BothWaysNode {
  sim::ApiServerSim api{sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}}};
  std::unique_ptr<KubeClient> client;
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness;
  SamplePlugin* plugin = nullptr;
};

// The node as the scheduler sees it: vendor.com/gpu's allocatable in the
// Node's status (0 if it shows none), and its taints.
int64_t NodeAllocatable(sim::ApiServerSim& api) {
  const Json n = api.Node("node-1");
  const Json a = n.value("/status/allocatable/vendor.com~1gpu"_json_pointer, Json("0"));
  return std::stoll(a.get<std::string>());
}
bool NodeTainted(sim::ApiServerSim& api) {
  return !api.Node("node-1").value("/spec/taints"_json_pointer, Json::array()).empty();
}
// The node's status caught up with the kubelet (`allocatable`), and no
// taint keeps pods away: the scheduler routes pods by what is true.
bool NodeSettled(ProxyHarness& h, sim::ApiServerSim& api, int64_t allocatable) {
  return h.WaitFor([&] { return NodeAllocatable(api) == allocatable && !NodeTainted(api); },
                   absl::Seconds(30));
}

// Starts pod `name` (1 device) as the scheduler would: tried at once, and
// while it fits nowhere (pending) again whenever the node as the scheduler
// sees it changes, up to 30 s. Whatever else ends it is the answer.
absl::StatusOr<sim::ExtendedResourcePods::Pod> Schedule(ProxyHarness& h, sim::ApiServerSim& api,
                                                        sim::ExtendedResourcePods& pods,
                                                        const std::string& name) {
  absl::StatusOr<sim::ExtendedResourcePods::Pod> p =
      absl::ResourceExhaustedError("never scheduled");
  std::string seen;
  h.WaitFor(
      [&] {
        std::string now = absl::StrCat(api.Node("node-1").dump(), pods.running().size());
        if (now == seen) return false;  // nothing the scheduler looks at changed
        seen = std::move(now);
        p = pods.Start(name, 1);
        return p.status().code() != absl::StatusCode::kResourceExhausted;
      },
      absl::Seconds(30));
  return p;
}

std::unique_ptr<BothWaysNode> StartExtendedResourceNode(
    int devices, const std::function<void(ProxyConfig&, BothWaysNode&)>& tweak = nullptr,
    std::function<void(sim::KubeletSimOptions&)> sim_tweak = nullptr) {
  auto node = std::make_unique<BothWaysNode>();
  if (absl::Status s = node->api.Start(); !s.ok()) {
    ADD_FAILURE() << "the API server did not start: " << s;
    return nullptr;
  }
  KubeConfig kc;
  kc.server = node->api.url();
  kc.token = "node-token";
  node->client = *KubeClient::Create(kc);
  absl::StatusOr<Json> made = node->client->Post(
      "/apis/resource.k8s.io/v1/deviceclasses",
      sim::ExtendedResourceDeviceClass("gpu-vendor-com", kDriver, "vendor.com/gpu"));
  if (!made.ok()) {
    ADD_FAILURE() << "the DeviceClass was not made: " << made.status();
    return nullptr;
  }
  // The kubelet writes the node's status every 2 s (10 s on a real node),
  // into the Node the scheduler reads.
  sim::ApiServerSim* api = &node->api;
  node->harness = DraHarness(
      node->api, WriteKubeconfig(node->dir, node->api), node->dir.Sub("cdi"),
      Personality::kV1Beta1Sync, {{"vendor.com/gpu", KubeletPath::kBoth}},
      [api, sim_tweak = std::move(sim_tweak)](sim::KubeletSimOptions& so) {
        so.node_status_period = absl::Seconds(2);
        so.on_node_status = [api](const std::map<std::string, int64_t>& allocatable) {
          api->SetNodeAllocatable("node-1", allocatable);
        };
        if (sim_tweak) sim_tweak(so);
      });
  BothWaysNode* raw = node.get();
  node->plugin = StartBothWaysNode(*node->harness, node->api, "1.36", devices,
                                   [&](ProxyConfig& c) {
                                     if (tweak) tweak(c, *raw);
                                   });
  if (node->plugin == nullptr) return nullptr;
  // The scheduler sees the devices only once the kubelet's status shows them.
  if (!NodeSettled(*node->harness, node->api, devices)) {
    ADD_FAILURE() << "the node's status never showed " << devices << " devices: "
                  << node->api.Node("node-1").dump();
    return nullptr;
  }
  return node;
}

// The kubelet's allocatable for vendor.com/gpu (0 if it has no record).
int64_t GpuAllocatable(ProxyHarness& h) {
  const sim::State st = h.sim().GetState();
  for (const auto& r : st.resources()) {
    if (r.name() == "vendor.com/gpu") return r.allocatable();
  }
  return 0;
}

// The names in `dir`, sorted.
// Pods asking for the extended resource (`vendor.com/gpu: 1`) arrive and
// end all along while the resource moves both -> DRA -> both -> device
// plugin -> both by reloads. The scheduler's rule picks each pod's path
// (the device plugin while the node's allocatable is above 0, else DRA
// through the DeviceClass's extendedResourceName, 1.34+); the kubelet
// admits device-plugin pods and prepares the claims it made for the others.
// No pod fails, no running pod is lost, no device has two holders, the
// plugin's stream never drops, and each pod's container has its device
// whichever path served it.
TEST(DraModeTest, PodsOfTheExtendedResourceAreServedOnWhicheverPathTheResourceTakes) {
  std::string view_socket;
  std::unique_ptr<BothWaysNode> node =
      StartExtendedResourceNode(6, [&](ProxyConfig& c, BothWaysNode& n) {
        view_socket = n.dir.Sub("pod-resources.sock");
        c.pod_resources_socket = view_socket;
      });
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ApiServerSim& api = node->api;
  KubeClient* client = node->client.get();
  SamplePlugin* plugin = node->plugin;
  const int64_t streams = plugin->Status().list_and_watch_streams();
  // The kubelet's record of the resource (empty if it has none).
  auto kubelet_resource = [&] {
    const sim::State st = h.sim().GetState();
    for (const auto& r : st.resources()) {
      if (r.name() == "vendor.com/gpu") return r;
    }
    return sim::ResourceState();
  };
  auto allocatable = [&] { return kubelet_resource().allocatable(); };
  auto plugin_connected = [&] { return kubelet_resource().connected(); };

  sim::ExtendedResourcePods pods(&h.sim(), client, "vendor.com/gpu", "node-1");
  std::mt19937 rng(20261127);
  std::map<std::string, std::map<std::string, int>> served;  // phase -> route -> pods
  int failed = 0, pending = 0, step = 0;
  // Each running pod's container holds one device, and no device is held
  // twice, in the kubelet's records and the runtime's.
  auto check = [&](const std::string& phase) {
    const sim::State st = h.sim().GetState();
    std::map<std::string, std::vector<std::string>> holders;
    int running = 0;
    for (const auto& p : st.pods()) {
      if (p.phase() != "Running") continue;
      ++running;
      int devices = 0;
      for (const auto& r : p.running()) {
        for (const std::string& d : r.device_ids()) holders[d].push_back(p.name()), ++devices;
        for (const std::string& d : r.claim_devices()) holders[d].push_back(p.name()), ++devices;
      }
      EXPECT_EQ(devices, 1) << phase << ": pod " << p.name();
    }
    EXPECT_EQ(running, static_cast<int>(pods.running().size())) << phase << " step " << step;
    for (const auto& [d, who] : holders) {
      EXPECT_EQ(who.size(), 1u) << phase << " step " << step << ": device " << d << " held by "
                                << absl::StrJoin(who, ", ");
    }
  };
  // One view for monitoring: dpproxy's pod-resources lists every running
  // pod's device the device-plugin way (resource, the plugin's ID),
  // whichever path served it; the kubelet's lists those of DRA pods only
  // as dynamic resources.
  int views = 0, through_dra = 0;
  auto one_view = [&](const std::string& phase) {
    auto list = [&](const std::string& socket) {
      auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + testing::kWait));
      v1::ListPodResourcesResponse r;
      EXPECT_TRUE(stub->List(&ctx, v1::ListPodResourcesRequest(), &r).ok()) << socket;
      std::map<std::string, std::set<std::string>> devices;  // pod -> "resource id"
      for (const auto& p : r.pod_resources()) {
        for (const auto& c : p.containers()) {
          for (const auto& d : c.devices()) {
            for (const std::string& id : d.device_ids()) {
              devices[p.name()].insert(d.resource_name() + " " + id);
            }
          }
        }
      }
      return devices;
    };
    const auto view = list(view_socket);
    const auto kubelets = list(h.sim().pod_resources_socket());
    // The node's devices: every one the plugin reports Healthy (all six),
    // whichever path serves it and whoever holds it.
    auto allocatable = [&](const std::string& socket) {
      auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + testing::kWait));
      v1::AllocatableResourcesResponse r;
      EXPECT_TRUE(stub->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &r).ok());
      std::set<std::string> ids;
      for (const auto& d : r.devices()) {
        if (d.resource_name() != "vendor.com/gpu") continue;
        ids.insert(d.device_ids().begin(), d.device_ids().end());
      }
      return ids;
    };
    EXPECT_EQ(allocatable(view_socket).size(), 6u) << phase;
    if (phase == "dra") {  // the kubelet's own lists none of them then
      EXPECT_THAT(allocatable(h.sim().pod_resources_socket()), ::testing::IsEmpty());
    }
    // What each pod through DRA runs with at the kubelet: its claim's
    // device, by the CDI name of dpproxy's spec for the claim and the
    // plugin's own CDI name for the device.
    const sim::State st = h.sim().GetState();
    for (const auto& p : st.pods()) {
      for (const auto& r : p.running()) {
        if (r.claim_devices().empty()) continue;
        ASSERT_EQ(r.claim_devices_size(), 1) << phase << ": pod " << p.name();
        EXPECT_THAT(r.cdi_device_ids(),
                    ::testing::UnorderedElementsAre(
                        ::testing::StartsWith(std::string(kDriver) + "/"),
                        "vendor.com/gpu=" + r.claim_devices(0)))
            << phase << ": pod " << p.name();
      }
    }
    for (const auto& [uid, p] : pods.running()) {
      EXPECT_EQ(view.count(p.name) ? view.at(p.name) : std::set<std::string>{},
                std::set<std::string>{"vendor.com/gpu " + p.devices[0]})
          << phase << ": pod " << p.name;
      if (!p.claim.empty()) {
        ++through_dra;
        EXPECT_EQ(kubelets.count(p.name), 0u) << phase << ": pod " << p.name;
      }
    }
    ++views;
  };
  auto stream = [&](const std::string& phase, int steps) {
    for (int i = 0; i < steps; ++i, ++step) {
      const bool start = pods.running().size() < 2 || rng() % 3 != 0;
      if (start) {
        absl::StatusOr<sim::ExtendedResourcePods::Pod> p =
            pods.Start(absl::StrCat("pod-", step), 1);
        if (p.ok()) {
          ++served[phase][p->route == sim::ExtendedResourceRoute::kDra ? "dra" : "device-plugin"];
        } else if (p.status().code() == absl::StatusCode::kResourceExhausted) {
          ++pending;  // the node is full: the scheduler waits
        } else {
          ++failed;
          ADD_FAILURE() << phase << ": " << p.status();
        }
      } else {
        auto it = pods.running().begin();
        std::advance(it, rng() % pods.running().size());
        const sim::ExtendedResourcePods::Pod ended = it->second;
        ASSERT_TRUE(pods.End(ended.uid).ok());
        if (ended.claim.empty()) {
          // Reconciliation finds it gone and frees its device (after the
          // kubelet's first seconds, when its pod list may be empty).
          ASSERT_TRUE(h.WaitFor([&] {
            if (!h.proxy().ReconcileOnce().ok()) return false;
            bool held = false;
            h.proxy().state()->ForEachAllocation([&](const state::Allocation& a) {
              if (a.has_claim()) return;
              for (const std::string& d : a.device_ids()) held |= d == ended.devices[0];
            });
            return !held;
          })) << phase << ": pod " << ended.name << "'s device " << ended.devices[0];
        }
      }
      check(phase);
    }
    one_view(phase);
  };
  auto reload_as = [&](KubeletPath path) {
    ProxyConfig next = h.config();
    next.paths = {{"vendor.com/gpu", path}};
    ASSERT_THAT(h.proxy().Reload(next).applied, ::testing::SizeIs(1));
  };

  stream("both", 20);
  reload_as(KubeletPath::kDra);
  // The device manager loses the resource, and the node's status shows it
  // (the scheduler is kept off the node until then).
  ASSERT_TRUE(h.WaitFor([&] { return allocatable() == 0; }));
  ASSERT_TRUE(NodeSettled(h, api, 0));
  stream("dra", 20);
  // The kubelet restarts: its pods run on, those served by claims with
  // their devices.
  const size_t from = h.sim().events().Size();
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait, from));
  check("dra, after a kubelet restart");
  reload_as(KubeletPath::kBoth);
  // The device manager has the resource again (its allocatable: the
  // devices no claim holds, maybe none yet).
  ASSERT_TRUE(h.WaitFor(plugin_connected));
  stream("both again", 20);
  reload_as(KubeletPath::kDevicePlugin);
  ASSERT_TRUE(h.WaitFor([&] { return api.Slices().empty(); }));
  // The pods claims serve end first. Until they do, the scheduler counts
  // their devices twice (their pods' requests, and the device plugin's
  // allocatable, which leaves them out) and may find no room however long
  // the phase lasts; then the node offers all six again.
  std::vector<std::string> claim_pods;
  for (const auto& [uid, p] : pods.running()) {
    if (!p.claim.empty()) claim_pods.push_back(uid);
  }
  for (const std::string& uid : claim_pods) ASSERT_TRUE(pods.End(uid).ok());
  ASSERT_TRUE(NodeSettled(h, api, 6)) << claim_pods.size() << " claims' pods ended";
  stream("device-plugin", 20);
  reload_as(KubeletPath::kBoth);
  // The pool is back (with the devices no pod holds, maybe none yet).
  ASSERT_TRUE(h.WaitFor([&] { return !api.Slices().empty(); }))
      << pods.running().size() << " pods run";
  stream("both at last", 10);

  std::cout << "pending " << pending << "; served:";
  for (const auto& [phase, routes] : served) {
    for (const auto& [route, n] : routes) std::cout << " " << phase << "/" << route << "=" << n;
  }
  std::cout << "\n";
  EXPECT_EQ(failed, 0);
  // Where the node had no device plugin for it, DRA served every pod; while
  // the device plugin alone served it, no pod went through DRA.
  EXPECT_GT(served["dra"]["dra"], 0);
  EXPECT_EQ(served["dra"]["device-plugin"], 0);
  EXPECT_GT(served["device-plugin"]["device-plugin"], 0);
  EXPECT_EQ(served["device-plugin"]["dra"], 0);
  EXPECT_GT(served["both"]["device-plugin"], 0);
  // The vendor plugin behind dpproxy never saw its stream drop.
  EXPECT_EQ(plugin->Status().list_and_watch_streams(), streams);
  EXPECT_EQ(views, 5);
  EXPECT_GT(through_dra, 0);  // the view had pods of both paths to show
}

// A move to `dra` fails no pod the scheduler routed on the node's status
// as it was. The kubelet's device manager loses the devices the moment
// dpproxy withdraws them, while the node's status, which the scheduler
// reads, shows it only at the kubelet's next status update (every 2 s
// here, 10 s on a real node): a pod created in between goes to the device
// plugin and would be refused ("no healthy devices present") for good.
// Pods created from the moment of the move on all start, each on a device
// of its own, by whichever path the scheduler chose.
TEST(DraModeTest, PodsCreatedRightAfterAMoveToDraAreNotFailed) {
  std::unique_ptr<BothWaysNode> node = StartExtendedResourceNode(4);
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ApiServerSim& api = node->api;
  sim::ExtendedResourcePods pods(&h.sim(), node->client.get(), "vendor.com/gpu", "node-1");
  auto reload_as = [&](KubeletPath path) {
    ProxyConfig next = h.config();
    next.paths = {{"vendor.com/gpu", path}};
    ASSERT_THAT(h.proxy().Reload(next).applied, ::testing::SizeIs(1));
  };
  ASSERT_TRUE(NodeSettled(h, api, 4));
  reload_as(KubeletPath::kDra);
  std::set<std::string> used;
  std::map<std::string, int> routes;
  for (int i = 0; i < 4; ++i) {
    const std::string name = absl::StrCat("right-after-", i);
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = Schedule(h, api, pods, name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    ASSERT_EQ(p->devices.size(), 1u);
    EXPECT_TRUE(used.insert(p->devices[0]).second) << p->devices[0] << " is used twice";
    ++routes[p->route == sim::ExtendedResourceRoute::kDra ? "dra" : "device-plugin"];
  }
  std::cout << "routes: device-plugin " << routes["device-plugin"] << ", dra " << routes["dra"]
            << "\n";
  const sim::State st = h.sim().GetState();
  for (const auto& p : st.pods()) {
    EXPECT_EQ(p.phase(), "Running") << p.name() << ": " << p.message();
  }
  // The move completes: the node's status shows 0, nothing keeps pods
  // away, and the next pods go through DRA.
  ASSERT_TRUE(NodeSettled(h, api, 0));
}

// Under `both`, capacity is counted once: the scheduler subtracts every
// pod's request of the extended resource from the node's allocatable,
// those a claim serves included, so the device plugin's count must not
// drop for the devices of those claims too. Two pods served through DRA
// hold two of four devices; under `both` the next two pods start on the
// two free devices (through the device plugin, steered away from the
// claims' devices), and only a fifth waits.
TEST(DraModeTest, UnderBothEveryFreeDeviceServesTheNextPod) {
  std::unique_ptr<BothWaysNode> node = StartExtendedResourceNode(4);
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ExtendedResourcePods pods(&h.sim(), node->client.get(), "vendor.com/gpu", "node-1");
  auto allocatable = [&] { return GpuAllocatable(h); };
  auto reload_as = [&](KubeletPath path) {
    ProxyConfig next = h.config();
    next.paths = {{"vendor.com/gpu", path}};
    ASSERT_THAT(h.proxy().Reload(next).applied, ::testing::SizeIs(1));
  };
  // Under `dra` the node's allocatable is 0: both pods go through DRA.
  reload_as(KubeletPath::kDra);
  ASSERT_TRUE(NodeSettled(h, node->api, 0));
  std::set<std::string> claimed;
  for (const char* name : {"dra-1", "dra-2"}) {
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(name, 1);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->route, sim::ExtendedResourceRoute::kDra);
    claimed.insert(p->devices.begin(), p->devices.end());
  }
  reload_as(KubeletPath::kBoth);
  // The device plugin's count: the four devices, as the scheduler
  // subtracts the two pods' requests itself.
  ASSERT_TRUE(h.WaitFor([&] { return allocatable() == 4; })) << "allocatable " << allocatable();
  ASSERT_TRUE(NodeSettled(h, node->api, 4));
  std::set<std::string> used = claimed;
  for (const char* name : {"dp-1", "dp-2"}) {
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(name, 1);
    ASSERT_TRUE(p.ok()) << name << " waits with a device free: " << p.status();
    EXPECT_EQ(p->route, sim::ExtendedResourceRoute::kDevicePlugin);
    ASSERT_EQ(p->devices.size(), 1u);
    EXPECT_TRUE(used.insert(p->devices[0]).second) << p->devices[0] << " is used twice";
  }
  EXPECT_EQ(used.size(), 4u);
  absl::StatusOr<sim::ExtendedResourcePods::Pod> full = pods.Start("dp-3", 1);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  const sim::State st = h.sim().GetState();
  for (const auto& p : st.pods()) {
    EXPECT_EQ(p.phase(), "Running") << p.name() << ": " << p.message();
  }
}

// A move to `dra` without a drain: pods of the device plugin run on, and
// the kubelet (1.34-1.37) looks the resource's endpoint up at every
// container start of the resource while any pod holds devices of it,
// claim-served pods included; once it has dropped the endpoint
// (endpointStopGracePeriod, 0 here instead of 5 minutes) such a start
// fails. dpproxy keeps the endpoint registered with every device Unhealthy
// (the node's allocatable is 0, so the scheduler routes through DRA) until
// the last pod of the device plugin ends, then stops it.
TEST(DraModeTest, AMoveToDraKeepsTheEndpointWhilePodsOfTheDevicePluginRun) {
  std::unique_ptr<BothWaysNode> node = StartExtendedResourceNode(
      4, nullptr,
      [](sim::KubeletSimOptions& so) { so.endpoint_grace = absl::ZeroDuration(); });
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ExtendedResourcePods pods(&h.sim(), node->client.get(), "vendor.com/gpu", "node-1");
  auto resource = [&] {
    const sim::State st = h.sim().GetState();
    for (const auto& r : st.resources()) {
      if (r.name() == "vendor.com/gpu") return std::optional<sim::ResourceState>(r);
    }
    return std::optional<sim::ResourceState>();
  };
  absl::StatusOr<sim::ExtendedResourcePods::Pod> legacy = pods.Start("legacy", 1);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_EQ(legacy->route, sim::ExtendedResourceRoute::kDevicePlugin);

  const size_t from = h.proxy().events().Size();
  ProxyConfig next = h.config();
  next.paths = {{"vendor.com/gpu", KubeletPath::kDra}};
  ASSERT_THAT(h.proxy().Reload(next).applied, ::testing::SizeIs(1));
  // The node's allocatable drops to 0 (or the kubelet drops the resource),
  // and the node's status shows it.
  ASSERT_TRUE(h.WaitFor([&] { return !resource().has_value() || resource()->allocatable() == 0; }));
  ASSERT_TRUE(NodeSettled(h, node->api, 0));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(absl::StrCat("dra-", i), 1);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->route, sim::ExtendedResourceRoute::kDra);
    ASSERT_TRUE(pods.End(p->uid).ok());
  }
  // The endpoint stayed in the kubelet's cache, withdrawn.
  ASSERT_TRUE(resource().has_value());
  EXPECT_TRUE(resource()->connected());
  EXPECT_TRUE(h.proxy().events().WaitForEvent("device_plugin_withdrawn",
                                              {{"resource", "vendor.com/gpu"}},
                                              absl::ZeroDuration(), from));

  // The last pod of the device plugin ends: the endpoint stops, and the
  // kubelet drops the resource; pods through DRA start as before.
  const size_t sim_from = h.sim().events().Size();
  ASSERT_TRUE(pods.End(legacy->uid).ok());
  ASSERT_TRUE(h.WaitFor([&] {
    (void)h.proxy().ReconcileOnce();
    return !resource().has_value();
  }));
  EXPECT_TRUE(h.sim().events().WaitForEvent("resource_removed", {{"resource", "vendor.com/gpu"}},
                                            testing::kWait, sim_from));
  // On its way out the endpoint never showed a Healthy device: a kubelet
  // that saw one would count it allocatable and admit a pod onto an
  // endpoint about to go ("no healthy devices present").
  for (const Json& e : h.sim().events().Since(sim_from)) {
    if (e["event"] == "devices" && e["resource"] == "vendor.com/gpu") {
      EXPECT_EQ(e["allocatable"], 0) << e.dump();
    }
  }
  absl::StatusOr<sim::ExtendedResourcePods::Pod> after = pods.Start("dra-after", 1);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->route, sim::ExtendedResourceRoute::kDra);
}

// A pod of the device plugin that ends gives its device back to the DRA
// pool at the next pass, not after the reconciliation grace (5 minutes
// from its allocation, here an hour): the kubelet listed it before and no
// longer does, and the container runtime runs nothing of it.
TEST(DraModeTest, AnEndedDevicePluginPodsDeviceReturnsToThePoolAtTheNextPass) {
  std::unique_ptr<BothWaysNode> node =
      StartExtendedResourceNode(4, [](ProxyConfig& c, BothWaysNode&) {
        c.reconcile_grace = absl::Hours(1);
        c.reconcile_start_grace = absl::ZeroDuration();
      });
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ApiServerSim& api = node->api;
  sim::ExtendedResourcePods pods(&h.sim(), node->client.get(), "vendor.com/gpu", "node-1");
  absl::StatusOr<sim::ExtendedResourcePods::Pod> legacy = pods.Start("legacy", 1);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_EQ(legacy->route, sim::ExtendedResourceRoute::kDevicePlugin);
  // A pass names it; its device leaves the pool.
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  ASSERT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 3; }));
  ASSERT_TRUE(pods.End(legacy->uid).ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  EXPECT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }))
      << PublishedDevices(api) << " devices in the pool";
  bool held = false;
  h.proxy().state()->ForEachAllocation([&](const state::Allocation& a) { held |= !a.has_claim(); });
  EXPECT_FALSE(held);
}

// The same with no pass called by the test, as on a real node: a pod of
// the device plugin that lives a few seconds and ends (the next pass a
// minute away) gives its device back to the pool within the hurried
// interval. dpproxy's pass right after the Allocate names the pod while it
// runs; without it no pass ever lists the pod, and the device waits out
// the reconciliation grace (here an hour) while a claim waits for it.
TEST(DraModeTest, AShortLivedDevicePluginPodsDeviceReturnsToThePoolWithoutAGrace) {
  std::unique_ptr<BothWaysNode> node =
      StartExtendedResourceNode(4, [](ProxyConfig& c, BothWaysNode&) {
        c.reconcile_grace = absl::Hours(1);
        c.reconcile_interval = absl::Minutes(1);
      });
  ASSERT_NE(node, nullptr);
  ProxyHarness& h = *node->harness;
  sim::ApiServerSim& api = node->api;
  sim::ExtendedResourcePods pods(&h.sim(), node->client.get(), "vendor.com/gpu", "node-1");
  // dpproxy has run a while: its first pass (10 s after its start) is
  // done, with nothing to hurry for, so the next is a minute away.
  ASSERT_TRUE(h.proxy().events().WaitForEvent("reconciled", {}, absl::Seconds(20)).has_value());
  const size_t from = h.proxy().events().Size();
  absl::StatusOr<sim::ExtendedResourcePods::Pod> brief = pods.Start("brief", 1);
  ASSERT_TRUE(brief.ok()) << brief.status();
  ASSERT_EQ(brief->route, sim::ExtendedResourceRoute::kDevicePlugin);
  ASSERT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 3; }));
  // A pass names it while it runs.
  std::optional<Json> named;
  ASSERT_TRUE(h.WaitFor([&] {
    for (const Json& e : h.proxy().events().Since(from)) {
      if (e.value("event", "") == "reconciled" && e.value("annotated", 0) > 0) named = e;
    }
    return named.has_value();
  }, absl::Seconds(20)));
  ASSERT_TRUE(pods.End(brief->uid).ok());
  EXPECT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }, absl::Seconds(30)))
      << PublishedDevices(api) << " devices in the pool";
  bool held = false;
  h.proxy().state()->ForEachAllocation([&](const state::Allocation& a) { held |= !a.has_claim(); });
  EXPECT_FALSE(held);
}

std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(f.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// How many `event`s the log has from index `from` on.
int Count(const EventLog& log, const std::string& event, size_t from) {
  int n = 0;
  for (const Json& e : log.Since(from)) n += e.value("event", "") == event ? 1 : 0;
  return n;
}

class DraTakeoverTest : public ::testing::TestWithParam<const char*> {};

// A takeover in DRA mode, on a kubelet that keeps two instances of a
// driver (1.33+) and on one that replaces it and deregisters it by name
// when any of its sockets goes (1.32): the new dpproxy serves the driver
// on the other socket generation, a claim prepared during the takeover is
// forwarded to it and journaled there, the claims from before are answered
// the same without a new Allocate, and the kubelet never loses the driver
// and holds exactly one instance of it: the predecessor's registration
// socket is deleted where the kubelet forgets instances by endpoint
// (1.33+), and renamed away, which its plugin watcher does not act on,
// where a deletion would deregister the driver by name (1.32). dpproxy
// reads the kubelet's release from the node's status. A kubelet start then
// registers only the new one.
TEST_P(DraTakeoverTest, ClaimsAndTheDriversRegistrationOutliveATakeover) {
  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "node-token", {"v1", "v1beta1"}});
  ASSERT_TRUE(api.Start().ok());
  api.PutNode("node-1", absl::StrCat("v", GetParam(), ".4"));
  testing::ShortTempDir dir;
  std::unique_ptr<ProxyHarness> harness =
      DraHarness(api, WriteKubeconfig(dir, api), dir.Sub("cdi"));
  ProxyHarness& h = *harness;
  SamplePlugin* plugin = StartNode(h, GetParam());
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.WaitFor([&] { return PublishedDevices(api) == 4; }, kApiWait));
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait));
  const std::string old_endpoint = h.sim().dra_driver(kDriver)->endpoint;
  const std::string old_registration = h.proxy().Status().dra->registration_socket;
  const std::string before = api.PutClaim(Claim("before", {"gpu-0", "gpu-1"}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared = h.sim().PrepareClaims(kDriver, {{"default", "before", before}});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ((*prepared)[before]["error"], "");

  const size_t from = h.sim().events().Size();
  const std::string during = api.PutClaim(Claim("during", {"gpu-2"}))["metadata"]["uid"];
  absl::StatusOr<Json> prepared_during;
  absl::Status took = h.TakeOver([&] {
    // The predecessor has released its state: this prepare is held there
    // and forwarded, or reaches the new one directly.
    prepared_during = h.sim().PrepareClaims(kDriver, {{"default", "during", during}});
  });
  ASSERT_TRUE(took.ok()) << took.message();
  ASSERT_TRUE(prepared_during.ok()) << prepared_during.status();
  EXPECT_EQ((*prepared_during)[during]["error"], "");
  EXPECT_EQ(h.proxy().socket_generation(), 1);

  // The kubelet calls the new dpproxy, and never lost the driver.
  ASSERT_TRUE(h.sim().dra_driver(kDriver).has_value());
  EXPECT_NE(h.sim().dra_driver(kDriver)->endpoint, old_endpoint);
  EXPECT_EQ(Count(h.sim().events(), "dra_driver_deregistered", from), 0);
  if (std::string(GetParam()) != "1.32") {
    ASSERT_TRUE(h.sim().events().WaitForEvent("dra_instance_removed", {{"driver", kDriver}},
                                              testing::kWait, from));
  }
  EXPECT_EQ(h.sim().dra_instances(kDriver), 1);
  EXPECT_TRUE(h.proxy().Status().dra->registered);
  // Both claims are the new one's: answered the same, no new Allocate.
  absl::StatusOr<Json> again = h.sim().PrepareClaims(kDriver, {{"default", "before", before}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)[before]["devices"], (*prepared)[before]["devices"]);
  EXPECT_EQ(plugin->Status().allocate_calls(), 2);
  EXPECT_EQ(h.proxy().Status().dra->claims_prepared, 2);

  // Nothing of the predecessor is left in plugins_registry/.
  EXPECT_EQ(ListFiles(h.dir("k/plugins_registry")),
            std::vector<std::string>{"gpu.vendor.com-reg-1.sock"});
  EXPECT_FALSE(PathExists(old_registration));
  const size_t restart = h.sim().events().Size();
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("dra_driver_registered", {{"driver", kDriver}},
                                            testing::kWait, restart));
  EXPECT_EQ(Count(h.sim().events(), "dra_driver_registered", restart), 1);
  EXPECT_EQ(Count(h.sim().events(), "dra_driver_deregistered", restart), 0);
  absl::StatusOr<Json> un = h.sim().UnprepareClaims(kDriver, {{"default", "before", before}});
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_EQ((*un)[before]["error"], "");
  EXPECT_EQ(h.proxy().Status().dra->claims_prepared, 1);
}

INSTANTIATE_TEST_SUITE_P(Releases, DraTakeoverTest, ::testing::Values("1.32", "1.33", "1.36"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

}  // namespace
}  // namespace dpproxy
