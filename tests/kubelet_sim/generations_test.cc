// Kubelet generations: the simulator plays a kubelet release by minor version,
// and what a release does not read it drops, as that release's proto would (the
// v1beta1 API's fields by release, and the device manager's behaviour). Real
// gRPC servers on real Unix sockets: the sample plugin offers everything
// (topology, a preferred allocation, CDI devices) and each release must take
// exactly its part.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy {
namespace {

using sample::RegistrationMode;
using sample::SamplePlugin;
using sample::SamplePluginOptions;
using sim::KubeletSim;
using sim::KubeletSimOptions;
using sim::KubeletVersion;
using sim::ParseKubeletVersion;
using sim::Personality;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);
constexpr char kGpu[] = "vendor.com/gpu";

KubeletVersion MustParse(const std::string& name, std::optional<bool> gate = std::nullopt) {
  absl::StatusOr<KubeletVersion> k = ParseKubeletVersion(name, gate);
  EXPECT_TRUE(k.ok()) << k.status();
  return k.value_or(KubeletVersion{});
}

TEST(KubeletVersionTest, ReleasesMapToTheirRegistrationAndReading) {
  KubeletVersion k = MustParse("1.9");
  EXPECT_EQ(k.personality, Personality::kV1Alpha);
  EXPECT_FALSE(k.plugin_watcher);
  EXPECT_EQ(k.GenerationName(), "1.9");
  k = MustParse("1.12");
  EXPECT_EQ(k.personality, Personality::kV1Beta1Async);
  EXPECT_FALSE(k.plugin_watcher);  // 1.12 watched plugins/, which is not simulated
  EXPECT_FALSE(k.ReadsTopology());
  k = MustParse("1.13");
  EXPECT_TRUE(k.plugin_watcher);
  EXPECT_EQ(k.GenerationName(), "1.10-1.15");
  k = MustParse("1.16");
  EXPECT_TRUE(k.ReadsTopology());
  EXPECT_FALSE(k.CallsGetPreferredAllocation());
  k = MustParse("1.24");
  EXPECT_EQ(k.personality, Personality::kV1Beta1Async);
  EXPECT_TRUE(k.CallsGetPreferredAllocation());
  EXPECT_FALSE(k.ReadsCdiDevices());
  k = MustParse("1.25");
  EXPECT_EQ(k.personality, Personality::kV1Beta1Sync);
  EXPECT_EQ(k.GenerationName(), "1.25-1.27");
  EXPECT_FALSE(MustParse("1.28").ReadsCdiDevices());  // alpha gate, off by default
  EXPECT_TRUE(MustParse("1.28", true).ReadsCdiDevices());
  EXPECT_TRUE(MustParse("1.29").ReadsCdiDevices());  // beta, on by default
  EXPECT_FALSE(MustParse("1.30", false).ReadsCdiDevices());
  EXPECT_TRUE(MustParse("1.31").ReadsCdiDevices());
  EXPECT_EQ(MustParse("1.36").GenerationName(), "1.31-1.36");
}

TEST(KubeletVersionTest, PersonalitiesAreAliases) {
  EXPECT_EQ(MustParse("v1alpha").minor, 9);
  EXPECT_EQ(MustParse("v1beta1-async").minor, 24);
  EXPECT_EQ(MustParse("v1beta1-sync").minor, 31);
  const KubeletVersion w = MustParse("plugin-watcher");
  EXPECT_EQ(w.minor, 31);
  EXPECT_TRUE(w.plugin_watcher);
  EXPECT_EQ(w.personality, Personality::kPluginWatcher);
}

TEST(KubeletVersionTest, BadNamesAreRefusedWithWhatIsAccepted) {
  for (const char* bad : {"1.8", "1.38", "2.0", "1.", "1.x", "1.2x", "v1beta2", ""}) {
    absl::StatusOr<KubeletVersion> k = ParseKubeletVersion(bad);
    EXPECT_FALSE(k.ok()) << bad;
  }
  EXPECT_THAT(ParseKubeletVersion("1.8").status().message(), HasSubstr("1.9 to 1.37"));
  EXPECT_THAT(ParseKubeletVersion("v1beta2").status().message(),
              HasSubstr("e.g. 1.24"));
  EXPECT_THAT(ParseKubeletVersion("1.27", true).status().message(),
              HasSubstr("no DevicePluginCDIDevices feature gate"));
  EXPECT_FALSE(ParseKubeletVersion("1.31", false).ok());
}

TEST(KubeletVersionTest, GenerationsCoverEveryReleaseOnce) {
  int next = sim::kOldestKubeletMinor;
  for (const sim::KubeletGeneration& g : sim::KubeletGenerations()) {
    EXPECT_EQ(g.first_minor, next);
    EXPECT_LE(g.first_minor, g.last_minor);
    next = g.last_minor + 1;
  }
  EXPECT_EQ(next, sim::kNewestKubeletMinor + 1);
}

struct Case {
  Case(std::string k, std::optional<bool> gate = std::nullopt)
      : kubelet(std::move(k)), cdi_gate(gate) {}
  std::string kubelet;
  std::optional<bool> cdi_gate;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.kubelet;
  if (c.cdi_gate.has_value()) *os << (*c.cdi_gate ? " gate on" : " gate off");
}

class GenerationTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    KubeletSimOptions o;
    o.root_dir = dir_.Sub("kubelet");
    o.kubelet = MustParse(GetParam().kubelet, GetParam().cdi_gate);
    sim_ = std::make_unique<KubeletSim>(o);
    ASSERT_TRUE(sim_->Start().ok());
    SamplePluginOptions p;
    p.resource = kGpu;
    p.devices = 4;
    p.id_pattern = "gpu-{i}";
    p.numa_nodes = 2;
    p.preferred = true;
    p.kubelet_socket = sim_->kubelet_socket();
    p.plugins_registry_dir = sim_->plugins_registry_dir();
    plugin_ = std::make_unique<SamplePlugin>(p);
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(sim_->WaitForResource(kGpu, 4, kWait));
  }

  testing::ShortTempDir dir_;
  std::unique_ptr<KubeletSim> sim_;
  std::unique_ptr<SamplePlugin> plugin_;
};

TEST_P(GenerationTest, ReadsWhatItsReleaseReadsAndDropsTheRest) {
  const KubeletVersion k = sim_->kubelet();
  const sim::State st = sim_->GetState();
  EXPECT_EQ(st.kubelet(), GetParam().kubelet);
  EXPECT_EQ(st.generation(), k.GenerationName());
  const sim::ResourceState* r = testing::FindResource(st, kGpu);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->devices_size(), 4);
  // Topology: the device list carried NUMA nodes; 1.16+ read them.
  EXPECT_EQ(r->devices(1).numa_nodes_size(), k.ReadsTopology() ? 1 : 0);
  // GetPreferredAllocation: offered; 1.19+ know the option and call it.
  EXPECT_EQ(r->get_preferred_allocation_available(), k.CallsGetPreferredAllocation());
  // Registration: asynchronous before 1.25, synchronous since.
  EXPECT_TRUE(sim_->events()
                  .WaitForEvent("registered",
                                {{"resource", kGpu}, {"mode", k.minor >= 25 ? "sync" : "async"}},
                                kWait)
                  .has_value());

  absl::StatusOr<sim::AllocateResponse> a =
      sim_->Allocate(testing::PodRequest("p", {{"main", 2}}, kGpu));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->allocations_size(), 1);
  EXPECT_EQ(plugin_->Status().preferred_allocation_calls() > 0, k.CallsGetPreferredAllocation());
  // cdi_devices: sent by the plugin, read from 1.28 with the gate, 1.31 always.
  EXPECT_EQ(a->allocations(0).response().cdi_devices_size(), k.ReadsCdiDevices() ? 2 : 0);
  // What every v1beta1 release reads.
  EXPECT_EQ(a->allocations(0).response().devices_size(), 2);
  EXPECT_FALSE(a->allocations(0).response().annotations().empty());
}

INSTANTIATE_TEST_SUITE_P(
    Releases, GenerationTest,
    ::testing::Values(Case{"1.10"}, Case{"1.15"}, Case{"1.16"}, Case{"1.18"}, Case{"1.19"},
                      Case{"1.24"}, Case{"1.25"}, Case{"1.27"}, Case{"1.28"},
                      Case{"1.28", true}, Case{"1.29"}, Case{"1.30", false}, Case{"1.31"},
                      Case{"1.36"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = info.param.kubelet;
      for (char& c : n) c = c == '.' ? '_' : c;
      if (info.param.cdi_gate.has_value()) n += *info.param.cdi_gate ? "_gate_on" : "_gate_off";
      return "k" + n;
    });

// The plugin watcher: 1.13+ watch plugins_registry/, and up to 1.24 leave
// the DEPRECATION marker in device-plugins/ (from 1.25 nothing writes it:
// the kubelet's e2e sample plugin, which skips registering at kubelet.sock
// where it finds the marker, registers there); before 1.13 nothing answers
// a plugin that registers in plugins_registry/.
TEST(GenerationWatcherTest, PluginsRegistryIsWatchedFrom113) {
  for (const char* release : {"1.12", "1.13", "1.24", "1.25", "1.37"}) {
    SCOPED_TRACE(release);
    testing::ShortTempDir dir;
    KubeletSimOptions o;
    o.root_dir = dir.Sub("kubelet");
    o.kubelet = MustParse(release);
    KubeletSim sim(o);
    ASSERT_TRUE(sim.Start().ok());
    SamplePluginOptions p;
    p.resource = kGpu;
    p.registration = RegistrationMode::kPluginWatcher;
    p.kubelet_socket = sim.kubelet_socket();
    p.plugins_registry_dir = sim.plugins_registry_dir();
    SamplePlugin plugin(p);
    ASSERT_TRUE(plugin.Start().ok());
    const std::string r = release;
    const bool watches = r != "1.12";
    EXPECT_EQ(PathExists(JoinPath(sim.device_plugin_dir(), "DEPRECATION")),
              r == "1.13" || r == "1.24");
    if (watches) {
      EXPECT_TRUE(sim.WaitForResource(kGpu, 1, kWait));
    }
    // The kubelet says at start whether it watches.
    EXPECT_TRUE(sim.events()
                    .WaitForEvent("kubelet_started", {{"plugin_watcher", watches}}, kWait)
                    .has_value());
    if (!watches) {
      const sim::State st = sim.GetState();
      EXPECT_EQ(testing::FindResource(st, kGpu), nullptr);
      EXPECT_EQ(plugin.Status().registrations(), 0);
    }
  }
}

}  // namespace
}  // namespace dpproxy
