// dpconform: a conformance kit for device plugins. See conform.h for what a
// cell is and docs/conformance.md for the scenarios and a CI setup.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "proxy/cli/cli.h"
#include "proxy/util/files.h"
#include "tools/conform/conform.h"
#include "tools/conform/dra.h"
#include "tools/conform/expect.h"
#include "tools/conform/real.h"
#include "tools/conform/report.h"
#include "tools/conform/upstream.h"
#include "tools/kubelet_sim/kubelet_sim.h"

DEFINE_string(plugin, "",
              "The plugin's command line, run by /bin/sh -c once per cell (and again when a\n"
              "scenario restarts it), with placeholders: {kubelet_socket}, {plugin_dir},\n"
              "{kubelet_root}, {plugins_registry}, {work_dir}, {resource},\n"
              "{kubelet_version}. The same values are in its environment as\n"
              "DPCONFORM_KUBELET_SOCKET and so on. Required.");
DEFINE_string(dra_driver, "",
              "Test a DRA driver of this name instead of a device plugin: --plugin is the\n"
              "driver's command, run against a 1.32+ kubelet with an API-server simulator\n"
              "beside it, or a real node's (real:1.37); the DRA scenarios and\n"
              "placeholders run (see --list). With\n"
              "--resource, --plugin also starts a device plugin for the same hardware\n"
              "(at {kubelet_socket}), for the scenarios of the two side by side.");
DEFINE_string(resource, "",
              "The extended resource(s) the plugin serves, comma-separated, e.g.\n"
              "vendor.com/gpu. The first is the one single-resource scenarios use;\n"
              "two or more also run multi-resource. Required.");
DEFINE_string(kubelets, "",
              "Kubelet releases to play, comma-separated: 1.9 to 1.37, the aliases\n"
              "v1alpha, v1beta1-async, v1beta1-sync, plugin-watcher, or \"all\" (every\n"
              "minor). Empty: the newest minor of each generation (see --list).\n"
              "real:1.37 (or real, for whichever release it runs) adds the real kubelet\n"
              "of this machine's node: the scenarios it can judge, one cell at a time,\n"
              "with --kubeconfig and --pod_image (see \"On a real kubelet\" above).");
DEFINE_string(kubeconfig, "",
              "Real kubelets: a kubeconfig for the node's API server that may read nodes\n"
              "and make and delete pods in --namespace. With --dra_driver also: make and\n"
              "delete DeviceClasses and ResourceClaims, list ResourceSlices and read the\n"
              "kubelet's metrics (nodes/proxy, or nodes/metrics at the kubelet's port on\n"
              "127.0.0.1 where the API server cannot reach it); it is the driver's\n"
              "{kubeconfig} too. Empty: $KUBECONFIG.");
DEFINE_string(node, "", "Real kubelets: the node whose kubelet runs here. Empty: the only node.");
DEFINE_string(kubelet_root, "/var/lib/kubelet", "Real kubelets: the kubelet's --root-dir.");
DEFINE_string(pod_image, "",
              "Real kubelets: an image already on the node with /bin/sh and sleep\n"
              "(busybox), for the pods the scenarios make (never pulled).");
DEFINE_string(namespace, "default",
              "Real kubelets: where the scenarios' pods go (labelled\n"
              "app.kubernetes.io/managed-by=dpconform; deleted at the end of each cell).");
DEFINE_string(restart_kubelet, "",
              "Real kubelets: a command (/bin/sh -c) that restarts the node's kubelet and\n"
              "ends when it is back, e.g. 'systemctl restart kubelet'. Empty:\n"
              "kubelet-restart (dra-kubelet-restart) is not run on the real kubelet.");
DEFINE_string(cdi_gate, "",
              "The DevicePluginCDIDevices gate of 1.28-1.30 kubelets: on or off. Empty:\n"
              "each release's default (off in 1.28, on in 1.29-1.30).");
DEFINE_bool(per_socket_clients, false,
            "Play kubelets that track plugin clients per socket (kubernetes#135437, in a\n"
            "release our facts do not name yet): from 1.25, a replaced instance's end\n"
            "disconnects only a client at its own socket (see rolling-update).");
