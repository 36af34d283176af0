// The version matrix: every kubelet personality x every plugin version, with
// dpproxy in the middle, each cell running the same scenarios. `tools/dev
// matrix` prints the results as a table; `tools/dev test` runs the same cases.
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sample::SamplePlugin;
using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kGpu[] = "vendor.com/gpu";

sim::AllocateRequest Pod(const std::string& name,
                         const std::vector<std::pair<std::string, int>>& containers) {
  return testing::PodRequest(name, containers, kGpu);
}

struct Cell {
  Personality personality;
  ApiVersion plugin;
};

std::string CellName(const ::testing::TestParamInfo<Cell>& info) {
  std::string k = sim::PersonalityName(info.param.personality);
  for (char& c : k) c = c == '-' ? '_' : c;
  return absl::StrCat(k, "__", info.param.plugin == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1");
}

void PrintTo(const Cell& c, std::ostream* os) {
  *os << sim::PersonalityName(c.personality) << " x "
      << (c.plugin == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1");
}

class MatrixTest : public ::testing::TestWithParam<Cell> {
 protected:
  MatrixTest()
      : h_(GetParam().personality, GetParam().personality == Personality::kPluginWatcher) {}

  void SetUp() override {
    ASSERT_TRUE(h_.sim().Start().ok());
    ASSERT_TRUE(h_.proxy().Start().ok());
  }

  sample::SamplePluginOptions Options() { return h_.PluginOptions(GetParam().plugin); }
  bool BetaPlugin() const { return GetParam().plugin == ApiVersion::kV1Beta1; }
  bool AlphaKubelet() const { return GetParam().personality == Personality::kV1Alpha; }

  // Starts the plugin and waits until the kubelet sees all 4 devices healthy.
  SamplePlugin* Up(sample::SamplePluginOptions o) {
    SamplePlugin* p = h_.StartPlugin(o);
    EXPECT_NE(p, nullptr);
    EXPECT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait)) << StatusToJson(h_.proxy().Status()).dump();
    return p;
  }
  SamplePlugin* Up() { return Up(Options()); }

  std::string ExpectedKubeletApi() const {
    switch (GetParam().personality) {
      case Personality::kV1Alpha: return "v1alpha2";
      case Personality::kPluginWatcher: return "v1beta1 (plugin-watcher)";
      default: return "v1beta1";
    }
  }

  ProxyHarness h_;
};

TEST_P(MatrixTest, RegistrationAndDeviceList) {
  Up();
  sim::State st = h_.sim().GetState();
  const sim::ResourceState* r = h_.Resource(st, kGpu);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->capacity(), 4);
  EXPECT_EQ(r->endpoint(), h_.proxy().KubeletSocketOf(kGpu));  // the kubelet talks to the proxy
  EXPECT_EQ(r->api_version(), AlphaKubelet() ? "v1alpha2" : "v1beta1");
  // Through the plugin watcher, dpproxy learns it is registered from the
  // kubelet's NotifyRegistrationStatus, which may come after the devices.
  EXPECT_TRUE(h_.WaitFor([&] {
    const ProxyStatus st = h_.proxy().Status();
    return st.resources.size() == 1 && !st.resources[0].kubelet_api.empty();
  }));
  Json status = StatusToJson(h_.proxy().Status());
  ASSERT_EQ(status["resources"].size(), 1u);
  EXPECT_EQ(status["resources"][0]["kubelet_api"], ExpectedKubeletApi());
  EXPECT_EQ(status["resources"][0]["backend_api"], BetaPlugin() ? "v1beta1" : "v1alpha2");
  std::set<std::string> ids;
  for (const auto& d : r->devices()) ids.insert(d.id());
  EXPECT_EQ(ids, (std::set<std::string>{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}));
}

