#include "tools/conform/conform.h"


#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/grid_scenarios.h"
#include "tools/conform/dra.h"
#include "tools/conform/real.h"


namespace dpproxy::conform {
namespace {

using grid::Registers;
using grid::ServesFirst;
using grid::DeviceList;
using grid::ListSize;
using grid::ListGrowth;
using grid::PluginWatcher;
using grid::Health;
using grid::MultiResource;
using grid::Allocate;
using grid::AllocateTwo;
using grid::AllocateRestart;
using grid::Preferred;
using grid::PreStart;
using grid::KubeletRestart;
using grid::KubeletCrash;
using grid::PluginRestart;
using grid::CheckpointLost;
using grid::RollingUpdate;

struct ScenarioEntry {
  ScenarioInfo info;
  CellResult (*run)(Cell&);
};

const std::vector<ScenarioEntry>& Entries() {
  static const auto* const kEntries = new std::vector<ScenarioEntry>{
      {{"registers", "registers",
        "A registration this kubelet accepts arrives (version, resource name, endpoint) and the "
        "kubelet connects: v1alpha2 on /deviceplugin.Registration for 1.9, v1beta1 on "
        "/v1beta1.Registration from 1.10, or a plugins_registry/ socket from 1.13."},
       Registers},
      {{"serves-first", "serves before registering",
        "The plugin's socket accepts connections when its Register arrives. From 1.25 the "
        "kubelet dials it inside Register and fails the call otherwise; older releases dial "
        "afterwards (noted, not failed)."},
       ServesFirst},
      {{"plugin-watcher", "plugin-watcher registration",
        "Where the plugin offers a socket in plugins_registry/ and the kubelet watches it "
        "(1.13+): GetInfo says DevicePlugin with supported versions, and the kubelet connects."},
       PluginWatcher},
      {{"device-list", "device list arrives",
        "ListAndWatch sends a list with at least one Healthy device (an empty first list gets "
        "3 s), and the stream stays open."},
       DeviceList},
      {{"list-size", "device list within 4 MiB",
        "The list fits the kubelet's gRPC receive limit (4 MiB, gRPC's default); the cell "
        "reports how much of it the list uses."},
       ListSize},
      {{"list-growth", "a list growing past 4 MiB",
        "With --grow_command: the plugin lists twice its devices, which reach the kubelet on "
        "the same stream, then enough for a quarter over 4 MiB. A list over the kubelet's "
        "receive limit ends the stream and leaves every device unhealthy: the cell passes if "
        "the kubelet keeps healthy devices on a live stream (the list kept within the limit, "
        "or a new registration with one that fits)."},
       ListGrowth},
      {{"health", "health change propagates",
        "A device made Unhealthy, then Healthy (by --health_command) reaches the kubelet as a "
        "new full list on the same stream."},
       Health},
      {{"allocate", "Allocate, one container",
        "A pod with one container is admitted: one container response, absolute mount and "
        "device paths, and device access this release reads (cdi_devices alone is nothing "
        "before 1.28, or in 1.28-1.30 with the gate off)."},
       Allocate},
      {{"allocate-two", "Allocate, two containers",
        "A pod with two containers gets one Allocate each, and the two responses do not name "
        "the same device node or CDI device."},
       AllocateTwo},
      {{"preferred", "GetPreferredAllocation",
        "From 1.19, when offered: one container response with exactly allocation_size distinct "
        "available IDs."},
       Preferred},
      {{"prestart", "PreStartContainer",
        "When the plugin asks for it (from GetDevicePluginOptions in 1.25+, from "
        "RegisterRequest before): PreStartContainer succeeds before the container starts."},
       PreStart},
      {{"kubelet-restart", "re-registers after a kubelet restart",
        "The kubelet restarts, removing every socket in device-plugins/; the plugin registers "
        "again and its devices come back (the time it took is reported)."},
       KubeletRestart},
      {{"kubelet-crash", "re-registers after a kubelet crash, through a late cleanup",
        "Opt-in (name it in --scenarios): a stress beyond what any kubelet release is known to "
        "do. The kubelet is killed and comes back, and dpconform removes the sockets in "
        "device-plugins/ once more after the new kubelet.sock appeared, as the plugin's "
        "Register arrives (a real kubelet cleans up before it listens): the plugin serves its socket again and registers again.",
        true},
       KubeletCrash},
      {{"plugin-restart", "survives its own restart",
        "With a pod running, the plugin is stopped (SIGTERM) and started again: it registers "
        "again, the pod's device keeps its ID, the pod is re-admitted and new pods are too."},
       PluginRestart},
      {{"allocate-restart", "survives being killed during an Allocate",
        "The plugin is frozen as the kubelet sends it an Allocate and killed (SIGKILL) with the "
        "call unanswered; the kubelet fails that pod and gives its device back. Started again, "
        "the plugin registers although its old socket file is still there, and answers an "
        "Allocate for the same device."},
       AllocateRestart},
      {{"checkpoint-lost", "a kubelet without its checkpoint kills no running pod and hands out no device twice",
        "Opt-in (name it in --scenarios). With a pod running, the kubelet restarts without its "
        "checkpoint, as after a deletion, corruption or an upgrade across checkpoint layouts "
        "(1.19 to 1.20-1.21 or 1.31+): the kubelet forgets the pod's device and counts it "
        "free. The running pod must survive re-admission (the device keeps its health), the "
        "other devices must go to new pods, and no new pod may get the held one.",
        true},
       CheckpointLost},
      {{"rolling-update", "survives a rolling update with surge",
        "Opt-in (name it in --scenarios). A second instance ({instance}=2) registers while the "
        "first runs, then the first is stopped: the resource stays registered with devices. "
        "1.25-1.36 disconnect by resource name when the old stream ends (kubernetes#121994), "
        "so plain plugins fail there; with --per_socket_clients (#135437) instances with "
        "socket names of their own pass.",
        true},
       RollingUpdate},
      {{"multi-resource", "several resources from one process",
        "With two or more --resource: each registers with devices on its own socket, and a pod "
        "using all of them is admitted."},
       MultiResource},
  };
  return *kEntries;
}

const ScenarioEntry* FindScenario(const std::string& name) {
  for (const ScenarioEntry& e : Entries()) {
    if (name == e.info.name) return &e;
  }
  return nullptr;
}

// `first_wait`: how long the cell's first wait for the plugin may take, if
// not the timeout.
CellResult RunCell(const ConformOptions& o, const sim::KubeletVersion& k,
                   const ScenarioEntry& scenario, const std::string& dir,
                   std::optional<absl::Duration> first_wait = std::nullopt) {
  const absl::Time start = absl::Now();
  CellResult result;
  {
    Cell cell(o, k, dir);
    if (first_wait.has_value()) cell.LimitFirstWait(*first_wait);
    if (absl::Status s = cell.StartKubelet(); !s.ok()) {
      result = Fail(absl::StrCat("dpconform could not start its kubelet: ", s.message()), "", "",
                    "");
    } else if (absl::Status s = cell.StartPlugin(); !s.ok()) {
      result = Fail(absl::StrCat("could not start the plugin command: ", s.message()), "", "",
                    "");
    } else {
      result = scenario.run(cell);
    }
  }
  result.kubelet = k.name;
  result.generation = k.GenerationName();
  result.scenario = scenario.info.name;
  result.duration = absl::Now() - start;
  result.dir = dir;
  return result;
}

}  // namespace

CellResult Pass(std::string summary, std::vector<std::string> notes) {
  CellResult r;
  r.outcome = Outcome::kPass;
  r.summary = std::move(summary);
  r.notes = std::move(notes);
  return r;
}

CellResult NotApplicable(std::string why) {
  CellResult r;
  r.outcome = Outcome::kNotApplicable;
  r.summary = std::move(why);
  return r;
}

CellResult Fail(std::string summary, std::string did, std::string expects, std::string users) {
  CellResult r;
  r.outcome = Outcome::kFail;
  r.summary = std::move(summary);
  r.plugin_did = std::move(did);
  r.kubelet_expects = std::move(expects);
  r.users_see = std::move(users);
  return r;
}

std::string AdmissionOwner(const std::string& message) {
  if (absl::StrContains(message, "PreStartContainer")) return "prestart";
  if (absl::StrContains(message, "GetPreferredAllocation")) return "preferred";
  // The kubelet's own refusals, before any Allocate reaches the plugin:
  // what its device list showed at that moment.
  if (absl::StrContains(message, "has been stopped") ||
      absl::StrContains(message, "unavailable for") ||
      absl::StrContains(message, "no healthy devices present")) {
    return "device-list";
  }
  return "allocate";
}

absl::Status RunCommandToEnd(const ConformOptions& o, const std::string& flag,
                             const std::string& command,
                             const std::vector<std::pair<std::string, std::string>>& values,
                             const std::string& output_path, absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      StartCommand(o, command, values, output_path);
  if (!child.ok()) return child.status();
  std::optional<int> status = (*child)->Wait(timeout);
  if (!status.has_value()) {
    (*child)->Stop(o.stop_grace);
    return absl::DeadlineExceededError(absl::StrCat("--", flag, " did not end within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (*status != 0) {
    absl::StatusOr<std::string> out = ReadFile(output_path);
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, " ", ChildProcess::DescribeExit(*status), ": ",
        out.ok() && !out->empty() ? *out : std::string("(no output)")));
  }
  return absl::OkStatus();
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "fail";
    case Outcome::kBlocked: return "blocked";
    case Outcome::kNotApplicable: return "n/a";
  }
  return "?";
}

