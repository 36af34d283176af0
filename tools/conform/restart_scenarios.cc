// dpconform grid scenarios: restarts of the kubelet and the plugin
// (grid_scenarios.h).
#include "tools/conform/grid_scenarios.h"


#include <errno.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <filesystem>
#include <functional>
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
#include "absl/time/clock.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/util/files.h"
#include "tools/conform/dra.h"
#include "tools/conform/real.h"


namespace dpproxy::conform::grid {

namespace {

// Starts the plugin again and waits for its devices in events from `from`
// on: registering again is `scenario`'s own step, so a failure to is its
// own (`amend` may add to what it says). nullopt: back, after `*took`.
std::optional<CellResult> StartAgain(Cell& c, const std::string& scenario, size_t from,
                                     absl::Duration* took,
                                     const std::function<void(Problem*)>& amend = nullptr) {
  if (absl::Status s = c.StartPlugin(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start the plugin again: ", s.message()), "",
                "", "");
  }
  const absl::Time start = absl::Now();
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    if (p->owner == "registers" || p->owner == "serves-first") p->owner = scenario;
    if (amend) amend(&*p);
    return FromProblem(scenario, *p);
  }
  *took = absl::Now() - start;
  return std::nullopt;
}

}  // namespace

CellResult KubeletRestart(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("kubelet-restart", *p);
  const size_t from = c.events().Size();
  const absl::Time start = absl::Now();
  if (absl::Status s = c.kubelet().Restart(c.version()); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not restart its kubelet: ", s.message()), "", "",
                "");
  }
  // A refused Register is not the end: a plugin whose fresh socket the
  // start-up cleanup removed may notice, serve again and register again
  // within the timeout.
  std::optional<Problem> p =
      c.Reach(Stage::kDevices, c.resource(), from, /*tolerate_rejections=*/true);
  if (!p.has_value()) {
    return Pass(absl::StrCat("registered again ", Ms(absl::Now() - start),
                             " after the kubelet restarted"));
  }
  std::optional<Json> again = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration(), from);
  const bool watcher = c.events()
                           .WaitForEvent("watcher_found", Json::object(), absl::ZeroDuration(),
                                         from)
                           .has_value();
  if (!again.has_value() && !watcher) {
    return Fail("never registered again after the kubelet restarted",
                absl::StrCat("kept running but did not call Register on the new kubelet.sock "
                             "within ",
                             absl::FormatDuration(c.options().timeout)),
                "a kubelet start removes every socket in device-plugins/ and forgets all "
                "plugins: each must notice (its socket gone, or kubelet.sock recreated) and "
                "register again",
                "after any kubelet restart (an upgrade, a config change) the resource's "
                "allocatable drops to 0 and stays there");
  }
  if (p->owner == "registers" || p->owner == "serves-first") {
    // The first registration worked: what failed is the one after the restart.
    return Fail(absl::StrCat("registered again but did not recover: ", p->summary),
                p->plugin_did, p->kubelet_expects, p->users_see);
  }
  return FromProblem("kubelet-restart", *p);
}

CellResult KubeletCrash(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("kubelet-crash", *p);
  const size_t from = c.events().Size();
  c.kubelet().Stop();
  // The stress: a second cleanup of device-plugins/ after the new
  // kubelet.sock appeared, as the plugin's Register arrives (a real kubelet
  // cleans up before it listens).
  c.kubelet().SetLateWipe(c.options().timeout);
  const absl::Time start = absl::Now();
  if (absl::Status s = c.kubelet().Start(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start its kubelet again: ", s.message()), "",
                "", "");
  }
  std::optional<Problem> p =
      c.Reach(Stage::kDevices, c.resource(), from, /*tolerate_rejections=*/true);
  if (!p.has_value()) {
    return Pass(absl::StrCat("back ", Ms(absl::Now() - start),
                             " after the kubelet came back, through a late cleanup"));
  }
  std::optional<Json> again = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, absl::ZeroDuration(), from);
  if (!again.has_value()) {
    CellResult r;
    r.outcome = Outcome::kBlocked;
    r.blocked_by = "kubelet-restart";
    r.summary = "not reached: the plugin never registered again (kubelet-restart's check)";
    return r;
  }
  std::optional<Json> wiped = c.events().WaitForEvent(
      "directory_cleaned", {{"late", true}}, absl::ZeroDuration(), from);
  return Fail(
      "lost its socket to the kubelet's late cleanup and did not serve it again",
      absl::StrCat("registered with the new kubelet, but its socket was removed by the "
                   "start-up cleanup",
                   wiped.has_value() ? absl::StrCat(" (", (*wiped)["removed"].dump(), ")") : "",
                   " and it neither served it again nor registered again"),
      "(a stress, not a known kubelet behaviour) a plugin that watches its own socket "
      "serves it again and registers again whenever it is removed",
      "only if something removes the socket after the kubelet listens: the resource then "
      "stays at allocatable 0 until the plugin restarts");
}

