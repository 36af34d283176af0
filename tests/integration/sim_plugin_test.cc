// The kubelet simulator against the sample plugin, in one process but over
// real gRPC servers on real Unix sockets: every kubelet personality with a
// plugin of the matching version, then bad registrations and mismatched
// pairs, which must fail the way they fail in the field (the kubelet's
// device manager, with its own error texts).
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "tests/testing/raw_clients.h"
#include "tests/testing/changes.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sample::RegistrationMode;
using sample::SamplePlugin;
using sample::SamplePluginOptions;
using sim::KubeletSim;
using sim::KubeletSimOptions;
using sim::Personality;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr char kGpu[] = "vendor.com/gpu";

sim::AllocateRequest Pod(const std::string& name,
                         const std::vector<std::pair<std::string, int>>& containers) {
  return testing::PodRequest(name, containers, kGpu);
}

struct Pair {
  Personality personality;
  ApiVersion api;
  RegistrationMode mode;
  std::string name;
};

void PrintTo(const Pair& p, std::ostream* os) { *os << p.name; }

class Harness {
 public:
  explicit Harness(Personality p, absl::Duration dial_timeout = absl::Seconds(10)) {
    KubeletSimOptions o;
    o.root_dir = dir_.Sub("kubelet");
    o.personality = p;
    o.dial_timeout = dial_timeout;
    sim_ = std::make_unique<KubeletSim>(o);
    changes_.Watch(sim_->events());
  }

  KubeletSim& sim() { return *sim_; }
  std::string root() const { return dir_.Sub("kubelet"); }

  SamplePluginOptions PluginOptions(ApiVersion api, RegistrationMode mode) {
    SamplePluginOptions o;
    o.api = api;
    o.registration = mode;
    o.resource = kGpu;
    o.devices = 4;
    o.id_pattern = "gpu-{i}";
    o.kubelet_socket = sim_->kubelet_socket();
    o.plugins_registry_dir = sim_->plugins_registry_dir();
    return o;
  }

  SamplePlugin& StartPlugin(const SamplePluginOptions& o) {
    plugins_.push_back(std::make_unique<SamplePlugin>(o));
    changes_.Watch(plugins_.back()->events());
    absl::Status s = plugins_.back()->Start();
    EXPECT_TRUE(s.ok()) << s;
    return *plugins_.back();
  }

  void StopPlugins() { plugins_.clear(); }

  // Never from a temporary State: the pointer would dangle.
  const sim::ResourceState* Resource(sim::State&& st, const std::string& name) = delete;
  const sim::ResourceState* Resource(const sim::State& st, const std::string& name) {
    return testing::FindResource(st, name);
  }

  // Waits until `pred(state)` holds, looking again at each event of the
  // kubelet or a plugin.
  bool WaitState(const std::function<bool(const sim::State&)>& pred,
                 absl::Duration timeout = kWait) {
    return changes_.WaitUntil([&] { return pred(sim_->GetState()); }, timeout);
  }

  std::string DeviceHealth(const std::string& id) {
    return testing::KubeletHealth(*sim_, kGpu, id);
  }

 private:
  testing::Changes changes_;
  testing::ShortTempDir dir_;
  std::unique_ptr<KubeletSim> sim_;
  std::vector<std::unique_ptr<SamplePlugin>> plugins_;
};

class PersonalityTest : public ::testing::TestWithParam<Pair> {
 protected:
  PersonalityTest() : h_(GetParam().personality) {}
  void SetUp() override { ASSERT_TRUE(h_.sim().Start().ok()); }
  SamplePluginOptions Options() { return h_.PluginOptions(GetParam().api, GetParam().mode); }
  bool IsBeta() const { return GetParam().api == ApiVersion::kV1Beta1; }
  Harness h_;
};

TEST_P(PersonalityTest, RegistersAndReportsDevices) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  sim::State st = h_.sim().GetState();
  const sim::ResourceState* r = h_.Resource(st, kGpu);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->capacity(), 4);
  EXPECT_EQ(r->allocatable(), 4);
  EXPECT_EQ(r->api_version(), IsBeta() ? "v1beta1" : "v1alpha2");
  EXPECT_EQ(r->registered_via(),
            GetParam().mode == RegistrationMode::kPluginWatcher ? "plugin-watcher"
                                                                : "kubelet.sock");
  EXPECT_EQ(r->endpoint(), plugin.socket_path());
  EXPECT_TRUE(h_.sim().events().WaitForEvent("registered", {{"resource", kGpu}}, kWait));
  // Through the plugin watcher the plugin counts its registration when
  // NotifyRegistrationStatus arrives, after the kubelet's own event.
  EXPECT_TRUE(
      h_.WaitState([&](const sim::State&) { return plugin.Status().registrations() == 1; }));
  EXPECT_EQ(plugin.Status().registrations(), 1);
  EXPECT_EQ(plugin.Status().list_and_watch_streams(), 1);
  // The plugin's own start event counts its devices instead of listing them.
  std::optional<Json> serving = plugin.events().WaitForEvent("serving", {}, kWait);
  ASSERT_TRUE(serving.has_value());
  EXPECT_EQ((*serving)["devices"], 4);
  EXPECT_EQ((*serving)["first_devices"].size(), 4u);
}

