#include "tools/conform/real.h"

#include <csignal>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include <grpcpp/client_context.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_util.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/grid_scenarios.h"
#include "tools/conform/real_node.h"

namespace dpproxy::conform {
namespace {

// One cell on the real node: the plugin's process and the pods it made.
class RealCell {
 public:
  // `pod_prefix`: the names of the cell's pods begin with it (unique to
  // the run and the cell: a pod of an earlier cell may still be going).
  RealCell(const ConformOptions& o, RealNode& node, std::string dir, std::string pod_prefix)
      : o_(o), node_(node), dir_(std::move(dir)), pod_prefix_(std::move(pod_prefix)) {}

  ~RealCell() {
    for (const std::string& p : pods_) node_.DeletePod(p, o_.timeout).IgnoreError();
    StopPlugin();
  }

  RealNode& node() { return node_; }
  const ConformOptions& options() const { return o_; }
  const std::string& resource() const { return o_.resources.front(); }
  const std::string& dir() const { return dir_; }

  std::vector<std::pair<std::string, std::string>> Values(
      std::vector<std::pair<std::string, std::string>> extra = {}) const {
    const std::string& root = o_.real.kubelet_root;
    std::vector<std::pair<std::string, std::string>> v = {
        {"kubelet_socket", JoinPath(root, "device-plugins/kubelet.sock")},
        {"plugin_dir", JoinPath(root, "device-plugins")},
        {"kubelet_root", root},
        {"plugins_registry", JoinPath(root, "plugins_registry")},
        {"work_dir", JoinPath(dir_, "w")},
        {"resource", resource()},
        {"kubelet_version", node_.minor()},
        {"instance", "1"},
    };
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  }

  absl::Status StartPlugin() {
    if (absl::Status s = MakeDirs(JoinPath(dir_, "w")); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        StartCommand(o_, o_.plugin_command, Values(), JoinPath(dir_, "plugin.log"));
    if (!child.ok()) return child.status();
    plugin_ = *std::move(child);
    return absl::OkStatus();
  }

  std::string StopPlugin() {
    if (plugin_ == nullptr) return ended_;
    ended_ = ChildProcess::DescribeExit(plugin_->Stop(o_.stop_grace));
    plugin_.reset();
    return ended_;
  }

  // nullopt while it runs; how it ended otherwise.
  std::optional<std::string> PluginEnded() {
    if (plugin_ == nullptr) return ended_;
    if (plugin_->Running()) return std::nullopt;
    ended_ = ChildProcess::DescribeExit(*plugin_->Wait(absl::ZeroDuration()));
    return ended_;
  }

  std::string PluginOutputTail(int lines = 5) const {
    absl::StatusOr<std::string> out = ReadFile(JoinPath(dir_, "plugin.log"));
    if (!out.ok() || out->empty()) return "(no output)";
    std::vector<std::string> all = absl::StrSplit(*out, '\n', absl::SkipEmpty());
    const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
    return absl::StrJoin(all.begin() + static_cast<long>(first), all.end(), " | ");
  }

  absl::Status SetHealth(const std::string& device, const std::string& health) {
    return RunCommandToEnd(o_, "health_command", o_.health_command,
                           Values({{"device", device}, {"health", health}}),
                           JoinPath(dir_, "health_command.log"), o_.timeout);
  }

  absl::Status Grow(int64_t count) {
    return RunCommandToEnd(o_, "grow_command", o_.grow_command,
                           Values({{"count", absl::StrCat(count)}}),
                           JoinPath(dir_, "grow_command.log"), o_.timeout);
  }

  absl::Status RestartKubelet() {
    return RunCommandToEnd(o_, "restart_kubelet", o_.real.restart_kubelet, Values(),
                           JoinPath(dir_, "restart_kubelet.log"), kRestartLimit);
  }

  // Waits until the kubelet lists allocatable devices of the resource; the
  // IDs, or a Problem of `owner`'s (registers, or a scenario whose own
  // step is to come back) saying what was seen.
  std::variant<std::set<std::string>, Problem> Registered(const std::string& owner,
                                                          const std::string& after) {
    return Registered(owner, after, resource());
  }
  // The same for `resource`, one of --resource.
  std::variant<std::set<std::string>, Problem> Registered(const std::string& owner,
                                                          const std::string& after,
                                                          const std::string& resource) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + o_.timeout;
    absl::Status last = absl::OkStatus();
    while (true) {
      absl::StatusOr<std::set<std::string>> ids = node_.Allocatable(resource);
      if (ids.ok() && !ids->empty()) {
        registered_after_ = absl::Now() - start;
        return *ids;
      }
      last = ids.status();
      if (std::optional<std::string> ended = PluginEnded()) {
        return Problem{owner,
                       absl::StrCat("the plugin ", *ended,
                                    " before the kubelet listed its devices"),
                       absl::StrCat(*ended, " ", after, "; its output: ", PluginOutputTail()),
                       ExpectedRegistration(),
                       absl::StrCat("the node shows no allocatable ", resource)};
      }
      if (absl::Now() >= deadline) {
        return Problem{
            owner,
            absl::StrCat("the kubelet listed no allocatable ", resource, " within ",
                         absl::FormatDuration(o_.timeout), " ", after),
            absl::StrCat("ran, but the kubelet's pod-resources socket lists no healthy ",
                         resource, last.ok() ? "" : absl::StrCat(" (", last.message(), ")"),
                         "; its output: ", PluginOutputTail()),
            ExpectedRegistration(),
            absl::StrCat("the node's allocatable ", resource, " stays 0: pods asking for it "
                         "are not scheduled, or fail UnexpectedAdmissionError on the node")};
      }
      absl::SleepFor(kPoll);
    }
  }

