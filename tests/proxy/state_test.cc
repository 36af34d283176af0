// Allocations survive: the proxy's journal, proxy restarts before backends
// return (node reboot), and kubelet upgrades, judged by the kubelet
// simulator's re-admission rule.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/metrics.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_dir.h"
#include "proxy/state/state_store.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kGpu[] = "vendor.com/gpu";

// Starts the simulated kubelet and dpproxy, and one sample plugin of
// `api` serving kGpu with 4 devices, and waits for the kubelet to see them.
void UpWithPlugin(ProxyHarness& h, ApiVersion api) {
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(api)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
}

// The simulated kubelet's pod-resources List, over its real socket.
v1::ListPodResourcesResponse ListPodResources(sim::KubeletSim& sim) {
  auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(sim.pod_resources_socket()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  v1::ListPodResourcesResponse resp;
  grpc::Status st = stub->List(&ctx, v1::ListPodResourcesRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp;
}

sim::AllocateRequest Pod(const std::string& name,
                         const std::vector<std::pair<std::string, int>>& containers) {
  return testing::PodRequest(name, containers, kGpu);
}

// (resource, devices) of every allocation, as a multiset.
std::multiset<std::string> Keys(const sim::State& st) {
  std::multiset<std::string> out;
  for (const auto& a : st.allocations()) {
    out.insert(a.resource() + ":" + absl::StrJoin(a.device_ids(), ","));
  }
  return out;
}
std::multiset<std::string> Keys(const state::State& st) {
  std::multiset<std::string> out;
  for (const auto& a : st.allocations()) {
    out.insert(a.resource() + ":" + absl::StrJoin(a.device_ids(), ","));
  }
  return out;
}

TEST(StateTest, EveryAnsweredAllocationIsJournaled) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"main", 2}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"x", 1}, {"y", 1}})).ok());
  state::State st = h.proxy().state()->Snapshot();
  EXPECT_EQ(Keys(st), Keys(h.sim().GetState()));  // one record per container, same devices
  ASSERT_EQ(st.allocations_size(), 3);
  EXPECT_EQ(st.allocations(0).backend_api(), "v1alpha2");
  EXPECT_EQ(ResponseOf(st.allocations(0)).envs().at("SAMPLE_PLUGIN_API"), "v1alpha");
  EXPECT_GT(st.allocations(0).allocated_unix_ms(), 0);
  // The resource snapshot (devices, backend, negotiated version) follows.
  EXPECT_TRUE(h.WaitFor([&] {
    state::State s = h.proxy().state()->Snapshot();
    return s.resources_size() == 1 && s.resources(0).kubelet_api() == "v1beta1" &&
           s.resources(0).devices_size() == 4 &&
           s.resources(0).backend().api_version() == "v1alpha2";
  }));
}

// The journal reserves an allocation while the plugin is called; a plugin
// that refuses leaves nothing held, in memory or on the disk.
TEST(StateTest, AnAllocateThePluginRefusesHoldsNothing) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  auto options = h.PluginOptions(ApiVersion::kV1Beta1);
  options.fail_allocate = "out of vGPU slices";
  ASSERT_NE(h.StartPlugin(options), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  auto refused = h.sim().Allocate(Pod("a", {{"main", 2}}));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("out of vGPU slices"));
  StateKeeper* keeper = h.proxy().state();
  EXPECT_EQ(keeper->Snapshot().allocations_size(), 0);
  EXPECT_EQ(keeper->AllocationCount(), 0);
  const std::string dir = keeper->path().substr(0, keeper->path().rfind('/'));
  absl::StatusOr<state::State> on_disk = ReadStateDir(dir);
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(on_disk->allocations_size(), 0);
}

TEST(StateTest, ProxyRestartLosesAndDuplicatesNothing) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  sample::SamplePlugin* p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha));
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"x", 1}, {"y", 2}})).ok());
  const std::multiset<std::string> before = Keys(h.proxy().state()->Snapshot());
  ASSERT_EQ(before.size(), 2u);

  const size_t mark = p->events().Size();
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  // Restored from disk at once, then confirmed by the plugin, which
  // registers again when the new dpproxy's kubelet.sock appears.
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), before);
  ASSERT_TRUE(p->events().WaitForEvent("registered", Json::object(), kWait, mark));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 2);
  for (const auto& res : r.results()) EXPECT_TRUE(res.admitted()) << res.message();
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"z", 1}})).ok());
  std::multiset<std::string> after = Keys(h.proxy().state()->Snapshot());
  EXPECT_EQ(after.size(), 3u);
  EXPECT_EQ(after, Keys(h.sim().GetState()));  // the journal matches the kubelet's view
  // Once: the socket appeared with its mode, and nothing about it changed
  // after that the plugin could take for another restart.
  EXPECT_EQ(p->Status().registrations(), 2);
}