const std::vector<Placeholder>& Placeholders() {
  static const auto* const kPlaceholders = new std::vector<Placeholder>{
      {"kubelet_socket", "the kubelet's registration socket, <kubelet_root>/device-plugins/"
                         "kubelet.sock"},
      {"plugin_dir", "the device-plugins directory, where the plugin's socket goes"},
      {"kubelet_root", "the kubelet's root directory (/var/lib/kubelet on a node)"},
      {"plugins_registry", "the plugin watcher's directory, <kubelet_root>/plugins_registry"},
      {"work_dir", "a directory of the plugin's own for this cell, kept across its restarts "
                   "(state, control sockets)"},
      {"resource", "the first --resource"},
      {"kubelet_version", "the kubelet release this cell plays, e.g. 1.25"},
      {"instance", "1, or 2 for the new instance rolling-update starts while the old one "
                   "runs (unique socket names per instance: put it in the socket name)"},
  };
  return *kPlaceholders;
}

absl::StatusOr<std::string> Expand(
    const std::string& command, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string out;
  size_t i = 0;
  while (i < command.size()) {
    const size_t open = command.find('{', i);
    if (open == std::string::npos) break;
    const size_t close = command.find('}', open);
    if (close == std::string::npos) break;
    const std::string name = command.substr(open + 1, close - open - 1);
    const bool is_name =
        !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
          return (ch >= 'a' && ch <= 'z') || ch == '_';
        });
    out.append(command, i, open - i);
    if (!is_name) {  // not a placeholder (a shell's ${VAR} or braces): kept
      out.append(command, open, close + 1 - open);
      i = close + 1;
      continue;
    }
    auto it = std::find_if(values.begin(), values.end(),
                           [&](const auto& kv) { return kv.first == name; });
    if (it == values.end()) {
      std::vector<std::string> known;
      for (const auto& kv : values) known.push_back(absl::StrCat("{", kv.first, "}"));
      return absl::InvalidArgumentError(absl::StrCat("unknown placeholder {", name,
                                                     "}; known: ", absl::StrJoin(known, " ")));
    }
    out += it->second;
    i = close + 1;
  }
  out.append(command, i, std::string::npos);
  return out;
}