  absl::Duration registered_after() const { return registered_after_; }

  // Makes a pod (named for the cell) and waits for the kubelet's verdict.
  PodOutcome Pod(const std::vector<int>& counts, std::string* name) {
    std::vector<std::pair<std::string, int>> containers;
    for (int n : counts) containers.emplace_back(resource(), n);
    return PodOf(containers, name);
  }
  // The same with one container per entry of `containers` (resource, count).
  PodOutcome PodOf(const std::vector<std::pair<std::string, int>>& containers,
                   std::string* name) {
    PodOutcome out;
    if (absl::Status s = StartPodOf(containers, name); !s.ok()) {
      out.kind = PodOutcome::kImage;  // the harness's problem, not the plugin's
      out.reason = "not created";
      out.message = std::string(s.message());
      return out;
    }
    return node_.WaitPod(*name, o_.timeout);
  }

  // Makes a pod (named for the cell) and does not wait.
  absl::Status StartPod(const std::vector<int>& counts, std::string* name) {
    std::vector<std::pair<std::string, int>> containers;
    for (int n : counts) containers.emplace_back(resource(), n);
    return StartPodOf(containers, name);
  }
  absl::Status StartPodOf(const std::vector<std::pair<std::string, int>>& containers,
                          std::string* name) {
    *name = absl::StrCat(pod_prefix_, "-", pods_made_++);
    if (absl::Status s = node_.CreatePod(*name, containers); !s.ok()) return s;
    pods_.push_back(*name);
    return absl::OkStatus();
  }

  // The plugin's process group frozen (SIGSTOP) once every thread stopped.
  bool FreezePlugin() { return plugin_ != nullptr && plugin_->Freeze(o_.timeout); }
  // SIGKILL to the group, no grace; how the plugin ended.
  std::string KillPlugin() {
    if (plugin_ == nullptr) return ended_;
    ended_ = ChildProcess::DescribeExit(plugin_->Kill());
    plugin_.reset();
    return ended_;
  }
  // Bytes waiting unread in the plugin's sockets (ChildProcess).
  std::optional<int64_t> UnreadBytes() const {
    return plugin_ == nullptr ? std::nullopt : plugin_->UnreadSocketBytes();
  }

  // A pod outcome that is not kRunning, as the Problem of `owner` (or the
  // harness's, or the device list's, by what the kubelet said).
  Problem PodProblem(const std::string& owner, const std::string& pod, const PodOutcome& out) {
    const bool list = out.kind == PodOutcome::kRefused &&
                      AdmissionOwner(out.message) == "device-list";
    return OutcomeProblem(
        list ? "registers" : owner, pod, out, o_.timeout,
        {list ? "had too few healthy devices registered when the pod came"
              : "answered so that the kubelet failed the pod (Allocate, GetPreferredAllocation "
                "or PreStartContainer)",
         "an answer for every container it asks about, within its deadline",
         "answered Allocate with something the container runtime refused (a host path or "
         "device node that does not exist, a CDI device without a spec)",
         "mounts, device nodes and CDI devices that exist on the node",
         "(the test harness, not the plugin: --pod_image must be on the node, and "
         "--kubeconfig may make pods in --namespace)",
         "the kubelet neither ran the pod nor refused it in time: a slow Allocate (the kubelet "
         "waits 30 s for it), or a slow runtime",
         "an Allocate answer well within its 30 s deadline", "pods stay Pending, then fail"});
  }

  // The devices of `resource` (default: the first --resource) the kubelet
  // lists for each container of `pod`.
  std::map<std::string, std::vector<std::string>> DevicesOf(const std::string& pod,
                                                            const std::string& resource = "") {
    absl::StatusOr<std::map<std::string, std::vector<std::string>>> d =
        node_.ContainerDevices(pod, resource.empty() ? this->resource() : resource);
    return d.ok() ? *d : std::map<std::string, std::vector<std::string>>{};
  }

  std::string ContainerId(const std::string& pod) { return node_.RunningContainerId(pod); }

