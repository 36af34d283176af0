// A plugin that holds its stream open but answers nothing: real processes
// (dpproxy, two sample plugins) and the kubelet simulator, the plugin
// stopped with SIGSTOP (its socket still accepts, its stream stays open,
// nothing answers) and resumed with SIGCONT. dpproxy's watchdog must treat
// it as lost (its devices Unhealthy to the kubelet, the event naming how
// long it was silent), leave the other resource and its calls alone, and
// show the devices healthy again on the first answer.
#include <signal.h>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/process_node.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using testing::ProcessNode;

constexpr absl::Duration kWait = ProcessNode::kWait;
constexpr char kGpu[] = "vendor.com/gpu";
constexpr char kNic[] = "vendor.com/nic";

// Whether the simulated kubelet's last list of `resource`, in an event
// "devices", has `healthy` healthy devices of four.
bool ListHas(const Json& e, const std::string& resource, int healthy) {
  if (e.value("event", "") != "devices" || e.value("resource", "") != resource) return false;
  const Json& devices = e["devices"];
  int n = 0;
  for (const Json& d : devices) n += d.value("health", "") == "Healthy";
  return devices.size() == 4 && n == healthy;
}

class SilentPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(node_.sim().Start().ok());
    proxy_ = SpawnProxy();
    ASSERT_NE(proxy_, nullptr);
    for (const char* resource : {kGpu, kNic}) {
      plugins_.push_back(node_.SpawnPlugin(resource, {}));
      ASSERT_NE(plugins_.back(), nullptr);
      ASSERT_TRUE(node_.sim().WaitForResource(resource, 4, kWait)) << resource;
    }
  }
  void TearDown() override {
    // A stopped plugin must run to end.
    for (auto& p : plugins_) {
      if (p != nullptr) p->Signal(SIGCONT);
    }
  }
  std::unique_ptr<ChildProcess> SpawnProxy() {
    return node_.SpawnProxy({"--backend_probe_interval=1s", "--backend_probe_timeout=500ms",
                             "--backend_probe_misses=2"});
  }
  // Waits for the kubelet to see `resource` with `healthy` healthy devices
  // after the event `from`.
  bool KubeletSees(const std::string& resource, int healthy, size_t from) {
    return node_.sim()
        .events()
        .WaitFor([&](const Json& e) { return ListHas(e, resource, healthy); }, kWait, from)
        .has_value();
  }
  bool SilentSaid() {
    return node_.ProxySaid({ProcessNode::Event("backend_silent"), kGpu, "plugin silent for "});
  }
  absl::Status AdmitPod(const std::string& name, const std::string& resource) {
    return node_.sim().Allocate(testing::PodRequest(name, {{"main", 1}}, resource)).status();
  }

  ProcessNode node_;
  std::unique_ptr<ChildProcess> proxy_;
  std::vector<std::unique_ptr<ChildProcess>> plugins_;
};

TEST_F(SilentPluginTest, AStoppedPluginIsLostUntilItAnswersAndTheOtherResourceServesOn) {
  const size_t mark = node_.sim().events().Size();
  plugins_[0]->Signal(SIGSTOP);
  EXPECT_TRUE(KubeletSees(kGpu, 0, mark)) << "the stopped plugin's devices are not Unhealthy";
  EXPECT_TRUE(SilentSaid());
  // The status file (dpproxy status, /readyz) names it.
  EXPECT_TRUE(testing::WaitForFile(
      node_.status(),
      [](const std::string& s) {
        return absl::StrContains(s, "\"backend_silent\":true") &&
               absl::StrContains(s, "holds its stream open but answers no call");
      },
      kWait));

  // The other resource: healthy, and its calls answered.
  EXPECT_TRUE(node_.sim().WaitForResource(kNic, 4, absl::ZeroDuration()));
  EXPECT_TRUE(AdmitPod("nic-pod", kNic).ok());

  const size_t resumed = node_.sim().events().Size();
  plugins_[0]->Signal(SIGCONT);
  EXPECT_TRUE(KubeletSees(kGpu, 4, resumed))
      << "the plugin answers again, and its devices are still not Healthy";
  EXPECT_TRUE(node_.ProxySaid({ProcessNode::Event("backend_answering"), kGpu}));
  EXPECT_TRUE(AdmitPod("gpu-pod", kGpu).ok());
}

// dpproxy restarted while a plugin is stopped: the new dpproxy serves the
// other resource at once (the stopped plugin holds up nothing), and the
// stopped one is back, healthy, once it runs again.
TEST_F(SilentPluginTest, ARestartedDpproxyIsNotHeldUpByAStoppedPlugin) {
  plugins_[0]->Signal(SIGSTOP);
  ASSERT_TRUE(SilentSaid());
  testing::Kill(proxy_.get(), SIGTERM);
  const size_t mark = node_.sim().events().Size();
  proxy_ = SpawnProxy();
  ASSERT_NE(proxy_, nullptr);
  EXPECT_TRUE(KubeletSees(kNic, 4, mark));
  EXPECT_TRUE(AdmitPod("nic-pod", kNic).ok());

  const size_t resumed = node_.sim().events().Size();
  plugins_[0]->Signal(SIGCONT);
  EXPECT_TRUE(KubeletSees(kGpu, 4, resumed)) << "the plugin runs again, and its devices are not Healthy";
  EXPECT_TRUE(AdmitPod("gpu-pod", kGpu).ok());
}

}  // namespace
}  // namespace dpproxy