TEST_P(MatrixTest, AllocateOneContainer) {
  SamplePlugin* p = Up();
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("one", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 1);
  const auto& c = a->allocations(0);
  EXPECT_EQ(c.response().envs().at("SAMPLE_GPU_DEVICES"), absl::StrJoin(c.device_ids(), ","));
  EXPECT_EQ(c.response().envs().at("SAMPLE_PLUGIN_API"), BetaPlugin() ? "v1beta1" : "v1alpha");
  EXPECT_EQ(c.response().devices_size(), 2);
  EXPECT_EQ(c.response().mounts_size(), 2);
  // Annotations and CDI devices exist only from a v1beta1 plugin to a
  // v1beta1 kubelet; toward a 1.9 kubelet they are dropped and counted.
  // A v1beta1 kubelet before 1.28 (v1beta1-async plays 1.24) drops CDI
  // devices itself, as it would from the plugin directly.
  const bool carried = BetaPlugin() && !AlphaKubelet();
  EXPECT_EQ(c.response().annotations_size(), carried ? 1 : 0);
  EXPECT_EQ(c.response().cdi_devices_size(),
            carried && h_.sim().kubelet().ReadsCdiDevices() ? 2 : 0);
  if (BetaPlugin() && AlphaKubelet()) {
    EXPECT_EQ(h_.proxy().losses().Count(kGpu, "annotations"), 1);
    EXPECT_EQ(h_.proxy().losses().Count(kGpu, "cdi_devices"), 2);
    EXPECT_TRUE(h_.proxy().events().WaitForEvent("lossy_translation", {{"kind", "cdi_devices"}},
                                                 kWait));
  }
  EXPECT_EQ(p->Status().allocate_calls(), 1);
}