 private:
  std::string ExpectedRegistration() const {
    return absl::StrCat("a Register call on ", o_.real.kubelet_root,
                        "/device-plugins/kubelet.sock (or a socket in plugins_registry/), "
                        "then a ListAndWatch list with healthy devices");
  }

  const ConformOptions& o_;
  RealNode& node_;
  const std::string dir_;
  const std::string pod_prefix_;
  std::unique_ptr<ChildProcess> plugin_;
  std::string ended_;
  std::vector<std::string> pods_;
  int pods_made_ = 0;
  absl::Duration registered_after_;
};

// --- Scenarios ----------------------------------------------------------------------

using Registration = std::variant<std::set<std::string>, Problem>;

CellResult RealRegisters(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("registers", *p);
  const auto& ids = std::get<std::set<std::string>>(r);
  return Pass(absl::StrCat("the kubelet lists ", ids.size(), " allocatable ", c.resource()),
              {absl::StrCat("listed ", Ms(c.registered_after()), " after the plugin started")});
}

CellResult RealDeviceList(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("device-list", *p);
  const int64_t want = static_cast<int64_t>(std::get<std::set<std::string>>(r).size());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + c.options().timeout;
  absl::StatusOr<int64_t> seen = int64_t{0};
  while ((seen = c.node().NodeAllocatable(c.resource())).ok() ? *seen != want : true) {
    if (absl::Now() >= deadline) {
      return Fail(absl::StrCat("the node's allocatable ", c.resource(), " is ",
                               seen.ok() ? absl::StrCat(*seen)
                                         : std::string(seen.status().message()),
                               ", not the ", want, " the kubelet lists, after ",
                               absl::FormatDuration(c.options().timeout)),
                  "listed devices the kubelet holds but does not report to the API server",
                  "the node status shows the healthy devices at its next update (10 s)",
                  "the scheduler places pods by a count the node does not have");
    }
    absl::SleepFor(kPoll);
  }
  return Pass(absl::StrCat("the node's allocatable ", c.resource(), " is ", want),
              {absl::StrCat("the API server showed it ", Ms(absl::Now() - start),
                            " after the kubelet listed it")});
}

CellResult RealHealth(RealCell& c) {
  if (c.options().health_command.empty()) {
    return NotApplicable("no --health_command: dpconform cannot make a device unhealthy");
  }
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("health", *p);
  const std::string device = *std::get<std::set<std::string>>(r).begin();
  std::vector<std::string> notes;
  for (const char* health : {"Unhealthy", "Healthy"}) {
    const bool listed_when_done = health == std::string("Healthy");
    const absl::Time start = absl::Now();
    if (absl::Status s = c.SetHealth(device, health); !s.ok()) {
      return Fail(absl::StrCat("the health command failed: ", s.message()),
                  "(the test harness, not the plugin: --health_command failed)",
                  "a way to change a device's health", "nothing: fix --health_command");
    }
    while (true) {
      absl::StatusOr<std::set<std::string>> ids = c.node().Allocatable(c.resource());
      if (ids.ok() && (ids->count(device) > 0) == listed_when_done) break;
      if (absl::Now() >= start + c.options().timeout) {
        return Fail(absl::StrCat("the change to ", health, " never reached the kubelet"),
                    absl::StrCat("was told to make ", device, " ", health, "; the kubelet ",
                                 listed_when_done ? "still lists it as not allocatable"
                                                  : "still lists it as allocatable",
                                 " after ", absl::FormatDuration(c.options().timeout)),
                    "a new full list on the open ListAndWatch stream at every change",
                    listed_when_done ? "a repaired device stays out of use"
                                     : "the kubelet keeps handing out a broken device");
      }
      absl::SleepFor(kPoll);
    }
    notes.push_back(absl::StrCat(device, " ", health, " seen after ", Ms(absl::Now() - start)));
  }
  return Pass("a device's health change reached the kubelet, both ways", notes);
}

CellResult RealAllocate(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("allocate", *p);
  const auto& ids = std::get<std::set<std::string>>(r);
  std::string pod;
  PodOutcome out = c.Pod({1}, &pod);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("allocate", c.PodProblem("allocate", pod, out));
  }
  const std::vector<std::string> got = c.DevicesOf(pod)["c0"];
  if (got.size() != 1 || ids.count(got[0]) == 0) {
    return Fail(absl::StrCat("pod ", pod, " runs, but the kubelet lists ", got.size(),
                             " devices for it (", absl::StrJoin(got, ","), ")"),
                "(the kubelet's own account: the plugin's IDs are not what it holds)",
                "one of the listed devices for a container asking for one",
                "monitoring agents see the wrong devices for the pod");
  }
  return Pass(absl::StrCat("a pod was admitted and runs with ", got[0]));
}

CellResult RealAllocateTwo(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("allocate-two", *p);
  if (std::get<std::set<std::string>>(r).size() < 2) {
    return NotApplicable("the plugin lists one device: two containers cannot each have one");
  }
  std::string pod;
  PodOutcome out = c.Pod({1, 1}, &pod);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("allocate-two", c.PodProblem("allocate-two", pod, out));
  }
  std::map<std::string, std::vector<std::string>> got = c.DevicesOf(pod);
  if (got["c0"].size() != 1 || got["c1"].size() != 1 || got["c0"] == got["c1"]) {
    return Fail(absl::StrCat("pod ", pod, "'s containers are listed with ",
                             absl::StrJoin(got["c0"], ","), " and ",
                             absl::StrJoin(got["c1"], ",")),
                "(the kubelet's own account of the two Allocates)",
                "one distinct device for each container",
                "two containers share a device");
  }
  return Pass(absl::StrCat("both containers run, with ", got["c0"][0], " and ", got["c1"][0]));
}