DEFINE_string(scenarios, "",
              "Scenarios to run, comma-separated. Empty: all but the opt-in ones (see --list).");
DEFINE_string(health_command, "",
              "Sets a device's health, for the health scenario: run by /bin/sh -c with\n"
              "{device} and {health} (Healthy or Unhealthy) besides the --plugin\n"
              "placeholders. Empty: the health scenario is n/a.");
DEFINE_string(grow_command, "",
              "Makes the plugin list {count} devices from now on, for the list-growth\n"
              "scenario: run by /bin/sh -c with {count} besides the --plugin placeholders.\n"
              "Empty: list-growth is n/a.");
DEFINE_string(timeout, "30s",
              "The longest any one wait in a scenario may take (a registration, a device\n"
              "list, a re-registration). At least a second over --dial_timeout.");
DEFINE_string(dial_timeout, "10s",
              "How long the kubelet tries to dial a plugin (10 s in every release). Lower\n"
              "it to make runs with plugins that register before serving end sooner.");
DEFINE_string(stop_grace, "10s", "Time between SIGTERM and SIGKILL when the plugin is stopped.");
DEFINE_int32(jobs, 4,
             "Cells run at once, each with its own kubelet and plugin process (a cell mostly "
             "waits for the plugin: more than the CPUs).");
DEFINE_string(env, "",
              "Extra environment for the plugin: NAME=VALUE, comma-separated.");
DEFINE_string(output, "table", "What to print on stdout: table or json.");
DEFINE_string(junit, "", "Also write JUnit XML (one suite per kubelet release) to this file.");
DEFINE_string(markdown, "",
              "Also write a Markdown summary (a row per kubelet release, then the failures)\n"
              "to this file (replaced; append it to a CI job's summary, such as\n"
              "$GITHUB_STEP_SUMMARY).");
DEFINE_string(html, "",
              "Also write one HTML file (no scripts, nothing to fetch): the grid in colour,\n"
              "each cell's text on it, and the failed and blocked cells listed with the\n"
              "directory each was kept in.");
DEFINE_string(work_dir, "/tmp",
              "Where the run's directory goes (kept for failed cells, with the plugin's\n"
              "output in plugin.log and the kubelet's events). At most 40 bytes: sockets\n"
              "live inside.");
DEFINE_string(expect, "",
              "A file of known limitations, one per line: SCENARIO RELEASES OUTCOME REASON "
              "(e.g. \"serves-first 1.25-1.37 FAIL registers before it serves\"). Cells it "
              "covers are reported as known and do not fail the run; a declared failure that "
              "passes is reported. See docs/conformance.md.");
DEFINE_bool(keep, false, "Keep every cell's directory, not only failed and blocked ones'.");
DEFINE_bool(list, false, "Print the kubelet generations and the scenarios, then exit.");
DEFINE_bool(quiet, false, "No progress lines on stderr.");