CellResult PluginRestart(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("plugin-restart", *p);
  const size_t devices = c.Devices(c.resource()).size();
  if (devices < 2) {
    return NotApplicable(absl::StrCat("the plugin lists ", devices,
                                      " device; the running pod and a new pod after the "
                                      "restart need two"));
  }
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "running", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("plugin-restart", problem);
  const std::string held = r->allocations(0).device_ids(0);
  const size_t before_stop = c.events().Size();
  const std::string ended = c.StopPlugin();
  // A restarted pod takes longer to come back than the kubelet takes to see
  // the old stream end; starting at once could race that (and 1.25-1.36
  // would then tear the new registration down by name).
  c.events().WaitForEvent("plugin_lost", {{"resource", c.resource()}}, c.options().timeout,
                          before_stop);
  absl::Duration took;
  if (auto f = StartAgain(c, "plugin-restart", c.events().Size(), &took)) return *f;
  std::vector<std::string> notes = {absl::StrCat("stopped with SIGTERM: ", ended),
                                    absl::StrCat("registered again in ", Ms(took))};
  bool listed = false;
  std::vector<std::string> ids;
  for (const sim::DeviceState& d : c.Devices(c.resource())) {
    ids.push_back(d.id());
    listed |= d.id() == held;
  }
  if (!listed) {
    ids.resize(std::min<size_t>(ids.size(), 4));
    return Fail(
        absl::StrCat("the running pod's device ", held, " is gone after the plugin restarted"),
        absl::StrCat("listed [", absl::StrJoin(ids, ", "),
                     ids.size() == 4 ? ", ...]" : "]", " after its restart; before it, ", held,
                     " was listed and allocated to a running pod"),
        "a device keeps its ID while it exists: the kubelet's checkpoint holds the IDs of "
        "running pods' devices and never gives them out again",
        "the kubelet counts a device that no longer exists as in use and hands the same "
        "hardware to another pod; after a kubelet restart the running pod fails "
        "re-admission");
  }
  sim::ReadmitResponse re = c.kubelet().Readmit();
  for (const sim::ReadmitResult& res : re.results()) {
    if (!res.admitted()) {
      return Fail(absl::StrCat("the running pod was not re-admitted: ", res.message()), "", "",
                  "");
    }
  }
  if (Problem p2; !Admit(c, "after", {{c.resource(), 1}}, &p2).ok()) {
    return FromProblem("plugin-restart", p2);
  }
  return Pass(absl::StrCat("the running pod keeps ", held, "; new pods are admitted"), notes);
}