// With a pod running, `disrupt` happens; the plugin must come back, the pod
// keep its container and device, and a new pod be admitted.
CellResult SurvivesDisruption(RealCell& c, const std::string& scenario, const std::string& what,
                              const std::function<absl::Status()>& disrupt,
                              const std::string& expects, const std::string& users_see) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem(scenario, *p);
  std::string first;
  PodOutcome out = c.Pod({1}, &first);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem(scenario, c.PodProblem("allocate", first, out));
  }
  const std::string container = c.ContainerId(first);
  const std::vector<std::string> held = c.DevicesOf(first)["c0"];
  if (absl::Status s = disrupt(); !s.ok()) {
    return Fail(absl::StrCat(what, " failed: ", s.message()),
                "(the test harness, not the plugin)", "", "nothing: fix the command");
  }
  const absl::Time back = absl::Now();
  Registration again = c.Registered(scenario, absl::StrCat("after ", what));
  if (auto* p = std::get_if<Problem>(&again)) {
    p->kubelet_expects = expects;
    p->users_see = users_see;
    return FromProblem(scenario, *p);
  }
  std::vector<std::string> notes = {
      absl::StrCat("devices listed again ", Ms(absl::Now() - back), " after ", what)};
  absl::StatusOr<Json> pod = c.node().GetPod(first);
  const std::string now = c.ContainerId(first);
  if (now.empty() || now != container) {
    return Fail(absl::StrCat("pod ", first, ", running before ", what, ", lost its container: ",
                             pod.ok() ? (*pod)["status"].value("message",
                                                               (*pod)["status"].value("phase", ""))
                                      : std::string(pod.status().message())),
                absl::StrCat("came back ", notes[0]),
                "running pods keep their containers and devices", 
                "running pods killed by a restart");
  }
  std::string second;
  out = c.Pod({1}, &second);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem(scenario, c.PodProblem(scenario, second, out));
  }
  const std::vector<std::string> given = c.DevicesOf(second)["c0"];
  if (!held.empty() && given == held) {
    return Fail(absl::StrCat("the new pod was given ", absl::StrJoin(given, ","), ", which ",
                             first, " holds"),
                "(the kubelet's own account)", "a device in use goes to nobody else",
                "two pods share a device");
  }
  notes.push_back(absl::StrCat(first, " kept ", absl::StrJoin(held, ","), "; ", second,
                               " got ", absl::StrJoin(given, ",")));
  return Pass(absl::StrCat("registered again after ", what, "; the running pod kept its "
                           "container and a new pod was admitted"),
              notes);
}

CellResult RealKubeletRestart(RealCell& c) {
  return SurvivesDisruption(
      c, "kubelet-restart", "the kubelet's restart",
      [&] { return c.RestartKubelet(); },
      "a new Register whenever kubelet.sock is made again: the kubelet removes every socket "
      "in device-plugins/ when it starts",
      absl::StrCat("after a kubelet restart the node's allocatable ", c.resource(),
                   " stays 0 and new pods fail UnexpectedAdmissionError"));
}

CellResult RealPluginRestart(RealCell& c) {
  return SurvivesDisruption(
      c, "plugin-restart", "its own restart (SIGTERM, then started again)",
      [&] {
        c.StopPlugin();
        return c.StartPlugin();
      },
      "a new Register each time the plugin starts",
      absl::StrCat("after the plugin's restart the node's allocatable ", c.resource(),
                   " stays 0"));
}