// Node reboot: kubelet, proxy and plugin all restart; the kubelet re-admits
// running pods before the plugin is back.
class NodeRebootTest : public ::testing::TestWithParam<RestorePolicy> {};

TEST_P(NodeRebootTest, RestorePolicyDecidesReadmission) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.restore_policy = GetParam();
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("survivor", {{"main", 2}})).ok());
  ASSERT_TRUE(h.WaitFor([&] {
    state::State s = h.proxy().state()->Snapshot();
    return s.resources_size() == 1 && s.resources(0).devices_size() == 4;
  }));

  // Everything goes down, the plugin first (and the proxy saves its state
  // after that); the kubelet and the proxy come back, the plugin not yet.
  h.StopPlugins();
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
  h.StopProxy();
  // Saved after the loss, at the latest by the shutdown: the health it
  // remembers is still the backend's, and so is the plugin's name.
  absl::StatusOr<state::State> saved = ReadStateDir(h.dir("state"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->resources_size(), 1);
  ASSERT_EQ(saved->resources(0).devices_size(), 4);
  for (const auto& d : saved->resources(0).devices()) EXPECT_EQ(d.health(), "Healthy");
  EXPECT_EQ(saved->resources(0).backend().backend_resource(), kGpu);
  h.sim().Stop();
  ASSERT_TRUE(h.sim().Start().ok());
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("resource_restored", {{"resource", kGpu}}, kWait));
  ASSERT_TRUE(h.WaitFor([&] {
    const sim::State st = h.sim().GetState();
    const auto* r = h.Resource(st, kGpu);
    return r != nullptr && r->connected() && r->capacity() == 4;
  }));  // registered with the remembered devices before any backend
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  if (GetParam() == RestorePolicy::kTrust) {
    EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
  } else {
    EXPECT_FALSE(r.results(0).admitted());
    EXPECT_THAT(r.results(0).message(), HasSubstr("no healthy devices present"));
  }
  // The plugin comes back: devices are confirmed by the backend.
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_EQ(h.proxy().state()->Snapshot().allocations_size(), 1);  // nothing lost
}

INSTANTIATE_TEST_SUITE_P(Policies, NodeRebootTest,
                         ::testing::Values(RestorePolicy::kTrust, RestorePolicy::kUnhealthy),
                         [](const ::testing::TestParamInfo<RestorePolicy>& i) {
                           return i.param == RestorePolicy::kTrust ? std::string("trust")
                                                                   : std::string("unhealthy");
                         });

TEST(StateTest, TrustIsBoundedByTheRestoreHold) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.restore_policy = RestorePolicy::kTrust;
    c.restore_hold = absl::Seconds(1);
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  ASSERT_TRUE(h.WaitFor([&] {
    state::State s = h.proxy().state()->Snapshot();
    return s.resources_size() == 1 && s.resources(0).devices_size() == 4;
  }));
  h.StopPlugins();
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));  // trusted first
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
}