TEST_P(PersonalityTest, HealthFlipIsSeenByTheKubelet) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(plugin.SetHealth("gpu-1", "Unhealthy").ok());
  EXPECT_TRUE(h_.WaitState([&](const sim::State& st) {
    const auto* r = h_.Resource(st, kGpu);
    return r != nullptr && r->allocatable() == 3 && r->capacity() == 4;
  }));
  EXPECT_EQ(h_.DeviceHealth("gpu-1"), "Unhealthy");
  // The unhealthy device is not given to new pods.
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("p", {{"c", 3}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(testing::DeviceIdsOf(a->allocations(0)), ::testing::Not(::testing::Contains("gpu-1")));
  ASSERT_TRUE(plugin.SetHealth("gpu-1", "Healthy").ok());
  EXPECT_TRUE(h_.WaitState([&](const sim::State&) { return h_.DeviceHealth("gpu-1") == "Healthy"; }));
}

TEST_P(PersonalityTest, AllocatesForOneContainer) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("single", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 1);
  const sim::ContainerAllocation& c = a->allocations(0);
  ASSERT_EQ(c.device_ids_size(), 2);
  const std::string ids = absl::StrCat(c.device_ids(0), ",", c.device_ids(1));
  EXPECT_EQ(c.response().envs().at("SAMPLE_GPU_DEVICES"), ids);
  EXPECT_EQ(c.response().mounts_size(), 2);
  EXPECT_EQ(c.response().devices_size(), 2);
  if (IsBeta()) {
    EXPECT_EQ(c.response().annotations().at("vendor.com/devices"), ids);
    // Read from 1.28 (v1beta1-async plays 1.24, which drops them).
    EXPECT_EQ(c.response().cdi_devices_size(), h_.sim().kubelet().ReadsCdiDevices() ? 2 : 0);
  } else {
    EXPECT_TRUE(c.response().annotations().empty());
    EXPECT_EQ(c.response().cdi_devices_size(), 0);
  }
  EXPECT_EQ(plugin.Status().allocate_calls(), 1);
  // Checkpointed in the kubelet's layout, and listed by pod-resources.
  absl::StatusOr<std::string> ckpt = ReadFile(h_.sim().checkpoint_path());
  ASSERT_TRUE(ckpt.ok());
  EXPECT_THAT(*ckpt, HasSubstr("\"PodDeviceEntries\""));
  EXPECT_THAT(*ckpt, HasSubstr(c.device_ids(0)));
  auto pr = v1::PodResourcesLister::NewStub(MakeUnixChannel(h_.sim().pod_resources_socket()));
  grpc::ClientContext ctx;
  v1::ListPodResourcesResponse list;
  ASSERT_TRUE(pr->List(&ctx, v1::ListPodResourcesRequest(), &list).ok());
  ASSERT_EQ(list.pod_resources_size(), 1);
  EXPECT_EQ(list.pod_resources(0).name(), "single");
  ASSERT_EQ(list.pod_resources(0).containers_size(), 1);
  // One ContainerDevices per device ID, as the real kubelet answers.
  const auto& listed = list.pod_resources(0).containers(0).devices();
  ASSERT_EQ(listed.size(), 2);
  EXPECT_EQ(listed[0].device_ids_size(), 1);
  EXPECT_EQ(listed[1].device_ids_size(), 1);
  EXPECT_THAT(std::vector<std::string>({listed[0].device_ids(0), listed[1].device_ids(0)}),
              UnorderedElementsAre(c.device_ids(0), c.device_ids(1)));
  grpc::ClientContext ctx2;
  v1::AllocatableResourcesResponse alloc;
  ASSERT_TRUE(pr->GetAllocatableResources(&ctx2, v1::AllocatableResourcesRequest(), &alloc).ok());
  EXPECT_EQ(alloc.devices_size(), 4);
}