// allocate-restart on the node's kubelet: the plugin is frozen, a pod is
// made, and once the kubelet's request waits unread in the plugin's
// sockets the plugin is killed (SIGKILL). The kubelet must fail that pod
// and give its device back; the plugin, started again, registers (its
// socket file left behind), and a new pod runs.
CellResult RealAllocateRestart(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("allocate-restart", *p);
  const std::optional<int64_t> before = c.UnreadBytes();
  if (!c.FreezePlugin()) {
    return Fail("dpconform could not freeze the plugin (SIGSTOP to its process group)",
                "(the test harness, not the plugin)", "", "");
  }
  std::string first;
  if (absl::Status s = c.StartPod({1}, &first); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not make a pod: ", s.message()),
                "(the test harness, not the plugin)", "", "");
  }
  // The kubelet's Allocate (or GetPreferredAllocation) arrives as bytes the
  // frozen plugin cannot read; there is nothing to wait on but the count.
  bool seen = false;
  const absl::Time deadline = absl::Now() + c.options().timeout;
  while (before.has_value()) {
    std::optional<int64_t> now = c.UnreadBytes();
    if (!now.has_value()) break;
    if (*now > *before) {
      seen = true;
      break;
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(kPoll);
  }
  const std::string ended = c.KillPlugin();
  std::vector<std::string> notes = {
      seen ? absl::StrCat("killed (", ended, ") with the kubelet's call for pod ", first,
                          " unread in its socket")
           : absl::StrCat("killed (", ended, "); no call for pod ", first,
                          " was seen arriving first")};
  PodOutcome out = c.node().WaitPod(first, c.options().timeout);
  if (out.kind == PodOutcome::kRunning) {
    return Fail(absl::StrCat("pod ", first, " runs although the plugin was killed before it "
                                            "answered"),
                "(the kubelet's own account)",
                "a failed Allocate fails the pod (UnexpectedAdmissionError)",
                "a container runs without the plugin's answer: no device access");
  }
  notes.push_back(absl::StrCat("the kubelet failed pod ", first, ": ", out.reason,
                               out.message.empty() ? "" : absl::StrCat(": ", out.message)));
  if (absl::Status s = c.StartPlugin(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start the plugin again: ", s.message()),
                "(the test harness, not the plugin)", "", "");
  }
  Registration again = c.Registered("allocate-restart", "after it was killed during an Allocate");
  if (auto* p = std::get_if<Problem>(&again)) {
    p->kubelet_expects = absl::StrCat(p->kubelet_expects,
                                      "; a plugin started after a SIGKILL removes the socket "
                                      "file its killed process left before it listens");
    return FromProblem("allocate-restart", *p);
  }
  std::string second;
  out = c.Pod({1}, &second);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("allocate-restart", c.PodProblem("allocate-restart", second, out));
  }
  notes.push_back(
      absl::StrCat(second, " runs with ", absl::StrJoin(c.DevicesOf(second)["c0"], ",")));
  return Pass("registered again after a SIGKILL during Allocate; a new pod runs", notes);
}

// list-growth on the node's kubelet: the plugin lists twice its devices,
// which the kubelet must list as allocatable, then enough for a quarter
// over 4 MiB (estimated from the doubled list). The kubelet shows all of
// them (the list fit), or none (its stream ended: every device unhealthy)
// until the plugin registers again with a list that fits, or the list
// the plugin kept within the limit.
CellResult RealListGrowth(RealCell& c) {
  if (c.options().grow_command.empty()) {
    return NotApplicable("no --grow_command: dpconform cannot make the plugin list more devices");
  }
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("list-growth", *p);
  auto harness = [](const absl::Status& s) {
    return Fail(absl::StrCat("the grow command failed: ", s.message()),
                "(the test harness, not the plugin: --grow_command failed)",
                "a way to change how many devices the plugin lists", "nothing: fix --grow_command");
  };
  // Waits until `done` holds for the kubelet's allocatable IDs, up to `wait`.
  auto until = [&](absl::Duration wait,
                   const std::function<bool(const std::set<std::string>&)>& done)
      -> std::optional<std::set<std::string>> {
    const absl::Time deadline = absl::Now() + wait;
    while (true) {
      absl::StatusOr<std::set<std::string>> ids = c.node().Allocatable(c.resource());
      if (ids.ok() && done(*ids)) return *ids;
      if (absl::Now() >= deadline) return std::nullopt;
      absl::SleepFor(kPoll);
    }
  };
  const int64_t doubled = 2 * static_cast<int64_t>(std::get<std::set<std::string>>(r).size());
  if (absl::Status s = c.Grow(doubled); !s.ok()) return harness(s);
  std::optional<std::set<std::string>> grown = until(
      c.options().timeout, [&](const std::set<std::string>& ids) {
        return static_cast<int64_t>(ids.size()) == doubled;
      });
  if (!grown.has_value()) {
    return Fail(absl::StrCat("the kubelet never listed ", doubled, " allocatable devices"),
                absl::StrCat("was told to list ", doubled, " devices; the kubelet did not show "
                             "them within ", absl::FormatDuration(c.options().timeout)),
                "a new full list on the open ListAndWatch stream at every change, more devices "
                "included",
                "new hardware never becomes allocatable until the plugin restarts");
  }
  v1beta1::ListAndWatchResponse list;
  for (const std::string& id : *grown) {
    v1beta1::Device* d = list.add_devices();
    d->set_id(id);
    d->set_health("Healthy");
  }
  const double per_device = static_cast<double>(list.ByteSizeLong()) / static_cast<double>(doubled);
  const int64_t target = std::max<int64_t>(
      doubled + 1, static_cast<int64_t>(1.25 * kKubeletReceiveLimit / per_device) + 1);
  std::vector<std::string> notes = {
      absl::StrCat(doubled, " devices listed as allocatable by the kubelet"),
      absl::StrFormat("told to list %d devices (about %.1f MiB at %.0f bytes a device)", target,
                      target * per_device / (1 << 20), per_device)};
  if (absl::Status s = c.Grow(target); !s.ok()) return harness(s);
  std::optional<std::set<std::string>> after =
      until(c.options().settle + c.options().timeout / 2, [&](const std::set<std::string>& ids) {
        return ids.empty() || static_cast<int64_t>(ids.size()) == target;
      });
  if (after.has_value() && !after->empty()) {
    return Pass(absl::StrCat("all ", target, " devices are allocatable on the kubelet"), notes);
  }
  if (!after.has_value()) {
    return Pass("kept its list within the kubelet's limit: the kubelet still lists devices",
                notes);
  }
  const absl::Time lost = absl::Now();
  if (until(c.options().timeout, [](const std::set<std::string>& ids) { return !ids.empty(); })) {
    notes.push_back(absl::StrCat("no device allocatable at ", target, "; devices back ",
                                 Ms(absl::Now() - lost), " later"));
    return Pass("registered again with a list the kubelet takes", notes);
  }
  CellResult failed = Fail(
      absl::StrCat("a list of ", target, " devices left the kubelet no allocatable device"),
      absl::StrCat("sent its list as it grew past the kubelet's 4 MiB receive limit; the kubelet "
                   "listed no allocatable ", c.resource(), " for ",
                   absl::FormatDuration(c.options().timeout), " after"),
      "every list within 4 MiB (gRPC's default, which the kubelet's client keeps)",
      absl::StrCat("the node's allocatable ", c.resource(),
                   " drops to 0 and stays there until the plugin restarts"));
  failed.notes = notes;
  return failed;
}