namespace dpproxy::conform {
namespace {

constexpr char kUsage[] = R"(dpconform: test a device plugin against every kubelet generation.

Usage:
  dpconform --plugin='CMD' --resource=vendor.com/gpu [--kubelets=1.9,1.24,1.31] [flags]
  dpconform --plugin='CMD' --dra_driver=gpu.vendor.com [--kubelets=1.32,1.34,1.37] [flags]
  dpconform --list

Each cell runs a fresh simulated kubelet of one release in its own directory
and starts the plugin's command against it; the scenario then does what a
kubelet or a node does (admits pods, restarts, crashes, restarts the plugin)
and checks the plugin's part. Every failure says what the plugin did, what
that kubelet release expects and what users would see on a node.

On a real kubelet (--kubelets=real:1.37): the plugin runs against this
machine's kubelet, one cell at a time, for the scenarios a real kubelet can
judge: registers, device-list, health, allocate, allocate-two,
kubelet-restart (with --restart_kubelet), plugin-restart, allocate-restart,
list-growth, plugin-watcher and multi-resource. Each check reads the
kubelet's pod-resources socket and metrics, the node's allocatable and pods
bound to the node; the report names the kubelet's version in that column. Nothing else on the node may serve
--resource. A DRA driver (--dra_driver) runs there too, for dra-registers,
dra-publishes, dra-prepare, dra-several-requests, dra-kubelet-restart and
dra-driver-restart: the kubelet's registrations (its metrics), the node's
ResourceSlices, and pods with claims dpconform makes, placed by the
cluster's scheduler.

Outcomes: pass; FAIL; blocked (the plugin failed another scenario's check on
the way; that cell fails); n/a (the release never makes the call, or the
plugin does not offer the feature).

Exit status: 0 when no cell failed or was blocked, 1 when one did, 2 for bad
flags.

Example:
  dpconform --resource=example.com/gpu \
    --plugin='sample_plugin --resource=example.com/gpu --kubelet_socket={kubelet_socket} \
              --control_socket={work_dir}/control.sock' \
    --health_command='sample_plugin set-health --control_socket={work_dir}/control.sock \
              --device={device} --health={health}' \
    --kubelets=1.17,1.24,1.25,1.31 --junit=conformance.xml

Flags:
)";

// Each plugin runs in a process group of its own, which a Ctrl-C (SIGINT
// to dpconform's group) or a cancelled CI job's SIGTERM does not reach.
// On SIGINT, SIGTERM or SIGHUP every group dpconform started is killed
// (each is led by a child dpconform has not reaped yet, so none is another
// process's), then dpconform exits with 128 + the signal.
void StopPluginsOnSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  // Before any thread starts, so that every thread inherits the mask.
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return;
    int groups = 0;
    const std::string self = std::to_string(::getpid());
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      int pid = 0;
      if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
      absl::StatusOr<std::string> stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
      if (!stat.ok()) continue;  // gone meanwhile
      // pid (comm) state ppid ...: the fields after the last ')'.
      const size_t close = stat->rfind(')');
      if (close == std::string::npos) continue;
      std::vector<std::string> fields =
          absl::StrSplit(stat->substr(close + 1), ' ', absl::SkipEmpty());
      if (fields.size() < 2 || fields[1] != self) continue;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      ++groups;
    }
    std::cerr << "dpconform: " << strsignal(sig) << ": stopped " << groups
              << " plugin process group(s); no report\n";
    std::_Exit(128 + sig);
  }).detach();
}

int Usage(const std::string& msg) {
  std::cerr << "dpconform: " << msg << "\n";
  return 2;
}

std::vector<std::string> List(const std::string& flag) {
  return absl::StrSplit(flag, ',', absl::SkipWhitespace());
}

// The upstream tests a scenario stands for (upstream.h).
void PrintUpstream(const char* scenario, const std::string& indent) {
  if (const UpstreamMapping* m = UpstreamOf(scenario); m != nullptr) {
    std::cout << indent << "upstream: " << UpstreamText(*m) << " (" << m->relation << ")\n";
  }
}

void PrintList() {
  std::cout << "Kubelet generations (--kubelets takes any minor from 1."
            << sim::kOldestKubeletMinor << " to 1." << sim::kNewestKubeletMinor
            << "; default: " << absl::StrJoin(DefaultKubelets(), ",") << "):\n";
  for (const sim::KubeletGeneration& g : sim::KubeletGenerations()) {
    std::cout << absl::StrFormat("  %-10s %s\n", sim::GenerationName(g), g.differences);
  }
  std::cout << "\nScenarios (--scenarios):\n";
  for (const ScenarioInfo& s : Scenarios()) {
    std::cout << absl::StrFormat("  %-16s %s\n", s.name, s.title);
    std::cout << "                   " << s.checks << "\n";
    PrintUpstream(s.name, "                   ");
  }
  std::cout << "\nOn a real kubelet (--kubelets=real:1.MINOR), the scenarios it can judge: "
            << absl::StrJoin(RealScenarios(), ", ")
            << "\n(kubelet-restart with --restart_kubelet).\n";
  std::cout << "\nPlaceholders in --plugin (and DPCONFORM_<NAME> in its environment):\n";
  for (const Placeholder& p : Placeholders()) {
    std::cout << absl::StrFormat("  {%s}  %s\n", p.name, p.meaning);
  }
  std::cout << "\nWith --dra_driver (kubelets 1.32 and later; default: "
            << absl::StrJoin(DefaultDraKubelets(), ",") << "), the DRA scenarios:\n";
  for (const ScenarioInfo& s : DraScenarios()) {
    std::cout << absl::StrFormat("  %-20s %s\n", s.name, s.title);
    std::cout << "                       " << s.checks << "\n";
    PrintUpstream(s.name, "                       ");
  }
  std::cout << "and the placeholders in the driver's --plugin command:\n";
  for (const Placeholder& p : DraPlaceholders()) {
    std::cout << absl::StrFormat("  {%s}  %s\n", p.name, p.meaning);
  }
}