// Pods are named; a pod that goes is released once the kubelet no longer
// lists it: at the next pass where the container runtime confirms none of
// its containers runs, after two passes that do not see it without one.
TEST(ReconcileTest, PodsAreNamedAndGonePodsReleased) {
  for (const bool runtime : {true, false}) {
    SCOPED_TRACE(runtime ? "with the container runtime" : "without a container runtime");
    ProxyHarness h(Personality::kV1Beta1Sync, false, [runtime](ProxyConfig& c) {
      c.reconcile_interval = absl::ZeroDuration();  // passes run by hand
      c.reconcile_grace = absl::ZeroDuration();
      if (!runtime) c.container_runtime_endpoint = "";
    });
    ASSERT_TRUE(h.sim().Start().ok());
    ASSERT_TRUE(h.proxy().Start().ok());
    ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
    ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
    absl::StatusOr<sim::AllocateResponse> a =
        h.sim().Allocate(Pod("train", {{"t", 2}, {"s", 1}}));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(h.sim().Allocate(Pod("keep", {{"main", 1}})).ok());

    ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
    std::map<std::string, std::string> holder;  // devices -> ns/pod/container
    const state::State snapshot = h.proxy().state()->Snapshot();
    for (const auto& e : snapshot.allocations()) {
      holder[absl::StrJoin(e.device_ids(), ",")] =
          absl::StrCat(e.pod_namespace(), "/", e.pod_name(), "/", e.container());
    }
    EXPECT_EQ(holder[absl::StrJoin(a->allocations(0).device_ids(), ",")], "default/train/t");
    EXPECT_EQ(holder[absl::StrJoin(a->allocations(1).device_ids(), ",")], "default/train/s");
    EXPECT_EQ(holder.size(), 3u);

    ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
    ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
    if (!runtime) {
      EXPECT_EQ(h.proxy().state()->Snapshot().allocations_size(), 3);  // not on one sighting
      ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
    }
    state::State st = h.proxy().state()->Snapshot();
    ASSERT_EQ(st.allocations_size(), 1);
    EXPECT_EQ(st.allocations(0).pod_name(), "keep");

    // Without an answer from the kubelet nothing is released.
    h.sim().Stop();
    EXPECT_EQ(h.proxy().ReconcileOnce().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(h.proxy().state()->Snapshot().allocations_size(), 1);
  }
}

// Issue 7.1: a real kubelet's pod-resources List has one ContainerDevices
// per device ID. A running multi-device allocation must be matched against
// the union of its container's entries and never released.
TEST(ReconcileTest, RunningMultiDeviceAllocationsAreNeverReleased) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::ZeroDuration();
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("big", {{"main", 3}}));
  ASSERT_TRUE(a.ok()) << a.status();
  // The simulator answers like the kubelet: one entry per device.
  v1::ListPodResourcesResponse list = ListPodResources(h.sim());
  ASSERT_EQ(list.pod_resources_size(), 1);
  ASSERT_EQ(list.pod_resources(0).containers(0).devices_size(), 3);
  for (int pass = 0; pass < 4; ++pass) ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  state::State st = h.proxy().state()->Snapshot();
  ASSERT_EQ(st.allocations_size(), 1);
  EXPECT_EQ(st.allocations(0).device_ids_size(), 3);
  EXPECT_EQ(st.allocations(0).pod_name(), "big");
  EXPECT_EQ(st.allocations(0).container(), "main");
}

// A kubelet that restarts without its checkpoint would hand the devices of
// running containers to new pods. dpproxy notices (the new checkpoint no
// longer lists what it answered), keeps the devices' health, names the pod
// in its status and metrics, keeps the hold across its own restart, and
// lets go once the pod is gone. (tests/proxy/forgotten_test.cc plays what
// the pods see on each release.)
TEST(ForgottenStateTest, AHoldIsReportedSurvivesADpproxyRestartAndEndsWithThePod) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();  // passes run by hand
    c.reconcile_grace = absl::ZeroDuration();
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("train", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::string> held = testing::DeviceIdsOf(a->allocations(0));
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());  // dpproxy learns the pod's name

  // The kubelet restarts and its checkpoint is gone; the pod keeps running.
  h.sim().Stop();
  ASSERT_EQ(::unlink(h.sim().checkpoint_path().c_str()), 0);
  const size_t from = h.proxy().events().Size();
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("devices_forgotten", {{"resource", kGpu}}, kWait,
                                              from));
  ASSERT_TRUE(h.WaitFor([&] { return h.proxy().Status().forgotten.size() == 1u; }));
  Json status = StatusToJson(h.proxy().Status());
  EXPECT_EQ(status["forgotten"][0]["pod"], "default/train");
  EXPECT_THAT(status["forgotten"][0]["reason"].get<std::string>(), HasSubstr("checkpoint"));
  EXPECT_THAT(h.MetricsText(),
              HasSubstr("dpproxy_forgotten_devices{resource=\"vendor.com/gpu\"} 2"));
  // Their health is the plugin's: the kubelet's re-admission keeps the pod.
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
  for (const std::string& id : held) EXPECT_EQ(h.KubeletHealth(kGpu, id), "Healthy") << id;
  EXPECT_EQ(h.sim().GetState().pods(0).phase(), "Running");

  // Survives a dpproxy restart too.
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.WaitFor([&] { return h.proxy().Status().forgotten.size() == 1u; }));

  // The pod goes away: the next pass ends the hold.
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  EXPECT_TRUE(h.WaitFor([&] { return h.proxy().Status().forgotten.empty(); }));
  EXPECT_THAT(h.MetricsText(), Not(HasSubstr("dpproxy_forgotten_devices{")));
  EXPECT_THAT(h.MetricsText(), HasSubstr("dpproxy_forgotten_released_total 1"));
}