// plugin-watcher on the node's kubelet: the plugin offers a socket in
// plugins_registry/ whose GetInfo says DevicePlugin and the resource (n/a
// if none: it registers through kubelet.sock), and the kubelet lists that
// socket among the plugins it registered (its metric
// plugin_manager_total_plugins) and the resource's devices as allocatable.
CellResult RealPluginWatcher(RealCell& c) {
  Registration r = c.Registered("registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("plugin-watcher", *p);
  const std::string registry = JoinPath(c.options().real.kubelet_root, "plugins_registry");
  std::string socket;
  for (const std::string& s : SocketsIn(registry)) {
    const RegistrationInfo info = GetInfo(s);
    if (info.answered && info.type == "DevicePlugin" && info.name == c.resource()) socket = s;
  }
  if (socket.empty()) {
    return NotApplicable(absl::StrCat("registers through kubelet.sock; no socket in ", registry,
                                      " answers GetInfo as a DevicePlugin of ", c.resource()));
  }
  const absl::Time deadline = absl::Now() + c.options().timeout;
  absl::StatusOr<std::string> metrics = c.node().KubeletMetrics();
  while (metrics.ok() && RegisteredSockets(*metrics).count(socket) == 0 &&
         absl::Now() < deadline) {
    absl::SleepFor(kPoll);
    metrics = c.node().KubeletMetrics();
  }
  if (!metrics.ok()) {
    return Fail(absl::StrCat("dpconform could not read the kubelet's metrics: ",
                             metrics.status().message()),
                "(the test harness, not the plugin: --kubeconfig may not read nodes/proxy)", "",
                "nothing: fix --kubeconfig");
  }
  if (RegisteredSockets(*metrics).count(socket) == 0) {
    return Fail(absl::StrCat(socket, " answers GetInfo, but the kubelet has not registered it"),
                "offers a plugin-watcher socket the kubelet does not register (its versions, "
                "or its endpoint, refused), and registered through kubelet.sock",
                "GetInfo with a version the kubelet supports (v1beta1) and an endpoint it "
                "can dial",
                "nothing while kubelet.sock takes the registration; none on a kubelet that "
                "only watches plugins_registry/");
  }
  return Pass(absl::StrCat("registered through ", socket), {absl::StrCat(
      "the kubelet lists ", std::get<std::set<std::string>>(r).size(), " allocatable ",
      c.resource())});
}

// multi-resource on the node's kubelet: every --resource listed as
// allocatable, and a pod with one container per resource, one device each,
// runs with a device of each.
CellResult RealMultiResource(RealCell& c) {
  const std::vector<std::string>& resources = c.options().resources;
  if (resources.size() < 2) return NotApplicable("one --resource given");
  for (const std::string& resource : resources) {
    Registration r = c.Registered(resource == resources.front() ? "registers" : "multi-resource",
                                  "after it started", resource);
    if (auto* p = std::get_if<Problem>(&r)) return FromProblem("multi-resource", *p);
  }
  std::vector<std::pair<std::string, int>> containers;
  for (const std::string& resource : resources) containers.emplace_back(resource, 1);
  std::string pod;
  PodOutcome out = c.PodOf(containers, &pod);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("multi-resource", c.PodProblem("multi-resource", pod, out));
  }
  std::vector<std::string> got;
  for (size_t i = 0; i < resources.size(); ++i) {
    const std::vector<std::string> ids = c.DevicesOf(pod, resources[i])[absl::StrCat("c", i)];
    if (ids.size() != 1) {
      return Fail(absl::StrCat("pod ", pod, "'s container c", i, " is listed with ", ids.size(),
                               " devices of ", resources[i], " (", absl::StrJoin(ids, ","), ")"),
                  "(the kubelet's own account of the Allocates)",
                  "one device of each resource for the container asking for it",
                  "containers get the wrong resource's devices");
    }
    got.push_back(absl::StrCat(resources[i], " ", ids[0]));
  }
  return Pass(absl::StrCat(resources.size(), " resources registered; a pod using all of them "
                           "runs"),
              {absl::StrJoin(got, ", ")});
}