TEST_P(PersonalityTest, AllocatesForTwoContainersWithDistinctDevices) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a =
      h_.sim().Allocate(Pod("two", {{"trainer", 2}, {"sidecar", 1}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 2);
  EXPECT_EQ(a->allocations(0).container(), "trainer");
  EXPECT_EQ(a->allocations(1).container(), "sidecar");
  std::set<std::string> all;
  for (const auto& c : a->allocations()) {
    for (const auto& id : c.device_ids()) EXPECT_TRUE(all.insert(id).second) << id;
    EXPECT_EQ(c.response().envs().at("SAMPLE_GPU_DEVICES"),
              absl::StrJoin(c.device_ids(), ","));
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(plugin.Status().allocate_calls(), 2);  // one call per container
  // The last device goes to the next pod; then there are none.
  EXPECT_TRUE(h_.sim().Allocate(Pod("next", {{"c", 1}})).ok());
  absl::StatusOr<sim::AllocateResponse> none = h_.sim().Allocate(Pod("none", {{"c", 1}}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("requested number of devices unavailable for vendor.com/gpu. "
                        "Requested: 1, Available: 0"));
}

TEST_P(PersonalityTest, KubeletRestartIsFollowedByReRegistration) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("survivor", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();

  ASSERT_TRUE(h_.sim().Restart().ok());
  // Right after the restart the resource is known only from the checkpoint.
  EXPECT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_EQ(h_.sim().GetState().starts(), 2);
  if (GetParam().mode == RegistrationMode::kKubelet) {
    EXPECT_TRUE(plugin.events().WaitForEvent("socket_recreated", {}, kWait));
  }
  EXPECT_TRUE(h_.WaitState([&](const sim::State&) { return plugin.Status().registrations() == 2; }));
  // The running pod passes the kubelet's re-admission check.
  sim::ReadmitResponse r = h_.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
  // And new pods can still be admitted.
  EXPECT_TRUE(h_.sim().Allocate(Pod("after", {{"main", 2}})).ok());
}

TEST_P(PersonalityTest, ReadmissionFailsWhenThePluginDoesNotComeBack) {
  h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h_.sim().Allocate(Pod("victim", {{"main", 1}})).ok());
  h_.StopPlugins();
  ASSERT_TRUE(h_.sim().Restart().ok());
  sim::ReadmitResponse r = h_.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_FALSE(r.results(0).admitted());
  EXPECT_EQ(r.results(0).reason(), "UnexpectedAdmissionError");
  if (GetParam().personality == Personality::kV1Alpha) {
    // 1.9 dropped the resource when the plugin went away.
    EXPECT_THAT(r.results(0).message(), HasSubstr("cannot allocate unregistered device"));
  } else {
    // Later kubelets keep it, stopped, with no healthy device.
    EXPECT_THAT(r.results(0).message(), HasSubstr("no healthy devices present"));
  }
}

TEST_P(PersonalityTest, PluginLossMarksDevicesUnhealthyAndReturnRestoresThem) {
  h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  h_.StopPlugins();
  if (GetParam().personality == Personality::kV1Alpha) {
    // 1.9 had no grace period: the resource is gone at once.
    EXPECT_TRUE(h_.WaitState([&](const sim::State& st) { return h_.Resource(st, kGpu) == nullptr; }));
    EXPECT_TRUE(h_.sim().events().WaitForEvent("resource_removed", {{"resource", kGpu}}, kWait));
  } else {
    EXPECT_TRUE(h_.WaitState([&](const sim::State& st) {
      const auto* r = h_.Resource(st, kGpu);
      return r != nullptr && !r->connected() && r->allocatable() == 0 && r->capacity() == 4;
    }));
  }
  h_.StartPlugin(Options());
  EXPECT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
}

// Scenarios that exist only in v1beta1, run against every v1beta1 personality.
using BetaPersonalityTest = PersonalityTest;

TEST_P(BetaPersonalityTest, PreferredAllocationAndPreStartWhenOffered) {
  SamplePluginOptions o = Options();
  o.preferred = true;
  o.pre_start_required = true;
  o.numa_nodes = 2;  // gpu-0,2 on node 0; gpu-1,3 on node 1
  SamplePlugin& plugin = h_.StartPlugin(o);
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("pref", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  // The plugin packs onto one NUMA node, highest IDs first; the kubelet's
  // own choice would have been gpu-0,gpu-1.
  EXPECT_THAT(testing::DeviceIdsOf(a->allocations(0)), ElementsAre("gpu-2", "gpu-0"));
  EXPECT_TRUE(a->allocations(0).pre_started());
  EXPECT_EQ(plugin.Status().preferred_allocation_calls(), 1);
  EXPECT_EQ(plugin.Status().pre_start_calls(), 1);
  EXPECT_TRUE(h_.sim().events().WaitForEvent("pre_start", {{"container", "main"}}, kWait));
}

TEST_P(BetaPersonalityTest, BatchedAllocateCarriesEveryContainer) {
  SamplePlugin& plugin = h_.StartPlugin(Options());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait));
  sim::AllocateRequest req = Pod("batch", {{"a", 1}, {"b", 2}});
  req.set_batch(true);
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 2);
  EXPECT_EQ(a->allocations(1).response().envs().at("SAMPLE_GPU_DEVICES"),
            absl::StrJoin(a->allocations(1).device_ids(), ","));
  EXPECT_EQ(plugin.Status().allocate_calls(), 1);
}

