// File: cell.h
//
// One conformance cell's world: a fresh kubelet_sim playing one release in
// its own directory, the plugin's command run against it as a child
// process, and the waits a scenario needs, each ending in success or in a
// Problem that says which scenario's check the plugin failed on the way.
#ifndef DPPROXY_TOOLS_CONFORM_CELL_H_
#define DPPROXY_TOOLS_CONFORM_CELL_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/util/child_process.h"
#include "tools/conform/conform.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::conform {

// A check the plugin failed, and whose check it is.
struct Problem {
  std::string owner;  // the scenario this failure belongs to
  std::string summary;
  std::string plugin_did;
  std::string kubelet_expects;
  std::string users_see;
};

// A cell's result: passed (with notes worth knowing), not applicable (why),
// or failed (what the plugin did, what the kubelet expects, what users see).
CellResult Pass(std::string summary, std::vector<std::string> notes = {});
CellResult NotApplicable(std::string why);
CellResult Fail(std::string summary, std::string did, std::string expects, std::string users);

// Whose check a kubelet's admission error (its message) belongs to:
// "prestart", "preferred", "device-list" (the kubelet refused before any
// Allocate reached the plugin) or "allocate".
std::string AdmissionOwner(const std::string& message);

// The result for `scenario` of running into `p`: its own failure, or
// blocked by the scenario that owns it.
CellResult FromProblem(const std::string& scenario, const Problem& p);

// How far a plugin must have come.
enum class Stage {
  kConnected,  // Register accepted and the kubelet connected to the plugin
  kDevices,    // ... and its list has at least one healthy device
};

class Cell {
 public:
  Cell(const ConformOptions& options, const sim::KubeletVersion& kubelet, std::string dir);
  ~Cell();

  Cell(const Cell&) = delete;
  Cell& operator=(const Cell&) = delete;

  absl::Status StartKubelet();
  absl::Status StartPlugin();
  // SIGTERM, the grace period, then SIGKILL; how the plugin ended.
  std::string StopPlugin();
  bool PluginRunning();
  // Freezes the plugin's process group (SIGSTOP), waiting up to the
  // timeout until every thread of it has stopped; false if not.
  bool FreezePlugin();
  // SIGKILL to the group, as the OOM killer or a crash ends a plugin: no
  // grace, nothing cleaned up. How the plugin ended.
  std::string KillPlugin();
  // A rolling update with surge: a second instance of the plugin command
  // ({instance} = 2, output in plugin-2.log) while the first still runs.
  absl::Status StartSecondInstance();
  // Stops the first instance and makes the second one the plugin.
  std::string ReplaceByTheSecondInstance();

  sim::KubeletSim& kubelet() { return *sim_; }
  EventLog& events() { return sim_->events(); }
  const sim::KubeletVersion& version() const { return version_; }
  const ConformOptions& options() const { return options_; }
  const std::string& resource() const { return options_.resources.front(); }
  const std::string& dir() const { return dir_; }

  // Waits until `resource` reaches `stage` through events at index >=
  // `from`. A rejected registration, a failed dial or a lost plugin end the
  // wait at once unless `tolerate_rejections` (a plugin is then given the
  // whole timeout to recover). nullopt: reached.
  std::optional<Problem> Reach(Stage stage, const std::string& resource, size_t from = 0,
                               bool tolerate_rejections = false);
  // The first Reach waits at most `d` (a release whose registers cell
  // failed: the plugin gets a short while, not the whole timeout); later
  // ones the timeout.
  void LimitFirstWait(absl::Duration d) { first_wait_ = d; }

  // The plugin command's placeholder values, plus `extra`.
  std::vector<std::pair<std::string, std::string>> Values(
      std::vector<std::pair<std::string, std::string>> extra = {}) const;

  // Runs the health command for `device`; an error with its exit status and
  // output if it fails or outlives the timeout.
  absl::Status SetHealth(const std::string& device, const std::string& health);
  // Runs the grow command for `count` devices, the same way.
  absl::Status Grow(int64_t count);

  // The last lines of the plugin's output, for failure messages.
  std::string PluginOutputTail(int lines = 5) const;

  // The plugin's latest device list as the kubelet holds it.
  std::vector<sim::DeviceState> Devices(const std::string& resource);

 private:
  // Which check the plugin failed, from the events a Reach saw.
  Problem Diagnose(const std::string& resource, const std::vector<Json>& seen);

  const ConformOptions& options_;
  const sim::KubeletVersion version_;
  const std::string dir_;
  std::unique_ptr<sim::KubeletSim> sim_;
  std::unique_ptr<ChildProcess> plugin_;
  std::unique_ptr<ChildProcess> second_;  // StartSecondInstance's
  std::string plugin_ended_;  // how the last plugin process ended
  std::optional<absl::Duration> first_wait_;  // LimitFirstWait's, until used
  absl::Duration waited_;  // the limit of the latest Reach, for its messages
  // Start a plugin process, {instance} = `instance`.
  absl::StatusOr<std::unique_ptr<ChildProcess>> StartInstance(int instance);
};

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_CELL_H_