struct RealEntry {
  const char* name;
  CellResult (*run)(RealCell&);
};

const std::vector<RealEntry>& RealEntries() {
  static const auto* const kEntries = new std::vector<RealEntry>{
      {"registers", RealRegisters},     {"device-list", RealDeviceList},
      {"health", RealHealth},           {"allocate", RealAllocate},
      {"allocate-two", RealAllocateTwo}, {"kubelet-restart", RealKubeletRestart},
      {"plugin-restart", RealPluginRestart},
      {"allocate-restart", RealAllocateRestart},
      {"list-growth", RealListGrowth},
      {"plugin-watcher", RealPluginWatcher},
      {"multi-resource", RealMultiResource},
  };
  return *kEntries;
}

// Waits until no device of the resources is allocatable (the last cell's
// plugin is gone, and no other serves them). `previous`: the cell that ran
// last ("" before the first).
absl::Status WaitIdle(RealNode& node, const ConformOptions& o, const std::string& previous = "") {
  const absl::Time deadline = absl::Now() + o.timeout;
  for (const std::string& resource : o.resources) {
    while (true) {
      absl::StatusOr<std::set<std::string>> ids = node.Allocatable(resource);
      if (ids.ok() && ids->empty()) break;
      if (absl::Now() >= deadline) {
        if (!ids.ok()) return ids.status();
        if (!previous.empty()) {
          // The plugin under test stopped at the end of that cell, and
          // the kubelet did not let its devices go.
          return absl::FailedPreconditionError(absl::StrCat(
              "the kubelet of node ", node.name(), " still lists ", ids->size(), " allocatable ",
              resource, " (", absl::StrJoin(*ids, ","), ") after the plugin of cell ", previous,
              " stopped: it kept that plugin's endpoint. A 1.37 kubelet does so after it "
              "refuses a second Register at a socket it streams from (\"device plugin already "
              "connected\"): the plugin registered twice with one kubelet in ", previous));
        }
        return absl::FailedPreconditionError(absl::StrCat(
            "the kubelet of node ", node.name(), " lists ", ids->size(), " allocatable ",
            resource, " (", absl::StrJoin(*ids, ","),
            ") while dpconform's plugin is not running: another plugin serves it; stop it, or "
            "test under another --resource"));
      }
      absl::SleepFor(kPoll);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<std::string>> ParseRealKubelet(const std::string& name) {
  if (name == "real") return std::optional<std::string>("");
  if (!absl::StartsWith(name, "real:")) return std::optional<std::string>();
  const std::string release = name.substr(5);
  const size_t dot = release.find('.');
  int major = 0, minor = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(release.substr(0, dot), &major) ||
      !absl::SimpleAtoi(release.substr(dot + 1), &minor) || major != 1 || minor < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\": a real kubelet is \"real\" or \"real:1.MINOR\", e.g. real:1.37"));
  }
  return std::optional<std::string>(release);
}

const std::vector<std::string>& RealScenarios() {
  static const auto* const kNames = [] {
    auto* v = new std::vector<std::string>;
    for (const RealEntry& e : RealEntries()) v->push_back(e.name);
    return v;
  }();
  return *kNames;
}