const Pair kV1AlphaPair{Personality::kV1Alpha, ApiVersion::kV1Alpha, RegistrationMode::kKubelet,
                        "v1alpha"};
const Pair kBetaPairs[] = {
    {Personality::kV1Beta1Async, ApiVersion::kV1Beta1, RegistrationMode::kKubelet,
     "v1beta1_async"},
    {Personality::kV1Beta1Sync, ApiVersion::kV1Beta1, RegistrationMode::kKubelet,
     "v1beta1_sync"},
    {Personality::kPluginWatcher, ApiVersion::kV1Beta1, RegistrationMode::kPluginWatcher,
     "plugin_watcher"},
};

std::string PairName(const ::testing::TestParamInfo<Pair>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(AllPersonalities, PersonalityTest,
                         ::testing::Values(kV1AlphaPair, kBetaPairs[0], kBetaPairs[1],
                                           kBetaPairs[2]),
                         PairName);
INSTANTIATE_TEST_SUITE_P(V1Beta1Personalities, BetaPersonalityTest,
                         ::testing::ValuesIn(kBetaPairs), PairName);

TEST(V1AlphaTest, KubeletNeitherAsksPreferenceNorPreStartsAndSendsOneContainerPerCall) {
  Harness h(Personality::kV1Alpha);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePlugin& p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha, RegistrationMode::kKubelet));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("alpha", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(testing::DeviceIdsOf(a->allocations(0)), ElementsAre("gpu-0", "gpu-1"));  // kubelet's own pick
  EXPECT_FALSE(a->allocations(0).pre_started());
  EXPECT_EQ(p.Status().preferred_allocation_calls(), 0);
  EXPECT_EQ(p.Status().pre_start_calls(), 0);
  sim::AllocateRequest batch = Pod("batch", {{"a", 1}, {"b", 1}});
  batch.set_batch(true);
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(batch);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("one container per Allocate"));
}

// --- Bad registrations, answered with the kubelet's exact texts -----------------------

TEST(BadRegistrationTest, V1Beta1KubeletRejectsWrongVersionAndBadName) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  grpc::Status s = testing::RegisterV1Beta1(h.sim().kubelet_socket(), "v1alpha", kGpu, "x.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported "
            "version is [\"v1beta1\"]");
  s = testing::RegisterV1Beta1(h.sim().kubelet_socket(), "v1beta1", "badname", "x.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(), "the ResourceName \"badname\" is invalid");
  EXPECT_TRUE(h.sim().events().WaitForEvent("registration_rejected", {{"resource", "badname"}},
                                            kWait));
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

TEST(BadRegistrationTest, V1AlphaKubeletWantsExactlyV1Alpha2) {
  Harness h(Personality::kV1Alpha);
  ASSERT_TRUE(h.sim().Start().ok());
  grpc::Status s = testing::RegisterV1Alpha(h.sim().kubelet_socket(), "0.1", kGpu, "x.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(),
            "requested API version \"0.1\" is not supported by kubelet. Supported version "
            "is \"v1alpha2\"");
}