absl::StatusOr<ConformOptions> OptionsFromFlags() {
  ConformOptions o;
  o.plugin_command = FLAGS_plugin;
  o.dra_driver = FLAGS_dra_driver;
  o.resources = List(FLAGS_resource);
  o.scenarios = List(FLAGS_scenarios);
  o.health_command = FLAGS_health_command;
  o.grow_command = FLAGS_grow_command;
  o.jobs = FLAGS_jobs;
  o.work_root = FLAGS_work_dir;
  o.keep = FLAGS_keep;
  o.real.kubeconfig = FLAGS_kubeconfig;
  if (o.real.kubeconfig.empty() && ::getenv("KUBECONFIG") != nullptr) {
    o.real.kubeconfig = ::getenv("KUBECONFIG");
  }
  o.real.node = FLAGS_node;
  o.real.kubelet_root = FLAGS_kubelet_root;
  o.real.pod_image = FLAGS_pod_image;
  o.real.namespace_ = FLAGS_namespace;
  o.real.restart_kubelet = FLAGS_restart_kubelet;
  absl::StatusOr<absl::Duration> d = ParseFlagDuration("timeout", FLAGS_timeout);
  if (!d.ok()) return d.status();
  o.timeout = *d;
  d = ParseFlagDuration("dial_timeout", FLAGS_dial_timeout);
  if (!d.ok()) return d.status();
  o.dial_timeout = *d;
  d = ParseFlagDuration("stop_grace", FLAGS_stop_grace);
  if (!d.ok()) return d.status();
  o.stop_grace = *d;
  std::optional<bool> gate;
  if (FLAGS_cdi_gate == "on") {
    gate = true;
  } else if (FLAGS_cdi_gate == "off") {
    gate = false;
  } else if (!FLAGS_cdi_gate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--cdi_gate=", FLAGS_cdi_gate,
                                                   " is neither on nor off"));
  }
  std::vector<std::string> names = List(FLAGS_kubelets);
  if (names.empty()) names = o.dra_driver.empty() ? DefaultKubelets() : DefaultDraKubelets();
  if (names.size() == 1 && names[0] == "all") {
    names.clear();
    for (int m = sim::kOldestKubeletMinor; m <= sim::kNewestKubeletMinor; ++m) {
      names.push_back(absl::StrCat("1.", m));
    }
  }
  for (const std::string& n : names) {
    absl::StatusOr<std::optional<std::string>> real = ParseRealKubelet(n);
    if (!real.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubelets: ", real.status().message()));
    }
    if (real->has_value()) {
      o.real_kubelets.push_back(**real);
      continue;
    }
    absl::StatusOr<sim::KubeletVersion> k = sim::ParseKubeletVersion(n, gate);
    if (!k.ok()) return absl::InvalidArgumentError(absl::StrCat("--kubelets: ", k.status().message()));
    k->per_socket_clients = FLAGS_per_socket_clients;
    o.kubelets.push_back(*k);
  }
  for (const std::string& kv : List(FLAGS_env)) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--env: \"", kv, "\" is not NAME=VALUE"));
    }
    o.env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  if (FLAGS_output != "table" && FLAGS_output != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--output=", FLAGS_output,
                                                   " is neither table nor json"));
  }
  if (absl::Status s = ValidateOptions(o); !s.ok()) return s;
  return o;
}