absl::Status ValidateRealOptions(const ConformOptions& o) {
  if (o.real_kubelets.empty()) return absl::OkStatus();
  if (o.real.kubeconfig.empty()) {
    return absl::InvalidArgumentError(
        "--kubeconfig: a real kubelet needs the API server of its node (or set KUBECONFIG)");
  }
  if (o.real.pod_image.empty()) {
    return absl::InvalidArgumentError(
        "--pod_image: a real kubelet needs an image already on the node, with /bin/sh and "
        "sleep (busybox), for the pods it admits");
  }
  const bool dra = !o.dra_driver.empty();
  const std::vector<std::string>& can = dra ? RealDraScenarios() : RealScenarios();
  const char* const restart = dra ? "dra-kubelet-restart" : "kubelet-restart";
  bool any = o.scenarios.empty();
  for (const std::string& s : o.scenarios) {
    any = any || std::find(can.begin(), can.end(), s) != can.end();
    if (s == restart && o.real.restart_kubelet.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--restart_kubelet: ", restart, " on a real kubelet needs the command that restarts it"));
    }
  }
  if (!any) {
    return absl::InvalidArgumentError(
        absl::StrCat("--scenarios: none of them can be judged on a real kubelet; these can: ",
                     absl::StrJoin(can, ", ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RealNode>> ConnectRealNode(const ConformOptions& o) {
  absl::StatusOr<std::unique_ptr<RealNode>> node = RealNode::Connect(o);
  if (!node.ok()) {
    return absl::Status(node.status().code(),
                        absl::StrCat("the real node: ", node.status().message()));
  }
  for (const std::string& want : o.real_kubelets) {
    if (!want.empty() && (*node)->minor() != want) {
      return absl::FailedPreconditionError(absl::StrCat("--kubelets=real:", want, ": node ",
                                                        (*node)->name(), "'s kubelet is ",
                                                        (*node)->kubelet_version()));
    }
  }
  return node;
}

std::string RealRunId() {
  return absl::StrCat(
      absl::Hex((static_cast<uint64_t>(::getpid()) << 20 ^ absl::ToUnixMillis(absl::Now())) &
                0xffffff));
}

absl::StatusOr<std::vector<CellResult>> RunRealCells(const ConformOptions& o, const RealNode& n,
                                                     const std::vector<std::string>& all,
                                                     const std::string& needs_restart,
                                                     const PlayRealCell& play) {
  std::vector<const std::string*> scenarios;
  for (const std::string& e : all) {
    const bool selected =
        o.scenarios.empty()
            ? (e != needs_restart || !o.real.restart_kubelet.empty())
            : std::find(o.scenarios.begin(), o.scenarios.end(), e) != o.scenarios.end();
    if (selected) scenarios.push_back(&e);
  }
  std::vector<std::pair<const std::string*, const std::string*>> jobs;
  for (const std::string& k : o.real_kubelets) {
    for (const std::string* e : scenarios) jobs.emplace_back(&k, e);
  }
  ConformOptions serial = o;
  serial.jobs = 1;  // one kubelet
  auto name = [&](size_t i, CellResult* result) {
    result->kubelet = jobs[i].first->empty() ? "real" : absl::StrCat("real:", *jobs[i].first);
    result->generation = absl::StrCat("real kubelet ", n.kubelet_version());
    result->scenario = *jobs[i].second;
  };
  return RunCells(
      serial, jobs.size(),
      [&](size_t i, const std::string& dir) {
        const absl::Time start = absl::Now();
        CellResult result = play(*jobs[i].second, i, dir);
        name(i, &result);
        result.duration = absl::Now() - start;
        result.dir = dir;
        return result;
      },
      [&](size_t i, const std::string& why) {
        CellResult result = UnmadeResult(why);
        name(i, &result);
        return result;
      });
}

absl::StatusOr<std::vector<CellResult>> RunRealConformance(const ConformOptions& o) {
  if (o.real_kubelets.empty()) return std::vector<CellResult>{};
  if (absl::Status s = ValidateRealOptions(o); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<RealNode>> node = ConnectRealNode(o);
  if (!node.ok()) return node.status();
  RealNode& n = **node;
  if (absl::Status s = n.Allocatable(o.resources.front()).status(); !s.ok()) return s;
  if (absl::Status s = n.DeleteOurPods(o.timeout); !s.ok()) return s;
  if (absl::Status s = WaitIdle(n, o); !s.ok()) return s;
  const std::string run = RealRunId();
  std::string previous;
  return RunRealCells(
      o, n, RealScenarios(), "kubelet-restart",
      [&](const std::string& scenario, size_t i, const std::string& dir) {
        const std::string last = std::exchange(previous, scenario);
        if (absl::Status s = WaitIdle(n, o, last); !s.ok()) {
          return Fail(std::string(s.message()),
                      last.empty() ? "(not the plugin under test)"
                                   : absl::StrCat("(the plugin under test, in ", last, ")"),
                      "", "");
        }
        RealCell cell(o, n, dir, absl::StrCat("dpconform-", run, "-", i));
        if (absl::Status s = cell.StartPlugin(); !s.ok()) {
          return Fail(absl::StrCat("could not start the plugin command: ", s.message()), "", "",
                      "");
        }
        for (const RealEntry& e : RealEntries()) {
          if (scenario == e.name) return e.run(cell);
        }
        return Fail(absl::StrCat("no real-kubelet scenario ", scenario), "", "", "");
      });
}

}  // namespace dpproxy::conform