TEST(BadRegistrationTest, SyncKubeletFailsRegisterWhenPluginIsNotServing) {
  Harness h(Personality::kV1Beta1Sync, /*dial_timeout=*/absl::Milliseconds(500));
  ASSERT_TRUE(h.sim().Start().ok());
  grpc::Status s = testing::RegisterV1Beta1(h.sim().kubelet_socket(), "v1beta1", kGpu, "missing.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(), "failed to dial device plugin: context deadline exceeded");
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

TEST(BadRegistrationTest, AsyncKubeletAcceptsRegisterThenFailsToDial) {
  Harness h(Personality::kV1Beta1Async, /*dial_timeout=*/absl::Milliseconds(300));
  ASSERT_TRUE(h.sim().Start().ok());
  grpc::Status s = testing::RegisterV1Beta1(h.sim().kubelet_socket(), "v1beta1", kGpu, "missing.sock");
  EXPECT_TRUE(s.ok()) << s.error_message();  // 1.10-1.24 return at once
  EXPECT_TRUE(h.sim().events().WaitForEvent(
      "plugin_dial_failed", {{"resource", kGpu}}, kWait));
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

// Registers a plugin that offers no options with a RegisterRequest that
// claims pre_start_required, and returns what the kubelet believed.
bool KubeletBelievesRequestOptions(Personality p) {
  Harness h(p);
  EXPECT_TRUE(h.sim().Start().ok());
  SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kNone);
  o.socket_name = "plain.sock";
  h.StartPlugin(o);  // serves, does not register, offers no options
  auto stub = v1beta1::Registration::NewStub(MakeUnixChannel(h.sim().kubelet_socket()));
  grpc::ClientContext ctx;
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_resource_name(kGpu);
  req.set_endpoint("plain.sock");
  req.mutable_options()->set_pre_start_required(true);  // the RPC will say otherwise
  v1beta1::Empty resp;
  EXPECT_TRUE(stub->Register(&ctx, req, &resp).ok());
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const sim::State st = h.sim().GetState();
  const sim::ResourceState* r = h.Resource(st, kGpu);
  return r != nullptr && r->pre_start_required();
}

TEST(BadRegistrationTest, SyncKubeletIgnoresRequestOptions) {
  EXPECT_FALSE(KubeletBelievesRequestOptions(Personality::kV1Beta1Sync));
}

TEST(BadRegistrationTest, AsyncKubeletTakesRequestOptions) {
  EXPECT_TRUE(KubeletBelievesRequestOptions(Personality::kV1Beta1Async));
}

TEST(BadRegistrationTest, ReRegistrationReplacesTheEndpoint) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePluginOptions a = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet);
  a.socket_name = "a.sock";
  h.StartPlugin(a);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  SamplePluginOptions b = a;
  b.socket_name = "b.sock";
  b.devices = 2;
  SamplePlugin& pb = h.StartPlugin(b);
  EXPECT_TRUE(h.WaitState([&](const sim::State& st) {
    const auto* r = h.Resource(st, kGpu);
    return r != nullptr && r->endpoint() == pb.socket_path() && r->capacity() == 2;
  }));
  EXPECT_TRUE(h.sim().events().WaitForEvent("endpoint_replaced", {{"resource", kGpu}}, kWait));
}

TEST(BadRegistrationTest, UnknownServicesAnswerLikeGo) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  // A v1beta1 kubelet does not serve v1alpha's Registration at all.
  grpc::Status s = testing::RegisterV1Alpha(h.sim().kubelet_socket(), "v1alpha2", kGpu, "x.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(s.error_message(), "unknown service deviceplugin.Registration");
}

// --- Mismatched pairs fail the way they fail in the field -------------------------------

TEST(MismatchTest, V1AlphaPluginOnV1Beta1Kubelet) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePlugin& p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha, RegistrationMode::kKubelet));
  absl::Status s = p.last_registration();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown service deviceplugin.Registration"));
  EXPECT_EQ(p.Status().registrations(), 0);
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);  // capacity stays 0
}

TEST(MismatchTest, V1Beta1PluginOnV1AlphaKubelet) {
  Harness h(Personality::kV1Alpha);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePlugin& p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet));
  absl::Status s = p.last_registration();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown service v1beta1.Registration"));
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

TEST(MismatchTest, V1AlphaPluginThroughPluginWatcherIsRejected) {
  Harness h(Personality::kPluginWatcher);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePlugin& p =
      h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha, RegistrationMode::kPluginWatcher));
  EXPECT_TRUE(p.events().WaitForEvent("registration_failed", {}, kWait));
  EXPECT_THAT(p.Status().last_registration_error(),
              HasSubstr("manager version, v1beta1, is not among plugin supported versions "
                        "[v1alpha2]"));
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

TEST(MismatchTest, WrongVersionStringFromAV1Beta1Plugin) {
  Harness h(Personality::kV1Beta1Async);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet);
  o.register_version = "v1";
  SamplePlugin& p = h.StartPlugin(o);
  EXPECT_EQ(p.last_registration().code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(p.last_registration().message()),
              HasSubstr("requested API version \"v1\" is not supported by kubelet"));
}

// --- Plugin watcher specifics -------------------------------------------------------------

