// File: process_node.h
//
// A node for tests over real processes: the kubelet simulator in the test
// (its events waited on), dpproxy and sample plugins as processes
// (process.h), and dpproxy's events file waited on line by line.
//
//   testing::ProcessNode node;
//   ASSERT_TRUE(node.sim().Start().ok());
//   auto proxy = node.SpawnProxy({"--backend_probe_interval=1s"});
//   auto plugin = node.SpawnPlugin("vendor.com/gpu", {});
//   EXPECT_TRUE(node.ProxySaid({"\"backend_silent\"", "plugin silent for "}));
#ifndef DPPROXY_TESTS_TESTING_PROCESS_NODE_H_
#define DPPROXY_TESTS_TESTING_PROCESS_NODE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::testing {

class ProcessNode {
 public:
  static constexpr absl::Duration kWait = absl::Seconds(30);

  ProcessNode() : ProcessNode(nullptr) {}
  // `tweak` changes the simulator's options (its root stays Sub("k")).
  explicit ProcessNode(const std::function<void(sim::KubeletSimOptions&)>& tweak)
      : sim_([&] {
          sim::KubeletSimOptions o;
          o.root_dir = tmp_.Sub("k");
          o.personality = sim::Personality::kV1Beta1Sync;
          o.container_runtime = false;
          if (tweak) tweak(o);
          return o;
        }()) {
    (void)MakeDirs(plugin_dir());
  }

  sim::KubeletSim& sim() { return sim_; }
  std::string Sub(const std::string& name) const { return tmp_.Sub(name); }
  const std::string& tmp() const { return tmp_.path(); }
  std::string plugin_dir() const { return tmp_.Sub("p"); }
  std::string state_dir() const { return tmp_.Sub("s"); }
  std::string events() const { return tmp_.Sub("proxy.jsonl"); }
  std::string status() const { return tmp_.Sub("status.json"); }

  // dpproxy serving the simulator's kubelet, with `flags` after its own.
  std::unique_ptr<ChildProcess> SpawnProxy(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {Runfile("proxy/dpproxy"),
                                     "--kubelet_root=" + tmp_.Sub("k"),
                                     "--plugin_dir=" + plugin_dir(),
                                     "--state_dir=" + state_dir(),
                                     "--status_file=" + status(),
                                     "--metrics_address=",
                                     "--minloglevel=2",
                                     "--events=" + events()};
    args.insert(args.end(), flags.begin(), flags.end());
    return Spawn(args);
  }

  // The sample plugin of `resource` (four devices) registering with
  // dpproxy, with `flags` after its own.
  std::unique_ptr<ChildProcess> SpawnPlugin(const std::string& resource,
                                            const std::vector<std::string>& flags) {
    std::vector<std::string> args = {Runfile("tools/sample_plugin/sample_plugin"),
                                     "--resource=" + resource, "--devices=4",
                                     "--kubelet_socket=" + plugin_dir() + "/kubelet.sock",
                                     "--quiet"};
    args.insert(args.end(), flags.begin(), flags.end());
    return Spawn(args);
  }

  // The lines of dpproxy's events file that contain every one of `parts`,
  // once there are `n` of them (or those there are at the deadline).
  std::vector<std::string> ProxyLines(const std::vector<std::string>& parts, size_t n) {
    std::vector<std::string> lines;
    WaitForFile(
        events(),
        [&](const std::string& file) {
          lines.clear();
          for (absl::string_view line : absl::StrSplit(file, '\n')) {
            bool all = !line.empty();
            for (const std::string& p : parts) all = all && absl::StrContains(line, p);
            if (all) lines.emplace_back(line);
          }
          return lines.size() >= n;
        },
        kWait);
    return lines;
  }
  // Whether dpproxy's events file has a line with every one of `parts`.
  bool ProxySaid(const std::vector<std::string>& parts) { return !ProxyLines(parts, 1).empty(); }
  // `"event":"NAME"`, for ProxyLines and ProxySaid.
  static std::string Event(const std::string& name) {
    return absl::StrCat("\"event\":\"", name, "\"");
  }

 private:
  ShortTempDir tmp_;
  sim::KubeletSim sim_;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_PROCESS_NODE_H_