// A pod that ended before a kubelet restart is not the kubelet's loss: its
// journal entry (not yet released) is never held as forgotten.
TEST(ForgottenStateTest, PodsThatEndedBeforeARestartAreNotHeld) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::Hours(1);  // the entry stays in the journal
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("done", {{"main", 2}}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  // dpproxy reads the kubelet's checkpoint (it does so whenever it changes).
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  const size_t from = h.proxy().events().Size();
  ASSERT_TRUE(h.sim().Restart().ok());  // a normal restart: checkpoint kept
  ASSERT_TRUE(h.proxy().events().WaitForEvent("kubelet_checkpoint_checked", {}, kWait, from));
  EXPECT_FALSE(h.proxy().events().WaitForEvent("devices_forgotten", {}, absl::ZeroDuration(),
                                               from));
  EXPECT_TRUE(h.proxy().Status().forgotten.empty());
  for (const std::string& id : testing::DeviceIdsOf(a->allocations(0))) {
    EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, id) == "Healthy"; })) << id;
  }
}

// pod-resources listing a running pod without the devices dpproxy
// allocated to it is the same loss, seen from the API.
TEST(ForgottenStateTest, PodResourcesContradictingTheJournalHoldsTheDevices) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::ZeroDuration();
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("infer", {{"main", 1}}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  // dpproxy is down while the kubelet restarts without its checkpoint.
  h.StopProxy();
  h.sim().Stop();
  ASSERT_EQ(::unlink(h.sim().checkpoint_path().c_str()), 0);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));  // pod-resources lists the pod again
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());  // seen once
  EXPECT_TRUE(h.proxy().Status().forgotten.empty());
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());  // seen twice: contradiction
  Json status = StatusToJson(h.proxy().Status());
  ASSERT_TRUE(h.WaitFor([&] { return h.proxy().Status().forgotten.size() == 1u; }))
      << StatusToJson(h.proxy().Status()).dump();
  EXPECT_THAT(h.proxy().Status().forgotten[0].reason,
              HasSubstr("pod-resources"));
  const std::string id = a->allocations(0).device_ids(0);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));  // real health: all four
  EXPECT_EQ(h.KubeletHealth(kGpu, id), "Healthy");
  // A new pod asking for every device is refused rather than given it.
  absl::StatusOr<sim::AllocateResponse> all = h.sim().Allocate(Pod("all", {{"main", 4}}));
  EXPECT_FALSE(all.ok());
  EXPECT_THAT(std::string(all.status().message()), HasSubstr("default/infer"));
}

// Issue 7.4: without pod-resources (1.9 kubelets, or the API not mounted)
// the kubelet's checkpoint tells which allocations are live: the journal
// stays bounded by the pods that hold devices.
// The kubelet rewrites its checkpoint at every device-list update, so at
// every health flip: passes over a checkpoint whose entries did not change
// say nothing (a flip storm once cost an event per flip).
TEST(CheckpointReleaseTest, HealthFlipsCostNoCheckpointEvents) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::Hours(1);
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  sample::SamplePlugin* plugin = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("keep", {{"main", 1}})).ok());
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());  // names the holder
  const size_t from = h.proxy().events().Size();
  for (int i = 0; i < 20; ++i) {
    const std::string health = i % 2 == 0 ? "Unhealthy" : "Healthy";
    ASSERT_TRUE(plugin->SetHealth("gpu-3", health).ok());
    ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-3") == health; }));
  }
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  int told = 0;
  for (const auto& e : h.proxy().events().Since(from)) {
    told += e.value("event", "") == "checkpoint_reconciled";
  }
  EXPECT_EQ(told, 0);
}

TEST(CheckpointReleaseTest, JournalIsBoundedWithoutPodResources) {
  ProxyHarness h(
      Personality::kV1Alpha, false,
      [](ProxyConfig& c) {
        c.reconcile_interval = absl::ZeroDuration();
        c.reconcile_grace = absl::ZeroDuration();
      },
      [](sim::KubeletSimOptions& o) { o.pod_resources = false; });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_EQ(h.proxy().ReconcileOnce().code(), absl::StatusCode::kUnavailable);  // no API
  absl::StatusOr<sim::AllocateResponse> keep = h.sim().Allocate(Pod("keep", {{"main", 1}}));
  ASSERT_TRUE(keep.ok());
  constexpr int kPods = 30;
  for (int i = 0; i < kPods; ++i) {
    absl::StatusOr<sim::AllocateResponse> p =
        h.sim().Allocate(Pod(absl::StrCat("batch-", i), {{"main", 2}}));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(h.sim().DeletePod(p->pod_uid()).ok());
  }
  // (dpproxy reads the checkpoint whenever the kubelet writes it, so some
  // entries may be gone already; two explicit passes settle the rest.)
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  state::State st = h.proxy().state()->Snapshot();
  ASSERT_EQ(st.allocations_size(), 1) << "the journal still holds pods that are gone";
  EXPECT_EQ(st.allocations(0).device_ids(0), keep->allocations(0).device_ids(0));
  EXPECT_FALSE(st.allocations(0).pod_uid().empty());  // named by the checkpoint
}