TEST(PluginWatcherTest, MarkerAndDeregistrationBySocketRemoval) {
  Harness h(Personality::kPluginWatcher);
  ASSERT_TRUE(h.sim().Start().ok());
  // 1.31: no marker (written up to 1.24 only).
  EXPECT_FALSE(PathExists(JoinPath(h.sim().device_plugin_dir(), "DEPRECATION")));
  SamplePlugin& p =
      h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kPluginWatcher));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  // The kubelet opens ListAndWatch before it sends NotifyRegistrationStatus,
  // so the devices can be listed before the plugin hears it is registered.
  EXPECT_TRUE(h.WaitState([&](const sim::State&) { return p.Status().registrations() == 1; }));
  // Removing the registration socket is deregistration. The plugin keeps
  // running, notices, and serves a new socket, which the watcher picks up.
  size_t mark = h.sim().events().Size();
  ASSERT_EQ(::unlink(p.socket_path().c_str()), 0);
  EXPECT_TRUE(h.sim().events().WaitForEvent("plugin_deregistered", {{"resource", kGpu}}, kWait,
                                            mark));
  EXPECT_TRUE(h.sim().events().WaitForEvent("registered", {{"via", "plugin-watcher"}}, kWait,
                                            mark));
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(h.WaitState([&](const sim::State&) { return p.Status().registrations() == 2; }));
}

TEST(PluginWatcherTest, PluginStopMakesDevicesUnhealthy) {
  Harness h(Personality::kPluginWatcher);
  ASSERT_TRUE(h.sim().Start().ok());
  h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kPluginWatcher));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  h.StopPlugins();
  EXPECT_TRUE(h.WaitState([&](const sim::State& st) {
    const auto* r = h.Resource(st, kGpu);
    return r != nullptr && !r->connected() && r->allocatable() == 0;
  }));
}

TEST(KubeletRestartTest, WipesPluginFilesButKeepsCheckpointAndDirectories) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  const std::string dp = h.sim().device_plugin_dir();
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dp, "stale.sock"), "").ok());
  ASSERT_TRUE(MakeDirs(JoinPath(dp, "subdir")).ok());
  ASSERT_TRUE(h.sim().Restart().ok());
  EXPECT_FALSE(PathExists(JoinPath(dp, "stale.sock")));
  EXPECT_TRUE(PathExists(JoinPath(dp, "subdir")));
  EXPECT_TRUE(PathExists(h.sim().kubelet_socket()));
}

// A kubelet that wipes the plugin's socket as the plugin's first Register
// arrives (the simulator's late wipe) dials it back while the plugin
// serves it again, and answers once the new server is dialled: the
// plugin watches its directory from before that Register, and counts the
// registration as made with the new server. Registering there again is
// refused by a 1.37 kubelet ("device plugin already connected"), which
// then never lets the socket go.
TEST(KubeletRestartTest, APluginWipedAsItRegistersRegistersOnce) {
  Harness h(Personality::kV1Beta1Sync);
  h.sim().SetLateWipe(absl::Seconds(30));  // lands when the first Register arrives
  ASSERT_TRUE(h.sim().Start().ok());
  absl::StatusOr<sim::KubeletVersion> v137 = sim::ParseKubeletVersion("1.37");
  ASSERT_TRUE(v137.ok());
  ASSERT_TRUE(h.sim().Restart(*v137).ok());
  const size_t from = h.sim().events().Size();
  SamplePlugin& p =
      h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(
      h.sim().events().WaitForEvent("directory_cleaned", {{"late", true}}, absl::ZeroDuration(), from));
  // Two more looks at the kubelet: the one after the registration's has
  // ended.
  ASSERT_TRUE(p.kubelet_checks().WaitFor(p.kubelet_checks().Get() + 2, kWait));
  int registered = 0;
  for (const Json& e : h.sim().events().Since(from)) {
    EXPECT_NE(e.value("event", ""), "registration_rejected") << e.dump();
    registered += e.value("event", "") == "registered";
  }
  EXPECT_EQ(registered, 1);
  EXPECT_EQ(p.Status().registrations(), 1);
}

// WaitForPodsSynced returns once the re-admission pass is said: its
// "pods_synced" event is already in the log (a bench judges the pass by it).
TEST(KubeletRestartTest, PodsSyncedIsSaidBeforeTheWaitForItEnds) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("running", {{"c", 1}})).ok());
  for (int i = 0; i < 3; ++i) {
    const size_t from = h.sim().events().Size();
    ASSERT_TRUE(h.sim().Restart().ok());
    ASSERT_TRUE(h.sim().WaitForPodsSynced(kWait));
    EXPECT_TRUE(h.sim().events().WaitForEvent("pods_synced", {}, absl::ZeroDuration(), from))
        << "restart " << i;
  }
}