// A plugin that dies with an Allocate unanswered (a crash, the OOM killer,
// its pod deleted with no grace) and is started again. The kubelet fails
// that pod (UnexpectedAdmissionError) and gives back the devices it had
// picked: when Allocate fails, its device manager resets allocatedDevices
// to what its pods hold (devicemanager/manager.go,
// allocateContainerResources). The plugin must register again, although
// the killed process left its socket file behind, and answer an Allocate
// for the same devices, holding nothing over from the call it never
// answered.
CellResult AllocateRestart(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("allocate-restart", *p);
  // The plugin is frozen (SIGSTOP) just before the kubelet sends it the
  // Allocate, then killed with the call unanswered: the same moment in
  // every run, whatever the plugin's speed.
  absl::Mutex mu;
  std::vector<std::string> in_flight;  // the frozen call's devices
  bool admission_ended = false;
  bool frozen_in_time = false;  // every thread stopped before the call went out
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> admitted;
  c.kubelet().SetBeforeAllocate(
      [&](const std::string& resource, const std::vector<std::vector<std::string>>& ids) {
        absl::MutexLock lock(&mu);
        if (resource != c.resource() || !in_flight.empty()) return;
        for (const auto& container : ids) {
          in_flight.insert(in_flight.end(), container.begin(), container.end());
        }
        frozen_in_time = c.FreezePlugin();
      });
  std::thread admit([&] {
    Problem p;
    absl::StatusOr<sim::AllocateResponse> r = Admit(c, "killed-in-allocate", {{c.resource(), 1}}, &p);
    absl::MutexLock lock(&mu);
    problem = p;
    admitted = std::move(r);
    admission_ended = true;
  });
  bool frozen = false;
  {
    absl::MutexLock lock(&mu);
    auto sent = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return !in_flight.empty() || admission_ended;
    };
    mu.AwaitWithTimeout(absl::Condition(&sent), c.options().timeout);
    frozen = !in_flight.empty();
  }
  const size_t before_kill = c.events().Size();
  // Killing the plugin ends the kubelet's call (the connection closes).
  const std::string ended = frozen ? c.KillPlugin() : std::string();
  admit.join();
  c.kubelet().SetBeforeAllocate(nullptr);
  if (!frozen) {
    if (!admitted.ok()) return FromProblem("allocate-restart", problem);
    return Fail("the kubelet admitted the pod without an Allocate reaching the plugin", "", "",
                "");
  }
  if (!frozen_in_time) {
    return Fail(absl::StrCat("dpconform could not freeze the plugin within ",
                             absl::FormatDuration(c.options().timeout),
                             " (SIGSTOP to its process group)"),
                "", "", "");
  }
  if (admitted.ok()) {
    return Fail("the pod was admitted although its Allocate was never answered", "", "", "");
  }
  const std::string device = in_flight.front();
  std::vector<std::string> notes = {
      absl::StrCat("killed (", ended, ") with the Allocate for ", device,
                   " unanswered; the kubelet failed that pod: ", admitted.status().message())};
  c.events().WaitForEvent("plugin_lost", {{"resource", c.resource()}}, c.options().timeout,
                          before_kill);
  // The socket the killed process served, if it is still there.
  std::string left;
  if (std::optional<Json> reg = c.events().WaitForEvent(
          "register_request", {{"resource", c.resource()}}, absl::ZeroDuration());
      reg.has_value()) {
    const std::string path = JoinPath(c.kubelet().device_plugin_dir(), reg->value("endpoint", ""));
    struct stat st;
    if (!reg->value("endpoint", "").empty() && ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      left = path;
      notes.push_back(absl::StrCat("the killed process left its socket ", path));
    }
  }
  absl::Duration took;
  if (auto f = StartAgain(c, "allocate-restart", c.events().Size(), &took, [&](Problem* p) {
        if (left.empty() || p->owner != "allocate-restart") return;
        p->kubelet_expects = absl::StrCat(
            p->kubelet_expects, p->kubelet_expects.empty() ? "" : "; ",
            "a plugin started after a SIGKILL finds its old socket file (", left,
            ") and removes it before it listens");
      })) {
    return *f;
  }
  notes.push_back(absl::StrCat("registered again in ", Ms(took)));
  Problem again;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "after-restart", {{c.resource(), 1}}, &again);
  if (!r.ok()) {
    // A malformed answer is the allocate cell's failure; an error status
    // from the restarted plugin is this one's.
    if (again.owner == "allocate" && absl::StrContains(r.status().message(), "rpc error")) {
      again.owner = "allocate-restart";
      again.plugin_did = absl::StrCat(
          "refused or failed the Allocate after its restart (the kubelet asked for ", device,
          ", the device of the call the killed process never answered)");
      again.kubelet_expects =
          "an Allocate that was never answered allocated nothing: the kubelet gave the device "
          "back, and the plugin answers for it again";
    }
    return FromProblem("allocate-restart", again);
  }
  const std::string got = r->allocations(0).device_ids(0);
  if (got != device) {
    notes.push_back(absl::StrCat("the kubelet chose ", got, " rather than ", device,
                                 " (the plugin's preferred allocation)"));
  }
  return Pass(absl::StrCat("registered again after a SIGKILL during Allocate; ", got,
                           " allocated to a new pod"),
              notes);
}