int Run() {
  if (FLAGS_list) {
    PrintList();
    return 0;
  }
  absl::StatusOr<ConformOptions> o = OptionsFromFlags();
  if (!o.ok()) return Usage(std::string(o.status().message()));
  std::vector<Expectation> expectations;
  if (!FLAGS_expect.empty()) {
    absl::StatusOr<std::string> text = ReadFileUpTo(FLAGS_expect, 1 << 20);
    if (!text.ok()) return Usage(absl::StrCat("--expect: ", text.status().message()));
    std::vector<std::string> names;
    for (const auto* list : {&Scenarios(), &DraScenarios()}) {
      for (const ScenarioInfo& s : *list) names.push_back(s.name);
    }
    absl::StatusOr<std::vector<Expectation>> parsed =
        ParseExpectations(*text, FLAGS_expect, names);
    if (!parsed.ok()) return Usage(absl::StrCat("--expect: ", parsed.status().message()));
    expectations = *std::move(parsed);
  }
  // On a terminal: one line per cell with [n/N] and the time left,
  // estimated from the cells done so far. Elsewhere (CI logs): the same
  // lines without the estimate.
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  const absl::Time started = absl::Now();
  if (!FLAGS_quiet) {
    o->on_cell = [terminal, started](const CellResult& c, size_t done, size_t total) {
      std::string left;
      if (terminal && done < total) {
        const absl::Duration per_cell = (absl::Now() - started) / static_cast<int64_t>(done);
        const absl::Duration d = per_cell * static_cast<int64_t>(total - done);
        left = absl::StrCat("  (about ",
                            d < absl::Seconds(1)
                                ? std::string("1s")
                                : absl::FormatDuration(absl::Trunc(d, absl::Seconds(1))),
                            " left)");
      }
      std::cerr << absl::StrFormat("dpconform: [%d/%d] %-7s %-16s kubelet %-6s %5.1fs  %s%s\n",
                                   done, total, OutcomeName(c.outcome), c.scenario, c.kubelet,
                                   absl::ToDoubleSeconds(c.duration), Printable(c.summary),
                                   left);
    };
  }
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(*o);
  if (!cells.ok()) {
    std::cerr << "dpconform: " << cells.status().message() << "\n";
    return 2;
  }
  ApplyExpectations(expectations, FLAGS_expect, &*cells);
  const absl::Duration wall = absl::Now() - started;
  std::cout << (FLAGS_output == "json" ? RenderJson(*o, *cells, wall) : RenderTable(*cells));
  if (!FLAGS_junit.empty()) {
    if (absl::Status s = WriteFileAtomic(FLAGS_junit, RenderJUnit(*o, *cells)); !s.ok()) {
      std::cerr << "dpconform: --junit: " << s.message() << "\n";
      return 2;
    }
  }
  if (!FLAGS_markdown.empty()) {
    if (absl::Status s = WriteFileAtomic(FLAGS_markdown, RenderMarkdown(*o, *cells)); !s.ok()) {
      std::cerr << "dpconform: --markdown: " << s.message() << "\n";
      return 2;
    }
  }
  if (!FLAGS_html.empty()) {
    if (absl::Status s = WriteFileAtomic(FLAGS_html, RenderHtml(*o, *cells)); !s.ok()) {
      std::cerr << "dpconform: --html: " << s.message() << "\n";
      return 2;
    }
  }
  const int failing = static_cast<int>(std::count_if(cells->begin(), cells->end(), NewFailure));
  // The wall time, for a CI job's budget (the cells' own times overlap).
  if (!FLAGS_quiet) {
    std::cerr << "dpconform: " << cells->size() << " cells in "
              << absl::FormatDuration(absl::Trunc(wall, absl::Milliseconds(100))) << " ("
              << o->jobs << " at once); "
              << (failing == 0 ? std::string("no new failure")
                               : absl::StrCat(failing, " failed or blocked"))
              << (expectations.empty() ? "" : " beside the known ones") << "\n";
  }
  return failing == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dpproxy::conform

int main(int argc, char** argv) {
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << dpproxy::conform::kUsage << dpproxy::FlagsHelp({"conform/main.cc"});
    return 0;
  }
  if (!dpproxy::ParseFlags("dpconform", &argc, &argv)) return 2;
  dpproxy::conform::StopPluginsOnSignals();
  return dpproxy::conform::Run();
}