// From 1.33 the kubelet's start removes only sockets: a plugin's other
// files in device-plugins/ stay.
TEST(KubeletRestartTest, From133OnlySocketsAreWiped) {
  Harness h(Personality::kV1Beta1Sync);
  absl::StatusOr<sim::KubeletVersion> v132 = sim::ParseKubeletVersion("1.32");
  absl::StatusOr<sim::KubeletVersion> v133 = sim::ParseKubeletVersion("1.33");
  ASSERT_TRUE(v132.ok() && v133.ok());
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.sim().Restart(*v133).ok());
  const std::string dp = h.sim().device_plugin_dir();
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dp, "vendor.conf"), "x").ok());
  {
    testing::SilentSocket plugin(JoinPath(dp, "vendor.sock"));
    ASSERT_GE(plugin.fd(), 0);
  }
  ASSERT_TRUE(h.sim().Restart(*v133).ok());
  EXPECT_TRUE(PathExists(JoinPath(dp, "vendor.conf")));
  EXPECT_FALSE(PathExists(JoinPath(dp, "vendor.sock")));
  ASSERT_TRUE(h.sim().Restart(*v132).ok());
  EXPECT_FALSE(PathExists(JoinPath(dp, "vendor.conf")));
}

// A kubelet that starts while the plugin's registration attempts fail
// (the old one is gone): the attempt that succeeds reaches the new kubelet,
// after the plugin served the socket that kubelet wiped, and the plugin
// counts itself registered there. Had it noted the kubelet.sock it read
// before its attempts, its next look would take the new one for another
// restart and register again, which a 1.37 kubelet refuses ("device plugin
// already connected") and then never lets the socket go: on a real 1.37.2
// node the devices stayed allocatable after the plugin stopped.
TEST(KubeletRestartTest, APluginRegistersOnceWithAKubeletThatStartsDuringItsAttempts) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  absl::StatusOr<sim::KubeletVersion> v137 = sim::ParseKubeletVersion("1.37");
  ASSERT_TRUE(v137.ok());
  ASSERT_TRUE(h.sim().Restart(*v137).ok());
  // 1: the next attempt finds the kubelet stopped; 2: the one after finds
  // it started again.
  std::atomic<int> step{0};
  absl::Status started;
  absl::Notification restart_returned, restarted;
  SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet);
  o.before_register_attempt = [&] {
    if (step.load() == 1) {
      // Not while the test's restart is still starting the kubelet.
      restart_returned.WaitForNotificationWithTimeout(kWait);
      h.sim().Stop();
      step = 2;
    } else if (step.load() == 2) {
      started = h.sim().Start();
      step = 0;
      restarted.Notify();
    }
  };
  SamplePlugin& plugin = h.StartPlugin(o);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  step = 1;
  const size_t from = h.sim().events().Size();
  const absl::Status restart = h.sim().Restart();
  restart_returned.Notify();
  ASSERT_TRUE(restart.ok()) << restart;
  ASSERT_TRUE(restarted.WaitForNotificationWithTimeout(kWait)) << "the plugin made no attempts";
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_TRUE(h.WaitState([&](const sim::State&) {
    return plugin.registered_kubelet().has_value() &&
           plugin.registered_kubelet() == StatFileId(h.sim().kubelet_socket());
  })) << "the plugin counts itself registered with another kubelet than the one running";
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(h.sim().Allocate(Pod("after", {{"main", 1}})).ok());
  const std::vector<Json> events = h.sim().events().Snapshot();
  for (size_t i = from; i < events.size(); ++i) {
    EXPECT_NE(events[i].value("event", ""), "registration_rejected") << events[i].dump();
  }
}

TEST(KubeletRestartTest, UpgradeToAnotherPersonalityKeepsAllocations) {
  Harness h(Personality::kV1Beta1Async);
  ASSERT_TRUE(h.sim().Start().ok());
  h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("long-running", {{"main", 1}})).ok());
  ASSERT_TRUE(h.sim().Restart(Personality::kV1Beta1Sync).ok());
  EXPECT_EQ(h.sim().GetState().personality(), "v1beta1-sync");
  EXPECT_EQ(h.sim().GetState().allocations_size(), 1);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted());
}

TEST(SocketPathTest, TooLongRootIsAClearError) {
  KubeletSimOptions o;
  o.root_dir = "/tmp/" + std::string(100, 'x');
  KubeletSim sim(o);
  absl::Status s = sim.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Unix socket path may be at most 107"));
}