// A kubelet that starts without its checkpoint (deleted, corrupt, or
// written by a release it cannot read: the kubelet's checkpoint/checkpoint.go
// across releases) forgets
// which devices its running pods hold and offers them to new pods
// (kubernetes#102880, #116125), while it re-admits the running pods
// against allocatable. The cell passes when the running pod survives
// re-admission, the free devices go to new pods, and the device it holds
// goes to none.
CellResult CheckpointLost(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("checkpoint-lost", *p);
  Problem problem;
  absl::StatusOr<sim::AllocateResponse> r = Admit(c, "running", {{c.resource(), 1}}, &problem);
  if (!r.ok()) return FromProblem("checkpoint-lost", problem);
  const std::string held = r->allocations(0).device_ids(0);
  c.kubelet().Stop();
  if (::unlink(c.kubelet().checkpoint_path().c_str()) != 0) {
    return Fail(absl::StrCat("dpconform could not remove the kubelet's checkpoint: ",
                             ErrnoText(errno)),
                "", "", "");
  }
  const size_t from = c.events().Size();
  if (absl::Status s = c.kubelet().Start(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start its kubelet again: ", s.message()), "",
                "", "");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    CellResult blocked;
    blocked.outcome = Outcome::kBlocked;
    blocked.blocked_by = "kubelet-restart";
    blocked.summary = absl::StrCat("not reached: after the kubelet restarted, ", p->summary);
    return blocked;
  }
  // The kubelet re-admits its running pods about a second after it starts,
  // against allocatable: a held device reported Unhealthy then gets the
  // running pod denied and killed (observed on a 1.36.2 node).
  if (!c.kubelet().WaitForPodsSynced(c.options().timeout)) {
    return Fail("the kubelet did not re-admit its pods within the timeout", "", "", "");
  }
  const sim::State synced = c.kubelet().GetState();
  for (const sim::PodState& p : synced.pods()) {
    if (p.name() != "running" || p.phase() == "Running") continue;
    return Fail(absl::StrCat("the running pod was denied when the kubelet re-admitted it: ",
                             p.message()),
                absl::StrCat("reported ", held,
                             " Unhealthy (or no devices) while the kubelet re-admitted its "
                             "running pods"),
                "a restarted kubelet re-admits every running pod against allocatable "
                "(healthy devices); a held device must keep its health",
                "running pods killed after a kubelet restart");
  }
  int healthy = 0;
  for (const sim::DeviceState& d : c.Devices(c.resource())) healthy += d.health() == "Healthy";
  const std::string handed_out_twice =
      "nothing: a kubelet that cannot read its checkpoint (deleted, corrupt, or from a release "
      "it cannot read) forgets its running pods' devices and offers them again; only the "
      "plugin side can keep new pods off them (steer GetPreferredAllocation away, refuse an "
      "Allocate of a held device), as dpproxy with a state directory does";
  const std::string users = "two pods on one device after a kubelet restart or upgrade: wrong "
                            "results, out-of-memory errors, or data of one pod seen by another";
  auto gets_held = [&](const sim::AllocateResponse& r) {
    for (const auto& a : r.allocations()) {
      for (const std::string& id : a.device_ids()) {
        if (id == held) return true;
      }
    }
    return false;
  };
  // Every other device can go to new pods, and none of them is the held one.
  if (healthy > 1) {
    absl::StatusOr<sim::AllocateResponse> next =
        Admit(c, "next", {{c.resource(), healthy - 1}}, &problem);
    if (!next.ok()) {
      return Fail(absl::StrCat("a new pod asking for the ", healthy - 1,
                               " free device(s) was refused: ", problem.summary),
                  problem.plugin_did, "the free devices go to new pods",
                  "pods failing on a node with room");
    }
    if (gets_held(*next)) {
      return Fail(absl::StrCat("device ", held, " was handed to a new pod while a running pod "
                               "holds it (", healthy - 1, " other device(s) were free)"),
                  absl::StrCat("left ", held, " to the kubelet's choice"), handed_out_twice,
                  users);
    }
  }
  // One more: only the held device is left.
  absl::StatusOr<sim::AllocateResponse> more = Admit(c, "more", {{c.resource(), 1}}, &problem);
  if (more.ok() && gets_held(*more)) {
    return Fail(absl::StrCat("device ", held, " was handed to a new pod while a running pod "
                             "holds it"),
                absl::StrCat("answered an Allocate of ", held,
                             " after the kubelet restarted without its checkpoint"),
                handed_out_twice, users);
  }
  return Pass(absl::StrCat("the running pod kept ", held, " and its place; ",
                           healthy > 1 ? "the other devices went to new pods, " : "",
                           "no new pod got ", held));
}