const std::vector<ScenarioInfo>& Scenarios() {
  static const auto* const kInfos = [] {
    auto* v = new std::vector<ScenarioInfo>;
    for (const ScenarioEntry& e : Entries()) v->push_back(e.info);
    return v;
  }();
  return *kInfos;
}

std::vector<std::string> DefaultKubelets() {
  std::vector<std::string> out;
  for (const sim::KubeletGeneration& g : sim::KubeletGenerations()) {
    out.push_back(absl::StrCat("1.", g.last_minor));
  }
  return out;
}

absl::Status ValidateOptions(const ConformOptions& o) {
  if (absl::Status s = ValidateRealOptions(o); !s.ok()) return s;
  if (!o.dra_driver.empty()) return ValidateDraOptions(o);
  if (o.plugin_command.empty()) {
    return absl::InvalidArgumentError("--plugin: the plugin's command line is required");
  }
  // A cell's values, with placeholder-length stand-ins, to find unknown
  // placeholders before anything runs.
  std::vector<std::pair<std::string, std::string>> values;
  for (const Placeholder& p : Placeholders()) values.emplace_back(p.name, "x");
  if (absl::StatusOr<std::string> s = Expand(o.plugin_command, values); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--plugin: ", s.status().message()));
  }
  if (!o.health_command.empty()) {
    values.emplace_back("device", "x");
    values.emplace_back("health", "x");
    if (absl::StatusOr<std::string> s = Expand(o.health_command, values); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--health_command: ", s.status().message()));
    }
  }
  if (!o.grow_command.empty()) {
    std::vector<std::pair<std::string, std::string>> grow = values;
    grow.emplace_back("count", "x");
    if (absl::StatusOr<std::string> s = Expand(o.grow_command, grow); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--grow_command: ", s.status().message()));
    }
  }
  if (o.resources.empty()) {
    return absl::InvalidArgumentError("--resource: at least one resource name is required");
  }
  for (const std::string& s : o.scenarios) {
    if (FindScenario(s) == nullptr) {
      std::vector<std::string> names;
      for (const ScenarioEntry& e : Entries()) names.push_back(e.info.name);
      return absl::InvalidArgumentError(absl::StrCat("--scenarios: unknown scenario \"", s,
                                                     "\"; known: ", absl::StrJoin(names, ", ")));
    }
  }
  if (o.kubelets.empty() && o.real_kubelets.empty()) {
    return absl::InvalidArgumentError("--kubelets: no kubelet release");
  }
  if (o.jobs < 1 || o.jobs > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs=", o.jobs, " must be 1 to 64"));
  }
  if (o.dial_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--dial_timeout must be positive");
  }
  if (o.timeout < o.dial_timeout + absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeout=", absl::FormatDuration(o.timeout), " is too short: the kubelet takes up to ",
        absl::FormatDuration(o.dial_timeout),
        " (--dial_timeout) to give up dialling a plugin; allow at least a second more"));
  }
  // <root>/dpconform.XXXXXX/c9999/k/plugins_registry/<socket>: leave room
  // for the plugin's own socket name.
  if (o.work_root.size() > 40) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--work_dir=", o.work_root, " is too long (", o.work_root.size(),
        " bytes; at most 40): the sockets inside must stay within the 107-byte limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChildProcess>> StartCommand(
    const ConformOptions& o, const std::string& command,
    const std::vector<std::pair<std::string, std::string>>& values,
    const std::string& output_path) {
  absl::StatusOr<std::string> expanded = Expand(command, values);
  if (!expanded.ok()) return expanded.status();
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", *expanded};
  // util-linux's prlimit sets the file-size limit, then runs the shell: a
  // plugin that floods its output is stopped (SIGXFSZ) at the limit
  // rather than filling the disk. Without it the output is not bounded.
  if (::access(kPrlimit, X_OK) == 0) {
    spec.argv.insert(spec.argv.begin(),
                     {kPrlimit, absl::StrCat("--fsize=", kMaxPluginOutputBytes), "--"});
  }
  spec.output_path = output_path;
  spec.env = o.env;
  for (const auto& [name, value] : values) {
    spec.env.emplace_back(absl::StrCat("DPCONFORM_", absl::AsciiStrToUpper(name)), value);
  }
  return ChildProcess::Start(spec);
}