// The kubelet rewrites its checkpoint after every allocation: learning the
// pod's UID from it must not cost a snapshot write each time.
TEST(CheckpointReleaseTest, NamingFromTheCheckpointDoesNotRewriteTheSnapshot) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::Hours(1);
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  // The resource (devices, negotiated version) is in the saved snapshot.
  ASSERT_TRUE(h.WaitFor([&] {
    absl::StatusOr<state::State> saved = ReadStateDir(h.dir("state"));
    return saved.ok() && saved->resources_size() == 1 &&
           saved->resources(0).devices_size() == 4 && !saved->resources(0).kubelet_api().empty();
  }));
  // An Allocate only appends to the journal; the snapshot stays as it is.
  const std::optional<FileId> before = StatFileId(h.dir("state/state.pb"));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("named", {{"main", 1}}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  const state::State st = h.proxy().state()->Snapshot();
  ASSERT_EQ(st.allocations_size(), 1);
  EXPECT_EQ(st.allocations(0).pod_uid(), a->pod_uid());  // named, in memory
  EXPECT_EQ(StatFileId(h.dir("state/state.pb")), before);  // not rewritten
}

TEST(ReconcileTest, YoungEntriesAreNeverReleased) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
    c.reconcile_grace = absl::Hours(1);
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("brief", {{"c", 1}}));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(h.sim().DeletePod(a->pod_uid()).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  EXPECT_EQ(h.proxy().state()->Snapshot().allocations_size(), 1);
}

// A plugin swap during an upgrade: a v1alpha plugin naming devices gpu-N is
// replaced by a v1beta1 plugin naming them by UUID, under running pods.
TEST(SwapTest, IdMapKeepsKubeletIdsStableAcrossAVersionSwap) {
  sample::SamplePluginOptions uuid_opts;
  uuid_opts.resource = kGpu;
  uuid_opts.devices = 4;
  uuid_opts.id_pattern = "{uuid}";
  const std::vector<std::string> uuids = sample::DeviceIds(uuid_opts);
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    for (int i = 0; i < 4; ++i) c.id_maps[kGpu][uuids[i]] = absl::StrCat("gpu-", i);
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("before", {{"main", 2}})).ok());
  const size_t mark = h.sim().events().Size();

  h.StopPlugins();
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.id_pattern = "{uuid}";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sim::State st = h.sim().GetState();
  std::set<std::string> ids;
  for (const auto& d : h.Resource(st, kGpu)->devices()) ids.insert(d.id());
  EXPECT_EQ(ids, (std::set<std::string>{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}));  // stable
  // One uninterrupted registration toward the kubelet.
  EXPECT_FALSE(h.sim().events().WaitForEvent("plugin_lost", {}, absl::ZeroDuration(), mark));
  EXPECT_FALSE(h.sim().events().WaitForEvent("registered", {}, absl::ZeroDuration(), mark));
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
  // New allocations reach the new plugin under its own names.
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("after", {{"main", 1}}));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string kubelet_id = a->allocations(0).device_ids(0);
  const int index = kubelet_id.back() - '0';
  EXPECT_EQ(a->allocations(0).response().envs().at("SAMPLE_GPU_DEVICES"), uuids[index]);
}