// A DaemonSet rolling update with maxSurge: the new instance registers
// while the old one runs, then the old one exits. 1.9-1.24 stop the
// replaced client at once, so its end changes nothing; 1.25-1.36 keep it and,
// when its stream ends, disconnect whatever client holds the resource name
// (kubernetes#121994): allocatable drops to 0. A
// kubelet that tracks clients per socket (#135437, --per_socket_clients)
// disconnects only a client at the ended one's socket: unique socket names
// per instance keep the registration.
CellResult RollingUpdate(Cell& c) {
  if (auto p = c.Reach(Stage::kDevices, c.resource())) return FromProblem("rolling-update", *p);
  const size_t from = c.events().Size();
  if (absl::Status s = c.StartSecondInstance(); !s.ok()) {
    return Fail(absl::StrCat("dpconform could not start a second instance: ", s.message()), "",
                "", "");
  }
  std::optional<Json> second = c.events().WaitForEvent(
      "register_request", {{"resource", c.resource()}}, c.options().timeout, from);
  if (!second.has_value()) {
    return Fail("the second instance never registered while the first ran",
                absl::StrCat("started a second instance ({instance}=2) that did not call "
                             "Register within ",
                             absl::FormatDuration(c.options().timeout)),
                "a new instance of a DaemonSet registers while the old one still runs "
                "(maxSurge) and takes the resource over",
                "a rolling update of the plugin leaves the old instance serving until it is "
                "killed, then nothing");
  }
  if (auto p = c.Reach(Stage::kDevices, c.resource(), from)) {
    return FromProblem("rolling-update", *p);
  }
  std::optional<Json> first =
      c.events().WaitForEvent("register_request", {{"resource", c.resource()}},
                              absl::ZeroDuration(), 0);
  const std::string old_endpoint = first.has_value() ? (*first)["endpoint"].get<std::string>()
                                                     : std::string();
  const std::string new_endpoint = (*second)["endpoint"].get<std::string>();
  const size_t before_stop = c.events().Size();
  const std::string ended = c.ReplaceByTheSecondInstance();
  // The kubelet's handling of the old client's end (at the replacement in
  // 1.9-1.24, when the old instance exits from 1.25): what it did decides.
  // With one socket name for both, only an end after the old instance
  // stopped is the old one's.
  c.events().WaitForEvent(
      "replaced_client_ended",
      {{"resource", c.resource()},
       {"endpoint", JoinPath(c.kubelet().device_plugin_dir(), old_endpoint)}},
      c.options().timeout, old_endpoint == new_endpoint ? before_stop : from);
  const std::vector<std::string> notes = {absl::StrCat("old instance stopped: ", ended),
                                          absl::StrCat("sockets: ", old_endpoint, " then ",
                                                       new_endpoint)};
  // Registered, connected and with devices, now or (after a plugin's own
  // recovery, e.g. re-registering when the old instance's exit removed a
  // shared socket file) within the timeout.
  auto kept_now = [&] {
    const sim::State state = c.kubelet().GetState();
    for (const sim::ResourceState& r : state.resources()) {
      if (r.name() == c.resource()) return r.connected() && r.allocatable() > 0;
    }
    return false;
  };
  const absl::Time deadline = absl::Now() + c.options().timeout;
  bool kept = false;
  for (;;) {
    const size_t seen = c.events().Size();  // before the look: no update missed
    kept = kept_now();
    if (kept || absl::Now() >= deadline) break;
    c.events().WaitForEvent("devices", {{"resource", c.resource()}}, deadline - absl::Now(),
                            seen);
  }
  if (kept) {
    return Pass("the new instance kept the resource after the old one exited", notes);
  }
  const bool shared = old_endpoint == new_endpoint;
  const bool per_socket = c.version().per_socket_clients;
  return Fail(
      absl::StrCat("the resource was disconnected when the old instance exited, and not back "
                   "within ",
                   absl::FormatDuration(c.options().timeout)),
      absl::StrCat("a second instance registered ", new_endpoint, " while the first (",
                   old_endpoint, ") ran; then the first exited",
                   shared ? ": both used the same socket name" : ""),
      per_socket
          ? "a kubelet that tracks clients per socket (kubernetes#135437) disconnects the "
            "client at the ended instance's socket: each instance needs a socket name of its "
            "own (the pod's name, or {instance})"
          : "1.25-1.36 disconnect whatever client holds the resource name when a replaced "
            "client's stream ends (kubernetes#121994): no plugin alone survives a maxSurge "
            "rolling update there; roll with maxUnavailable (old instance first), or run "
            "behind dpproxy, whose own registration does not change",
      "allocatable drops to 0 after a rolling update of the plugin's DaemonSet, until the "
      "plugin restarts; pods needing the resource stay Pending");
}

}  // namespace dpproxy::conform::grid