CellResult UnmadeResult(const std::string& why) {
  CellResult r;
  r.outcome = Outcome::kFail;
  r.summary = absl::StrCat("dpconform could not make the cell's directory: ", why);
  r.plugin_did = "(the test harness, not the plugin: the run's directory was removed or "
                 "replaced while it ran, or its disk is full)";
  return r;
}

CellResult UnmadeResult(const std::string& why, const sim::KubeletVersion& k,
                        const std::string& scenario) {
  CellResult r = UnmadeResult(why);
  r.kubelet = k.name;
  r.generation = k.GenerationName();
  r.scenario = scenario;
  return r;
}

absl::StatusOr<std::vector<CellResult>> RunCells(
    const ConformOptions& o, size_t n,
    const std::function<CellResult(size_t, const std::string&)>& run,
    const UnmadeCell& unmade) {
  if (absl::Status s = MakeDirs(o.work_root); !s.ok()) return s;
  std::string root = JoinPath(o.work_root, "dpconform.XXXXXX");
  if (::mkdtemp(root.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make a directory in ", o.work_root, ": ", ErrnoText(errno)));
  }
  std::vector<CellResult> results(n);
  std::atomic<size_t> next{0};
  absl::Mutex report_mu;
  size_t done = 0;  // under report_mu
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) {
      const std::string dir = JoinPath(root, absl::StrCat("c", i));
      if (absl::Status s = MakeDirs(dir); !s.ok()) {
        results[i] = unmade(i, std::string(s.message()));
      } else {
        results[i] = run(i, dir);
      }
      const bool keep = o.keep || results[i].outcome == Outcome::kFail ||
                        results[i].outcome == Outcome::kBlocked;
      if (!keep) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
        results[i].dir.clear();
      }
      absl::MutexLock lock(&report_mu);
      ++done;
      if (o.on_cell) o.on_cell(results[i], done, n);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < std::min<int>(o.jobs, static_cast<int>(n)); ++t) {
    threads.emplace_back(worker);
  }
  for (std::thread& t : threads) t.join();
  bool any_kept = std::any_of(results.begin(), results.end(),
                              [](const CellResult& r) { return !r.dir.empty(); });
  if (!any_kept) {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
  return results;
}

