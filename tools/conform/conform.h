// File: conform.h
//
// dpconform: runs a device plugin's own command against kubelet_sim playing
// each selected kubelet release, one fresh kubelet and one fresh plugin
// process per cell (release x scenario), and says for every cell what the
// plugin did, what that release expects, and what users would see on a
// real node. docs/conformance.md describes each scenario and the kubelet
// facts behind it.
//
// A cell ends in one of four outcomes:
//   pass     the plugin did what this release needs
//   fail     it did not: the cell explains
//   blocked  the cell could not get to its check because the plugin failed
//            another scenario's check on the way (named in blocked_by); the
//            plugin is already failing that scenario's cell
//   n/a      the scenario does not apply: this release never makes the call,
//            or the plugin does not offer the feature
#ifndef DPPROXY_TOOLS_CONFORM_CONFORM_H_
#define DPPROXY_TOOLS_CONFORM_CONFORM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/util/child_process.h"
#include "absl/time/time.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::conform {

enum class Outcome { kPass, kFail, kBlocked, kNotApplicable };

// The most a plugin process (and its health command) may write to any
// file, its output in plugin.log included: a plugin that floods its output
// is killed with SIGXFSZ there, and the cell says so.
inline constexpr uint64_t kMaxPluginOutputBytes = 64ull << 20;
inline constexpr char kPrlimit[] = "/usr/bin/prlimit";

// What the kubelet's gRPC client receives in one message: gRPC's default,
// which every release keeps. A larger device list ends its stream.
inline constexpr int64_t kKubeletReceiveLimit = 4 * 1024 * 1024;

// How long a release's other cells wait for a registration once its
// registers cell failed.
inline constexpr absl::Duration kAfterFailedRegisters = absl::Seconds(2);
// "pass", "fail", "blocked", "n/a".
const char* OutcomeName(Outcome o);

struct CellResult {
  std::string kubelet;     // "1.25", as asked for
  std::string generation;  // "1.25-1.27"
  std::string scenario;
  Outcome outcome = Outcome::kPass;
  // One line: what was found.
  std::string summary;
  // For a failure: what the plugin did, what this kubelet release expects,
  // and what users would see on a node with this release.
  std::string plugin_did;
  std::string kubelet_expects;
  std::string users_see;
  std::string blocked_by;  // the scenario whose failure blocked this cell
  // Observations worth knowing whatever the outcome ("re-registered in
  // 212 ms", "list is 3% of the 4 MiB limit").
  std::vector<std::string> notes;
  absl::Duration duration;
  // The cell's directory (plugin output in plugin.log) when it was kept.
  std::string dir;
  // Set by --expect (expect.h): a failed or blocked cell the plugin's
  // authors declared a known limitation ("FILE:LINE: reason"), or a cell
  // that passes where they declared a failure.
  std::string known;
  std::string fixed;
};

// A real node for cells on a real kubelet (real.h). The node is the
// user's: dpconform makes only its own labelled pods there and deletes
// them, and never writes in the kubelet's directories.
struct RealNodeOptions {
  // A kubeconfig that may read the node and make pods in `namespace_`.
  std::string kubeconfig;
  // The node whose kubelet runs here; "": the cluster's only node.
  std::string node;
  // The kubelet's --root-dir.
  std::string kubelet_root = "/var/lib/kubelet";
  // An image already on the node with /bin/sh and sleep (busybox): the
  // pods' containers (never pulled).
  std::string pod_image;
  std::string namespace_ = "default";
  // Restarts the node's kubelet and ends (/bin/sh -c); "": the
  // kubelet-restart scenario is not run on the real node.
  std::string restart_kubelet;
};

struct ConformOptions {
  // The plugin's command line, run by /bin/sh -c, with placeholders (see
  // kPlaceholders) replaced for each cell.
  std::string plugin_command;
  // The extended resources the plugin serves; the first is the one the
  // single-resource scenarios use.
  std::vector<std::string> resources;
  std::vector<sim::KubeletVersion> kubelets;
  // Real kubelets (--kubelets=real:1.37): the release each must report, ""
  // for whichever the node runs. Their cells run one at a time, after the
  // simulated ones, on the node `real` names.
  std::vector<std::string> real_kubelets;
  RealNodeOptions real;
  // Scenario names, in the order to run; empty: all.
  std::vector<std::string> scenarios;
  // Sets one device's health: run by /bin/sh -c with {device} and {health}
  // (Healthy or Unhealthy) besides the usual placeholders. Empty: the
  // health scenario is not applicable.
  std::string health_command;
  // Makes the plugin list {count} devices from now on: run by /bin/sh -c
  // with {count} besides the usual placeholders. Empty: list-growth is not
  // applicable.
  std::string grow_command;
  // The longest any one wait in a scenario may take (a registration, a
  // device list, a re-registration).
  absl::Duration timeout = absl::Seconds(30);
  // How long the kubelet tries to dial a plugin: 10 s in every release.
  // Lower, a run whose plugin registers before serving ends sooner.
  absl::Duration dial_timeout = absl::Seconds(10);
  // How long a plugin gets to follow a list without healthy devices with
  // one that has them, or a Register of an API this kubelet does not serve
  // with one it does (as dpproxy's version probing does).
  absl::Duration settle = absl::Seconds(3);
  // How long a stopped plugin gets between SIGTERM and SIGKILL.
  absl::Duration stop_grace = absl::Seconds(10);
  // Cells run at once.
  int jobs = 1;
  // Where cell directories go (a new directory is made inside). Paths must
  // stay short: Unix socket paths are limited to 107 bytes.
  std::string work_root = "/tmp";
  // Keep the directories of cells that passed or were n/a (failed and
  // blocked cells' are kept).
  bool keep = false;
  // Extra environment for the plugin, besides the DPCONFORM_* variables.
  std::vector<std::pair<std::string, std::string>> env;
  // Called as each cell ends (from the worker that ran it, one at a time),
  // with how many have ended and how many there are.
  std::function<void(const CellResult&, size_t done, size_t total)> on_cell;
  // Non-empty: the command is a DRA driver of this name, run through the
  // DRA scenarios (dra.h) instead of the device-plugin ones.
  std::string dra_driver;
};