TEST(SwapTest, VanishedDevicesStayUnhealthyWhileAllocatedOthersAreDropped) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sim::AllocateRequest req = Pod("holds-gpu-3", {});
  auto* c = req.add_containers();
  c->set_name("main");
  c->set_resource(kGpu);
  c->add_device_ids("gpu-3");
  ASSERT_TRUE(h.sim().Allocate(req).ok());

  h.StopPlugins();
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = 2;  // the new plugin knows gpu-0 and gpu-1 only
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.WaitFor([&] {
    const sim::State st = h.sim().GetState();
    const auto* r = h.Resource(st, kGpu);
    return r != nullptr && r->capacity() == 3 && r->allocatable() == 2;
  }));
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-3"), "Unhealthy");  // held: kept, not renamed
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-2"), "");           // not held: dropped
  ASSERT_TRUE(h.proxy().events().WaitForEvent("devices_vanished", {{"resource", kGpu}}, kWait));
  // The kubelet's rule now reports the truth for the pod on the vanished device.
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_FALSE(r.results(0).admitted());
  EXPECT_THAT(r.results(0).message(), HasSubstr("previously allocated devices are no longer healthy"));
}

// Kubelet upgrade within the checkpoint's layout (1.24 writes the NUMA map
// every later release reads), to a 1.25+ kubelet or the plugin-watcher
// kind, which wipes device-plugins/: dpproxy re-registers and every running
// pod is re-admitted with the devices it had.
class KubeletUpgradeTest : public ::testing::TestWithParam<Personality> {};

TEST_P(KubeletUpgradeTest, ProxyReregistersAndEveryPodIsReadmitted) {
  ProxyHarness h(Personality::kV1Beta1Async, false);
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  ASSERT_TRUE(h.sim().Allocate(Pod("one", {{"main", 2}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("two", {{"main", 1}})).ok());
  const std::multiset<std::string> before = Keys(h.sim().GetState());

  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(h.sim().Restart(GetParam()).ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const absl::Duration took = absl::Now() - t0;
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 2);  // one container in each pod
  for (const auto& res : r.results()) EXPECT_TRUE(res.admitted()) << res.message();
  EXPECT_EQ(Keys(h.sim().GetState()), before);  // zero lost, zero duplicated
  std::cout << "re-registered with the upgraded kubelet in " << absl::FormatDuration(took)
            << "\n";
}

INSTANTIATE_TEST_SUITE_P(To, KubeletUpgradeTest,
                         ::testing::Values(Personality::kV1Beta1Sync,
                                           Personality::kPluginWatcher),
                         [](const ::testing::TestParamInfo<Personality>& i) {
                           std::string n = sim::PersonalityName(i.param);
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// A node upgraded from a 1.9 kubelet (v1alpha) to 1.31: dpproxy
// renegotiates the API, but the new kubelet cannot read the old checkpoint
// (no checksummed wrapper before 1.20) and starts without the
// running pods' allocations, as kubernetes#102880 did between 1.19 and
// 1.20. dpproxy sees its answered allocations missing from the new
// checkpoint and keeps new pods off their devices, which keep their health
// so that the new kubelet's re-admission keeps the pods.
TEST(KubeletUpgradeTest, AcrossCheckpointLayoutsRunningPodsKeepTheirDevices) {
  ProxyHarness h(Personality::kV1Alpha, false, [](ProxyConfig& c) {
    c.reconcile_grace = absl::ZeroDuration();
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> one = h.sim().Allocate(Pod("one", {{"main", 2}}));
  absl::StatusOr<sim::AllocateResponse> two = h.sim().Allocate(Pod("two", {{"main", 1}}));
  ASSERT_TRUE(one.ok() && two.ok());
  std::vector<std::string> held = testing::DeviceIdsOf(one->allocations(0));
  held.push_back(testing::DeviceIdsOf(two->allocations(0)).at(0));
  ASSERT_EQ(h.proxy().Status().resources[0].kubelet_api, "v1alpha2");
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());  // dpproxy has read the 1.9 checkpoint

  const size_t sim_from = h.sim().events().Size(), from = h.proxy().events().Size();
  ASSERT_TRUE(h.sim().Restart(Personality::kV1Beta1Sync).ok());
  ASSERT_TRUE(h.sim().events().WaitForEvent("checkpoint_unreadable", {}, kWait, sim_from));
  ASSERT_TRUE(h.proxy().events().WaitForEvent("devices_forgotten", {{"resource", kGpu}}, kWait,
                                              from));
  EXPECT_TRUE(h.WaitFor([&] { return h.proxy().Status().resources[0].kubelet_api == "v1beta1"; }));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));  // real health: all four
  ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
  const sim::State synced = h.sim().GetState();
  for (const auto& p : synced.pods()) {
    EXPECT_EQ(p.phase(), "Running") << p.name() << ": " << p.message();
  }
  EXPECT_TRUE(h.sim().GetState().allocations().empty());  // the kubelet forgot them
  // A new pod gets the one free device, never a running pod's.
  absl::StatusOr<sim::AllocateResponse> next = h.sim().Allocate(Pod("next", {{"main", 1}}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(held, Not(Contains(testing::DeviceIdsOf(next->allocations(0)).at(0))));
  EXPECT_FALSE(h.sim().Allocate(Pod("more", {{"main", 1}})).ok());
}

}  // namespace
}  // namespace dpproxy

namespace dpproxy {
namespace {

// Every copy dpproxy keeps overwritten while it is stopped: the snapshot,
// the journal and the previous generation of both.
void DamageEveryStateFile(ProxyHarness& h) {
  for (const char* name : {"state.pb", "state.pb.prev", "journal.wal", "journal.wal.prev"}) {
    ASSERT_TRUE(WriteFileAtomic(h.dir(absl::StrCat("state/", name)), "damaged").ok());
  }
}

// dpproxy reports `n` allocations learned back from the kubelet's checkpoint.
bool LearnedBackFromCheckpoint(ProxyHarness& h, int n) {
  return h.proxy()
      .events()
      .WaitForEvent("allocations_recovered", {{"from", "kubelet checkpoint"}, {"recovered", n}},
                    kWait)
      .has_value();
}

// dpproxy's state damaged while pods hold devices (every file overwritten
// while it was stopped): the kubelet's checkpoint still lists what the
// pods hold, and dpproxy learns it back within a checkpoint pass of the
// resource being served again, journals it, and says so. A start on an
// intact state learns nothing.
TEST(LearnBackTest, AllocationsADamagedStateLostAreLearnedBackFromTheKubeletsCheckpoint) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"x", 1}, {"y", 1}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"z", 1}})).ok());
  const std::multiset<std::string> before = Keys(h.proxy().state()->Snapshot());
  ASSERT_EQ(before.size(), 3u);
  h.StopProxy();
  ASSERT_NO_FATAL_FAILURE(DamageEveryStateFile(h));

  const size_t sim_mark = h.sim().events().Size();
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(LearnedBackFromCheckpoint(h, 3));
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), before);
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), Keys(h.sim().GetState()));
  EXPECT_THAT(h.MetricsText(),
              HasSubstr("dpproxy_allocations_recovered_total{source=\"kubelet_checkpoint\"} 3"));
  // Learned back, they hold their devices: the one free device is all a
  // new pod can get, once the kubelet has the new dpproxy's list (the
  // learning may come before dpproxy registered with it).
  ASSERT_TRUE(h.sim().events().WaitForEvent("devices", {{"resource", kGpu}}, kWait, sim_mark));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_FALSE(h.sim().Allocate(Pod("c", {{"w", 2}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("d", {{"w", 1}})).ok());

  // Written to the journal at once: a restart on the now intact state
  // keeps them and learns nothing.
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 4);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.proxy().ReconcileCheckpointOnce().ok());
  EXPECT_FALSE(h.proxy()
                   .events()
                   .WaitForEvent("allocations_recovered", {}, absl::ZeroDuration())
                   .has_value());
}