absl::StatusOr<std::vector<CellResult>> RunGatedCells(
    const ConformOptions& o, const std::vector<std::pair<const void*, std::string>>& cells,
    const std::string& gate,
    const std::function<CellResult(size_t, const std::string&, std::optional<absl::Duration>)>&
        run,
    const UnmadeCell& unmade) {
  // The gate cells first, the rest in the report's order.
  std::vector<size_t> order(cells.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return cells[i].second == gate; });
  struct Gate {
    absl::Notification done;
    bool failed = false;  // written before done is notified
  };
  std::map<const void*, std::unique_ptr<Gate>> gates;
  for (const auto& [release, scenario] : cells) {
    if (scenario == gate) gates[release] = std::make_unique<Gate>();
  }
  // A gate cell that ends (or never runs) opens its release's gate.
  auto open = [&](size_t i, bool failed) {
    auto g = gates.find(cells[i].first);
    if (g == gates.end() || cells[i].second != gate) return;
    g->second->failed = failed;
    g->second->done.Notify();
  };
  absl::StatusOr<std::vector<CellResult>> ran = RunCells(
      o, order.size(),
      [&](size_t j, const std::string& dir) {
        const size_t i = order[j];
        auto g = gates.find(cells[i].first);
        if (g == gates.end()) return run(i, dir, std::nullopt);
        if (cells[i].second == gate) {
          CellResult r = run(i, dir, std::nullopt);
          open(i, r.outcome == Outcome::kFail);
          return r;
        }
        g->second->done.WaitForNotification();
        return run(i, dir,
                   g->second->failed
                       ? std::optional<absl::Duration>(std::min(o.timeout, kAfterFailedRegisters))
                       : std::nullopt);
      },
      [&](size_t j, const std::string& why) {
        open(order[j], true);
        return unmade(order[j], why);
      });
  if (!ran.ok()) return ran;
  std::vector<CellResult> results(cells.size());
  for (size_t j = 0; j < order.size(); ++j) results[order[j]] = std::move((*ran)[j]);
  return results;
}