// {name, what it stands for}: the plugin command's placeholders. Each is
// also in the plugin's environment as DPCONFORM_<NAME in capitals>.
struct Placeholder {
  const char* name;
  const char* meaning;
};
const std::vector<Placeholder>& Placeholders();

// Replaces the placeholders; kInvalidArgument naming an unknown one.
absl::StatusOr<std::string> Expand(const std::string& command,
                                   const std::vector<std::pair<std::string, std::string>>& values);

struct ScenarioInfo {
  const char* name;
  const char* title;
  // What the scenario checks and the kubelet facts behind it (--list, docs).
  const char* checks;
  // Run only when named in --scenarios: a check most plugins cannot pass
  // alone (the kubelet's own loss), which dpproxy in front of them does, or
  // a stress beyond what kubelets are known to do.
  bool opt_in = false;
};
const std::vector<ScenarioInfo>& Scenarios();

// The default releases: the newest minor of each generation.
std::vector<std::string> DefaultKubelets();

// Checks the options (an unknown scenario or placeholder, no resources, a
// work root too long for socket paths): kInvalidArgument naming the flag.
absl::Status ValidateOptions(const ConformOptions& options);

// Runs every selected cell; results in release order, then scenario order.
// A cell stays blocked only if the scenario that blocked it failed in the
// same release (SettleBlocked).
absl::StatusOr<std::vector<CellResult>> RunConformance(const ConformOptions& options);

// A blocked cell whose blocking scenario did not fail in its release (it
// passed, was n/a, or was not run) becomes a failure of its own, saying so.
void SettleBlocked(std::vector<CellResult>* results);

// Starts `command` (placeholders replaced by `values`) with /bin/sh -c in
// its own process group, output appended to `output_path`, with
// options.env and each value as DPCONFORM_<NAME> in its environment.
absl::StatusOr<std::unique_ptr<ChildProcess>> StartCommand(
    const ConformOptions& options, const std::string& command,
    const std::vector<std::pair<std::string, std::string>>& values,
    const std::string& output_path);

// Runs `command` as StartCommand does and waits up to `timeout` for it to
// end. kDeadlineExceeded (the command stopped) or kFailedPrecondition with
// its exit and output, each naming --`flag`.
absl::Status RunCommandToEnd(const ConformOptions& options, const std::string& flag,
                             const std::string& command,
                             const std::vector<std::pair<std::string, std::string>>& values,
                             const std::string& output_path, absl::Duration timeout);

// Runs `n` cells on options.jobs workers, each in a fresh directory of a
// run directory under options.work_root (removed unless kept: --keep, or
// the cell failed or was blocked), each result handed to options.on_cell.
// A cell whose directory cannot be made is not run: its result is
// `unmade`'s, given why (a failure naming the cell, its release and
// scenario).
using UnmadeCell = std::function<CellResult(size_t i, const std::string& why)>;
absl::StatusOr<std::vector<CellResult>> RunCells(
    const ConformOptions& options, size_t n,
    const std::function<CellResult(size_t i, const std::string& dir)>& run,
    const UnmadeCell& unmade);

// The failed result of a cell dpconform could not make a directory for;
// with `k` and `scenario`, named as a simulated release's cell.
CellResult UnmadeResult(const std::string& why);
CellResult UnmadeResult(const std::string& why, const sim::KubeletVersion& k,
                        const std::string& scenario);

// RunCells over a grid whose cells each have a release and a scenario
// (`cells[i]`: release key, scenario name). Each release's `gate` cell
// (its registration scenario) runs first; where it failed, `run` is given
// kAfterFailedRegisters as the longest first wait of the release's other
// cells (they are blocked by it either way, or n/a where the release alone
// decides), instead of the whole timeout. Results in `cells`' order.
absl::StatusOr<std::vector<CellResult>> RunGatedCells(
    const ConformOptions& options, const std::vector<std::pair<const void*, std::string>>& cells,
    const std::string& gate,
    const std::function<CellResult(size_t i, const std::string& dir,
                                   std::optional<absl::Duration> first_wait)>& run,
    const UnmadeCell& unmade);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_CONFORM_H_
