// A plugin that holds its stream open but answers nothing: real processes
// (dpproxy, two sample plugins) and the kubelet simulator, the plugin
// stopped with SIGSTOP (its socket still accepts, its stream stays open,
// nothing answers) and resumed with SIGCONT. dpproxy's watchdog must treat
// it as lost (its devices Unhealthy to the kubelet, the event naming how
// long it was silent), leave the other resource and its calls alone, and
// show the devices healthy again on the first answer.
#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy {
namespace {

using testing::Runfile;
using testing::Spawn;

constexpr absl::Duration kWait = absl::Seconds(30);
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
    ASSERT_TRUE(MakeDirs(plugins_).ok());
    ASSERT_TRUE(sim_.Start().ok());
    proxy_ = SpawnProxy();
    ASSERT_NE(proxy_, nullptr);
    for (const char* resource : {kGpu, kNic}) {
      plugins_running_.push_back(Spawn({Runfile("tools/sample_plugin/sample_plugin"),
                                        absl::StrCat("--resource=", resource), "--devices=4",
                                        "--kubelet_socket=" + plugins_ + "/kubelet.sock",
                                        "--quiet"}));
      ASSERT_NE(plugins_running_.back(), nullptr);
      ASSERT_TRUE(sim_.WaitForResource(resource, 4, kWait)) << resource;
    }
  }
  std::unique_ptr<ChildProcess> SpawnProxy() {
    return Spawn({Runfile("proxy/dpproxy"), "--kubelet_root=" + tmp_.Sub("k"),
                  "--plugin_dir=" + plugins_, "--state_dir=" + tmp_.Sub("s"), "--status_file=" + status_,
                  "--metrics_address=", "--minloglevel=2", "--events=" + events_,
                  "--backend_probe_interval=1s", "--backend_probe_timeout=500ms",
                  "--backend_probe_misses=2"});
  }
  void TearDown() override {
    // A stopped plugin must run to end.
    for (auto& p : plugins_running_) {
      if (p != nullptr) p->Signal(SIGCONT);
    }
  }

  // Whether dpproxy's events file names `event` for the GPU resource with
  // `text` in its `field`.
  bool ProxySaid(const std::string& event, const std::string& field, const std::string& text) {
    return testing::WaitForFile(
        events_,
        [&](const std::string& file) {
          for (absl::string_view line : absl::StrSplit(file, '\n')) {
            if (absl::StrContains(line, absl::StrCat("\"event\":\"", event, "\"")) &&
                absl::StrContains(line, kGpu) &&
                absl::StrContains(line, absl::StrCat("\"", field, "\":\"", text))) {
              return true;
            }
          }
          return false;
        },
        kWait);
  }

  testing::ShortTempDir tmp_;
  const std::string plugins_ = tmp_.Sub("p");
  const std::string events_ = tmp_.Sub("proxy.jsonl");
  const std::string status_ = tmp_.Sub("status.json");
  sim::KubeletSim sim_{[this] {
    sim::KubeletSimOptions o;
    o.root_dir = tmp_.Sub("k");
    o.personality = sim::Personality::kV1Beta1Sync;
    o.container_runtime = false;
    return o;
  }()};
  std::unique_ptr<ChildProcess> proxy_;
  std::vector<std::unique_ptr<ChildProcess>> plugins_running_;
};

TEST_F(SilentPluginTest, AStoppedPluginIsLostUntilItAnswersAndTheOtherResourceServesOn) {
  const size_t mark = sim_.events().Size();
  plugins_running_[0]->Signal(SIGSTOP);
  EXPECT_TRUE(sim_.events()
                  .WaitFor([](const Json& e) { return ListHas(e, kGpu, 0); }, kWait, mark)
                  .has_value())
      << "the stopped plugin's devices were not reported Unhealthy";
  EXPECT_TRUE(ProxySaid("backend_silent", "reason", "plugin silent for "));
  // The status file (dpproxy status, /readyz) names it.
  EXPECT_TRUE(testing::WaitForFile(
      status_,
      [](const std::string& s) {
        return absl::StrContains(s, "\"backend_silent\":true") &&
               absl::StrContains(s, "holds its stream open but answers no call");
      },
      kWait));

  // The other resource: healthy, and its calls answered.
  EXPECT_TRUE(sim_.WaitForResource(kNic, 4, absl::ZeroDuration()));
  absl::StatusOr<sim::AllocateResponse> pod =
      sim_.Allocate(testing::PodRequest("nic-pod", {{"main", 1}}, kNic));
  EXPECT_TRUE(pod.ok()) << pod.status();

  const size_t resumed = sim_.events().Size();
  plugins_running_[0]->Signal(SIGCONT);
  EXPECT_TRUE(sim_.events()
                  .WaitFor([](const Json& e) { return ListHas(e, kGpu, 4); }, kWait, resumed)
                  .has_value())
      << "the plugin answers again, and its devices are still not Healthy";
  EXPECT_TRUE(ProxySaid("backend_answering", "endpoint", ""));
  absl::StatusOr<sim::AllocateResponse> gpu_pod =
      sim_.Allocate(testing::PodRequest("gpu-pod", {{"main", 1}}, kGpu));
  EXPECT_TRUE(gpu_pod.ok()) << gpu_pod.status();
}

// dpproxy restarted while a plugin is stopped: the new dpproxy serves the
// other resource at once (the stopped plugin holds up nothing), and the
// stopped one is back, healthy, once it runs again.
TEST_F(SilentPluginTest, ARestartedDpproxyIsNotHeldUpByAStoppedPlugin) {
  plugins_running_[0]->Signal(SIGSTOP);
  ASSERT_TRUE(ProxySaid("backend_silent", "reason", "plugin silent for "));
  testing::Kill(proxy_.get(), SIGTERM);
  const size_t mark = sim_.events().Size();
  proxy_ = SpawnProxy();
  ASSERT_NE(proxy_, nullptr);
  EXPECT_TRUE(sim_.events()
                  .WaitFor([](const Json& e) { return ListHas(e, kNic, 4); }, kWait, mark)
                  .has_value());
  absl::StatusOr<sim::AllocateResponse> pod =
      sim_.Allocate(testing::PodRequest("nic-pod", {{"main", 1}}, kNic));
  EXPECT_TRUE(pod.ok()) << pod.status();

  const size_t resumed = sim_.events().Size();
  plugins_running_[0]->Signal(SIGCONT);
  EXPECT_TRUE(sim_.events()
                  .WaitFor([](const Json& e) { return ListHas(e, kGpu, 4); }, kWait, resumed)
                  .has_value())
      << "the plugin runs again, and its devices are not Healthy";
  absl::StatusOr<sim::AllocateResponse> gpu_pod =
      sim_.Allocate(testing::PodRequest("gpu-pod", {{"main", 1}}, kGpu));
  EXPECT_TRUE(gpu_pod.ok()) << gpu_pod.status();
}

}  // namespace
}  // namespace dpproxy