void SettleBlocked(std::vector<CellResult>* results) {
  std::map<std::pair<std::string, std::string>, Outcome> outcome;
  for (const CellResult& r : *results) outcome[{r.kubelet, r.scenario}] = r.outcome;
  for (CellResult& r : *results) {
    if (r.outcome != Outcome::kBlocked) continue;
    auto it = outcome.find({r.kubelet, r.blocked_by});
    if (it != outcome.end() && it->second == Outcome::kFail) continue;
    // The check belongs to another scenario, but that scenario did not fail
    // in this release: what went wrong is this cell's own.
    r.outcome = Outcome::kFail;
    r.summary = absl::StrCat(
        r.summary, "; ", r.blocked_by,
        it == outcome.end() ? std::string(" was not run")
                            : absl::StrCat(" itself was ", OutcomeName(it->second)),
        " in kubelet ", r.kubelet, ", so this is this cell's own failure");
    r.blocked_by.clear();
  }
}

absl::StatusOr<std::vector<CellResult>> RunConformance(const ConformOptions& o) {
  if (!o.dra_driver.empty()) {
    absl::StatusOr<std::vector<CellResult>> results = RunDraConformance(o);
    if (results.ok()) SettleBlocked(&*results);
    return results;
  }
  if (absl::Status s = ValidateOptions(o); !s.ok()) return s;
  std::vector<const ScenarioEntry*> scenarios;
  if (o.scenarios.empty()) {
    for (const ScenarioEntry& e : Entries()) {
      if (!e.info.opt_in) scenarios.push_back(&e);
    }
  } else {
    for (const std::string& s : o.scenarios) scenarios.push_back(FindScenario(s));
  }
  // The real node first: a node that cannot be used says so before the
  // simulated cells take their time.
  absl::StatusOr<std::vector<CellResult>> real = RunRealConformance(o);
  if (!real.ok()) return real.status();
  std::vector<std::pair<const sim::KubeletVersion*, const ScenarioEntry*>> jobs;
  std::vector<std::pair<const void*, std::string>> grid;
  for (const sim::KubeletVersion& k : o.kubelets) {
    for (const ScenarioEntry* s : scenarios) {
      jobs.emplace_back(&k, s);
      grid.emplace_back(&k, s->info.name);
    }
  }
  absl::StatusOr<std::vector<CellResult>> results =
      jobs.empty()
          ? std::vector<CellResult>{}
          : RunGatedCells(
                o, grid, "registers",
                [&](size_t i, const std::string& dir, std::optional<absl::Duration> first_wait) {
                  return RunCell(o, *jobs[i].first, *jobs[i].second, dir, first_wait);
                },
                [&](size_t i, const std::string& why) {
                  return UnmadeResult(why, *jobs[i].first, jobs[i].second->info.name);
                });
  if (!results.ok()) return results;
  results->insert(results->end(), real->begin(), real->end());
  SettleBlocked(&*results);
  return results;
}

}  // namespace dpproxy::conform