TEST(SamplePluginOptionsTest, BadConfigurationIsNamed) {
  SamplePluginOptions o;
  o.resource = "gpu";
  EXPECT_THAT(std::string(sample::ValidateOptions(o).message()), HasSubstr("--resource"));
  o = SamplePluginOptions();
  o.api = ApiVersion::kV1Alpha;
  o.preferred = true;
  EXPECT_THAT(std::string(sample::ValidateOptions(o).message()),
              HasSubstr("--preferred needs --api=v1beta1"));
  o = SamplePluginOptions();
  o.id_pattern = "same";
  EXPECT_THAT(std::string(sample::ValidateOptions(o).message()), HasSubstr("{i}"));
  o = SamplePluginOptions();
  o.flip_device = "nope";
  EXPECT_THAT(std::string(sample::ValidateOptions(o).message()), HasSubstr("--flip_device"));
  o = SamplePluginOptions();
  o.id_pattern = "{uuid}";
  o.devices = 2;
  EXPECT_TRUE(sample::ValidateOptions(o).ok());
  // The same IDs in every process and every release of the plugin (a
  // kubelet's checkpoint names them across restarts and upgrades): these
  // values were computed apart, from FNV-1a of "<resource>#<index>".
  EXPECT_THAT(sample::DeviceIds(o),
              ElementsAre("54d51f81-b4e8-36a2-6e79-2f28fbf16e24",
                          "54d52081-b4e8-3855-6e79-3028fbf16fd7"));
  o.resource = "example.com/other";
  EXPECT_THAT(sample::DeviceIds(o),
              ElementsAre("da2c965b-2d90-b1e4-e24e-a17a9d3ebc4a", ::testing::_));
}

// The kubelet replaces a resource's device sets under its device manager's
// lock and writes its checkpoint once the lock is released
// (genericDeviceUpdateCallback): a large list being written holds up no
// other plugin's registration.
TEST(DeviceListTest, AListBeingCheckpointedHoldsUpNoOtherRegistration) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  constexpr char kNic[] = "example.com/nic";
  absl::Notification held, released;
  std::atomic<bool> other_registered{false};
  h.sim().SetBeforeListCheckpoint([&](const std::string& resource) {
    if (resource != kGpu || held.HasBeenNotified()) return;
    held.Notify();
    other_registered = h.sim()
                           .events()
                           .WaitForEvent("registered", {{"resource", kNic}}, kWait)
                           .has_value();
    released.Notify();
  });
  h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet));
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(kWait));
  SamplePluginOptions nic = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet);
  nic.resource = kNic;
  nic.socket_name = "nic.sock";
  nic.id_pattern = "nic-{i}";
  h.StartPlugin(nic);
  ASSERT_TRUE(released.WaitForNotificationWithTimeout(kWait + kWait));
  EXPECT_TRUE(other_registered) << "the second plugin's registration waited on the first list";
  h.sim().SetBeforeListCheckpoint(nullptr);
  // Both lists reached the device manager, and the held one's checkpoint
  // was written after all.
  EXPECT_TRUE(h.WaitState([&](const sim::State& st) {
    const sim::ResourceState* gpu = h.Resource(st, kGpu);
    const sim::ResourceState* other = h.Resource(st, kNic);
    return gpu != nullptr && other != nullptr && gpu->allocatable() == 4 &&
           other->allocatable() == 4;
  }));
  // A list's event follows its checkpoint's write (or a later one's).
  for (const char* r : {kGpu, kNic}) {
    EXPECT_TRUE(h.sim().events().WaitForEvent("devices", {{"resource", r}}, kWait)) << r;
  }
  absl::StatusOr<std::string> checkpoint = ReadFile(h.sim().checkpoint_path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT(*checkpoint, HasSubstr("gpu-3"));
}

TEST(SamplePluginTest, ScheduledHealthFlip) {
  Harness h(Personality::kV1Beta1Sync);
  ASSERT_TRUE(h.sim().Start().ok());
  SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1, RegistrationMode::kKubelet);
  o.flip_device = "gpu-3";
  o.flip_interval = absl::Milliseconds(200);
  h.StartPlugin(o);
  EXPECT_TRUE(h.WaitState([&](const sim::State&) { return h.DeviceHealth("gpu-3") == "Unhealthy"; }));
  EXPECT_TRUE(h.WaitState([&](const sim::State&) { return h.DeviceHealth("gpu-3") == "Healthy"; }));
}

}  // namespace
}  // namespace dpproxy