// dpproxy's state damaged, and the kubelet's checkpoint no help: a
// directory stands in its place, so the kubelet cannot write it (as on a
// full or read-only disk) and dpproxy cannot read it. The kubelet still
// holds the allocations in memory, and its pod-resources API lists them:
// they are learned back from there, with their pods' names.
TEST(LearnBackTest, PodResourcesTellsWhatNeitherTheStateNorTheCheckpointCan) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();  // pod-resources passes run by hand
  });
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"x", 1}, {"y", 1}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"z", 1}})).ok());
  const std::multiset<std::string> before = Keys(h.proxy().state()->Snapshot());
  ASSERT_EQ(before.size(), 3u);
  h.StopProxy();
  ASSERT_NO_FATAL_FAILURE(DamageEveryStateFile(h));
  const std::string checkpoint =
      JoinPath(DevicePluginDir(h.config().kubelet), "kubelet_internal_checkpoint");
  ASSERT_EQ(::unlink(checkpoint.c_str()), 0);
  ASSERT_TRUE(MakeDirs(checkpoint).ok());

  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.WaitFor([&] { return !h.proxy().KubeletSocketOf(kGpu).empty(); }));
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());
  std::optional<Json> e = h.proxy().events().WaitForEvent(
      "allocations_recovered", {{"from", "pod-resources"}}, kWait);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ((*e)["recovered"], 3);
  EXPECT_EQ((*e)["unrecoverable"], 0);
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), before);
  ASSERT_TRUE(h.proxy().ReconcileOnce().ok());  // named by the next pass
  std::set<std::string> pods;
  const state::State named = h.proxy().state()->Snapshot();
  for (const auto& a : named.allocations()) pods.insert(a.pod_name());
  EXPECT_EQ(pods, (std::set<std::string>{"a", "b"}));
  const std::string metrics = h.MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dpproxy_allocations_recovered_total{source=\"pod_resources\"} 3"));
  EXPECT_THAT(metrics,
              HasSubstr("dpproxy_allocations_recovered_total{source=\"kubelet_checkpoint\"} 0"));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_FALSE(h.sim().Allocate(Pod("c", {{"w", 2}})).ok());  // held again
  EXPECT_TRUE(h.sim().Allocate(Pod("d", {{"w", 1}})).ok());
}