TEST_P(MatrixTest, AllocateTwoContainers) {
  SamplePlugin* p = Up();
  absl::StatusOr<sim::AllocateResponse> a =
      h_.sim().Allocate(Pod("two", {{"trainer", 2}, {"sidecar", 1}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 2);
  std::set<std::string> all;
  for (const auto& c : a->allocations()) {
    EXPECT_EQ(c.response().envs().at("SAMPLE_GPU_DEVICES"), absl::StrJoin(c.device_ids(), ","));
    all.insert(c.device_ids().begin(), c.device_ids().end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(p->Status().allocate_calls(), 2);
  if (!AlphaKubelet()) {
    // The batched form (two container requests in one call) is fanned out
    // to a v1alpha backend in order and merged back.
    sim::AllocateRequest batch = Pod("batch", {{"x", 1}});
    batch.set_batch(true);
    ASSERT_TRUE(h_.sim().DeletePod(a->pod_uid()).ok());
    batch = Pod("batch", {{"x", 1}, {"y", 2}});
    batch.set_batch(true);
    absl::StatusOr<sim::AllocateResponse> b = h_.sim().Allocate(batch);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(b->allocations_size(), 2);
    EXPECT_EQ(b->allocations(1).response().envs().at("SAMPLE_GPU_DEVICES"),
              absl::StrJoin(b->allocations(1).device_ids(), ","));
    EXPECT_EQ(p->Status().allocate_calls(), BetaPlugin() ? 3 : 4);
  }
}

TEST_P(MatrixTest, GetPreferredAllocation) {
  sample::SamplePluginOptions o = Options();
  if (BetaPlugin()) {
    o.preferred = true;
    o.numa_nodes = 2;
  }
  SamplePlugin* p = Up(o);
  // What the kubelet was told: offered whatever the plugin offers, since
  // dpproxy answers the call itself for a plugin without it (steering new
  // pods around held devices). A 1.9 kubelet reads no options at all.
  {
    sim::State st = h_.sim().GetState();
    const sim::ResourceState* r = h_.Resource(st, kGpu);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->get_preferred_allocation_available(), !AlphaKubelet());
  }
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("pref", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<std::string> ids(a->allocations(0).device_ids().begin(),
                               a->allocations(0).device_ids().end());
  if (BetaPlugin() && !AlphaKubelet()) {
    // Passed through: the plugin's NUMA-packed choice, not the kubelet's.
    EXPECT_THAT(ids, ElementsAre("gpu-2", "gpu-0"));
    EXPECT_EQ(p->Status().preferred_allocation_calls(), 1);
  } else {
    // A 1.9 kubelet has no such call; for a v1alpha backend, which has none
    // to offer, dpproxy answers with the kubelet's own order (no device is
    // held here).
    EXPECT_THAT(ids, ElementsAre("gpu-0", "gpu-1"));
    EXPECT_EQ(p->Status().preferred_allocation_calls(), 0);
  }
}

TEST_P(MatrixTest, PreStartContainer) {
  sample::SamplePluginOptions o = Options();
  if (BetaPlugin()) o.pre_start_required = true;
  SamplePlugin* p = Up(o);
  {
    sim::State st = h_.sim().GetState();
    const sim::ResourceState* r = h_.Resource(st, kGpu);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->pre_start_required(), BetaPlugin() && !AlphaKubelet());
  }
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("pre", {{"main", 1}}));
  ASSERT_TRUE(a.ok()) << a.status();
  if (BetaPlugin()) {
    // From a v1beta1 kubelet through the proxy; for a 1.9 kubelet (which has
    // no PreStartContainer) the proxy calls it right after Allocate.
    EXPECT_EQ(p->Status().pre_start_calls(), 1);
    EXPECT_EQ(a->allocations(0).pre_started(), !AlphaKubelet());
  } else {
    EXPECT_EQ(p->Status().pre_start_calls(), 0);
    EXPECT_FALSE(a->allocations(0).pre_started());
  }
}

TEST_P(MatrixTest, HealthFlipSeenByKubelet) {
  SamplePlugin* p = Up();
  ASSERT_TRUE(p->SetHealth("gpu-2", "Unhealthy").ok());
  EXPECT_TRUE(h_.WaitFor([&] { return h_.KubeletHealth(kGpu, "gpu-2") == "Unhealthy"; }));
  ASSERT_TRUE(p->SetHealth("gpu-2", "Healthy").ok());
  EXPECT_TRUE(h_.WaitFor([&] { return h_.KubeletHealth(kGpu, "gpu-2") == "Healthy"; }));
}

TEST_P(MatrixTest, KubeletRestart) {
  SamplePlugin* p = Up();
  absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(Pod("running", {{"main", 2}}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(h_.sim().Restart().ok());
  ASSERT_TRUE(h_.sim().WaitForResource(kGpu, 4, kWait)) << StatusToJson(h_.proxy().Status()).dump();
  sim::State st = h_.sim().GetState();
  std::set<std::string> ids;
  for (const auto& d : h_.Resource(st, kGpu)->devices()) ids.insert(d.id());
  EXPECT_EQ(ids, (std::set<std::string>{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}));
  sim::ReadmitResponse r = h_.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
  // The backend never noticed: one registration with the proxy, one stream.
  EXPECT_EQ(p->Status().registrations(), 1);
  EXPECT_EQ(p->Status().list_and_watch_streams(), 1);
}

TEST_P(MatrixTest, BackendRestart) {
  Up();
  const size_t mark = h_.sim().events().Size();
  h_.StopPlugins();
  // Devices go Unhealthy, but the kubelet's stream to the proxy stays up.
  EXPECT_TRUE(h_.WaitFor([&] { return h_.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
  Up();
  EXPECT_TRUE(h_.WaitFor([&] { return h_.KubeletHealth(kGpu, "gpu-0") == "Healthy"; }));
  sim::State st = h_.sim().GetState();
  EXPECT_TRUE(h_.Resource(st, kGpu)->connected());
  EXPECT_EQ(h_.Resource(st, kGpu)->capacity(), 4);
  EXPECT_FALSE(h_.sim().events().WaitForEvent("plugin_lost", {{"resource", kGpu}},
                                              absl::ZeroDuration(), mark));
  EXPECT_TRUE(h_.sim().Allocate(Pod("after", {{"main", 1}})).ok());
}

TEST_P(MatrixTest, ProxyStopsCleanly) {
  Up();
  const std::string socket = h_.proxy().KubeletSocketOf(kGpu);
  ASSERT_TRUE(PathExists(socket));
  h_.proxy().Shutdown();
  EXPECT_FALSE(PathExists(socket));
  EXPECT_FALSE(PathExists(h_.proxy().backend_registration_socket()));
  // The kubelet sees its stream end, as with any plugin that exits.
  EXPECT_TRUE(h_.WaitFor([&] {
    sim::State st = h_.sim().GetState();
    const auto* r = h_.Resource(st, kGpu);
    return r == nullptr || !r->connected();
  }));
  EXPECT_TRUE(h_.proxy().events().WaitForEvent("proxy_stopped", {}, kWait));
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, MatrixTest,
    ::testing::Values(Cell{Personality::kV1Alpha, ApiVersion::kV1Alpha},
                      Cell{Personality::kV1Alpha, ApiVersion::kV1Beta1},
                      Cell{Personality::kV1Beta1Async, ApiVersion::kV1Alpha},
                      Cell{Personality::kV1Beta1Async, ApiVersion::kV1Beta1},
                      Cell{Personality::kV1Beta1Sync, ApiVersion::kV1Alpha},
                      Cell{Personality::kV1Beta1Sync, ApiVersion::kV1Beta1},
                      Cell{Personality::kPluginWatcher, ApiVersion::kV1Alpha},
                      Cell{Personality::kPluginWatcher, ApiVersion::kV1Beta1}),
    CellName);

}  // namespace
}  // namespace dpproxy