// The journal emptied while dpproxy was stopped (the snapshot intact):
// what was recorded since the snapshot is the kubelet's to tell, and is
// learned back from its checkpoint; what the snapshot holds is kept.
TEST(LearnBackTest, AnEmptiedJournalIsLearnedBackFromTheCheckpoint) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"x", 1}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"y", 1}, {"z", 1}})).ok());
  const std::multiset<std::string> before = Keys(h.proxy().state()->Snapshot());
  ASSERT_EQ(before.size(), 3u);
  h.StopProxy();
  absl::StatusOr<state::State> snapshot = DecodeStateFile(*ReadFile(h.dir("state/state.pb")));
  ASSERT_TRUE(snapshot.ok());
  const int journal_only = static_cast<int>(before.size()) - snapshot->allocations_size();
  ASSERT_GT(journal_only, 0);  // recorded since the snapshot: in the journal only
  ASSERT_TRUE(WriteFileAtomic(h.dir("state/journal.wal"), "").ok());

  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("journal_missing", {}, kWait).has_value());
  ASSERT_TRUE(LearnedBackFromCheckpoint(h, journal_only));
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), before);
  // Held again: the one free device is all a new pod can get.
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));  // the plugin is back
  EXPECT_FALSE(h.sim().Allocate(Pod("c", {{"w", 2}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("d", {{"w", 1}})).ok());
}

// Every state file removed while dpproxy was stopped (the directory itself
// kept, or gone too): the plugin directory's note says the state directory
// was in use, so this is a loss, not a first start. dpproxy says so
// (state_lost) and learns back from the kubelet's checkpoint what it
// lists. A first start, or a note naming another directory, stays quiet.
TEST(LearnBackTest, EveryStateFileRemovedIsALossNotAFirstStart) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  UpWithPlugin(h, ApiVersion::kV1Beta1);
  EXPECT_FALSE(h.proxy().events().WaitForEvent("state_lost", {}, absl::ZeroDuration()));
  ASSERT_TRUE(PathExists(h.dir("p/") + kStateNoteName));
  ASSERT_TRUE(h.sim().Allocate(Pod("a", {{"x", 1}})).ok());
  ASSERT_TRUE(h.sim().Allocate(Pod("b", {{"y", 1}, {"z", 1}})).ok());
  const std::multiset<std::string> before = Keys(h.proxy().state()->Snapshot());
  ASSERT_EQ(before.size(), 3u);
  h.StopProxy();
  std::error_code ec;
  std::filesystem::remove_all(h.dir("state"), ec);
  ASSERT_FALSE(ec) << ec.message();

  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  std::optional<Json> lost = h.proxy().events().WaitForEvent("state_lost", {}, kWait);
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ((*lost)["path"], h.dir("state"));
  ASSERT_TRUE(LearnedBackFromCheckpoint(h, 3));
  EXPECT_EQ(Keys(h.proxy().state()->Snapshot()), before);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_FALSE(h.sim().Allocate(Pod("c", {{"w", 2}})).ok());  // held again
  EXPECT_TRUE(h.sim().Allocate(Pod("d", {{"w", 1}})).ok());

  // The note names another state directory: a new one here is a first start.
  h.StopProxy();
  ASSERT_TRUE(NoteStateDirInUse(h.dir("p"), h.dir("elsewhere")).ok());
  std::filesystem::remove_all(h.dir("state"), ec);
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("proxy_started", {}, kWait).has_value());
  EXPECT_FALSE(h.proxy().events().WaitForEvent("state_lost", {}, absl::ZeroDuration()));
  EXPECT_EQ(StateDirNotedSince(h.dir("p"), h.dir("state")).has_value(), true);
}

}  // namespace
}  // namespace dpproxy
