// dpconform's DRA cells on a real node (--dra_driver with
// --kubelets=real:1.37). The driver's command runs against the node's own
// kubelet and API server, one cell at a time, and each check reads only
// what they show:
//   - registration: the kubelet's plugin manager lists the driver's
//     registration socket among the plugins it registered (its metric
//     plugin_manager_total_plugins, state actual_state_of_world, read
//     through the API server's node proxy), and that socket's GetInfo
//     names a DRAPlugin of --dra_driver;
//   - the node's ResourceSlices of the driver, from the API server;
//   - claims dpconform makes (a DeviceClass of the driver's devices and one
//     ResourceClaim a cell), pods the scheduler places on this node with
//     them, what the kubelet does with those pods, the claim's allocation,
//     and the devices the pod-resources socket lists for the containers.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/dra.h"
#include "tools/conform/real.h"
#include "tools/conform/real_node.h"

namespace dpproxy::conform {
namespace {

// How long upstream's kubelet-plugin helper waits after a change before it
// syncs its pools again: after a kubelet restart, which deletes the node's
// slices, a driver on it publishes again this long after it registered.
constexpr absl::Duration kHelperSyncDelay = absl::Seconds(30);
// The resource.k8s.io versions dpconform speaks, newest first.
constexpr const char* kResourceVersions[] = {"v1", "v1beta2", "v1beta1"};
// The CDI spec directory the container runtime reads ({cdi_dir}).
constexpr char kRuntimeCdiDir[] = "/var/run/cdi";
// How often the kubelet's plugin-manager reconciler registers and
// unregisters what its plugin watcher saw (pluginmanager's
// loopSleepDuration).
constexpr absl::Duration kReconcilerPeriod = absl::Seconds(1);

const char* const kUsersRegister =
    "the kubelet never calls the driver: pods with claims for its devices stay "
    "ContainerCreating (\"driver name ... not found in the list of registered DRA drivers\")";

// What every cell of a run shares: the resource.k8s.io version the API
// server serves and the DeviceClass dpconform made for the driver.
struct DraRun {
  std::string version;       // "v1"
  std::string device_class;  // "dpconform-<run>"
  std::string run;           // names of the run's pods and claims begin dpconform-<run>
  // The registration sockets the kubelet registered for the driver so far.
  std::set<std::string> sockets;
};

std::string ResourcePath(const DraRun& run, const std::string& rest) {
  return absl::StrCat("/apis/resource.k8s.io/", run.version, "/", rest);
}

using Pools = std::map<std::string, std::vector<std::string>>;

size_t DeviceCount(const Pools& pools) {
  size_t n = 0;
  for (const auto& [pool, devices] : pools) n += devices.size();
  return n;
}

// One DRA cell on the real node: the driver's process, and the claims and
// pods it made.
class RealDraCell {
 public:
  RealDraCell(const ConformOptions& o, RealNode& node, DraRun& run, std::string dir,
              std::string prefix)
      : o_(o), node_(node), run_(run), dir_(std::move(dir)), prefix_(std::move(prefix)) {}

  ~RealDraCell() {
    for (const std::string& p : pods_) node_.DeletePod(p, o_.timeout).IgnoreError();
    for (const std::string& c : claims_) {
      node_.api()
          .Delete(ResourcePath(run_, absl::StrCat("namespaces/", node_.namespace_name(),
                                                  "/resourceclaims/", c)))
          .IgnoreError();
    }
    StopDriver();
  }

  RealNode& node() { return node_; }
  const ConformOptions& options() const { return o_; }
  const std::string& driver() const { return o_.dra_driver; }
  std::string PluginsRegistry() const { return JoinPath(o_.real.kubelet_root, "plugins_registry"); }

  std::vector<std::pair<std::string, std::string>> Values() const {
    return DraValues(o_, o_.real.kubelet_root, o_.real.kubeconfig, node_.name(), kRuntimeCdiDir,
                     JoinPath(dir_, "w"), node_.minor());
  }

  absl::Status StartDriver() {
    if (absl::Status s = MakeDirs(JoinPath(dir_, "w")); !s.ok()) return s;
    driver_started_ = absl::Now();
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        StartCommand(o_, o_.plugin_command, Values(), JoinPath(dir_, "driver.log"));
    if (!child.ok()) return child.status();
    driver_ = *std::move(child);
    return absl::OkStatus();
  }
  void StopDriver() {
    if (driver_ == nullptr) return;
    ended_ = ChildProcess::DescribeExit(driver_->Stop(o_.stop_grace));
    driver_.reset();
  }
  std::optional<std::string> DriverEnded() {
    if (driver_ == nullptr) return ended_;
    if (driver_->Running()) return std::nullopt;
    ended_ = ChildProcess::DescribeExit(*driver_->Wait(absl::ZeroDuration()));
    return ended_;
  }
  std::string DriverOutputTail() const {
    absl::StatusOr<std::string> out = ReadFile(JoinPath(dir_, "driver.log"));
    if (!out.ok() || out->empty()) return "(no output)";
    return out->size() <= 400 ? *out : "..." + out->substr(out->size() - 400);
  }

  absl::Status RestartKubelet() {
    return RunCommandToEnd(o_, "restart_kubelet", o_.real.restart_kubelet, Values(),
                           JoinPath(dir_, "restart_kubelet.log"), kRestartLimit);
  }

  // Waits until the kubelet lists a registration socket whose GetInfo
  // names a DRAPlugin of the driver among the plugins it registered; its
  // path, or a Problem of `owner`'s. (A socket the kubelet registered for
  // an earlier process at the same path counts once the new process
  // answers on it: the kubelet registers it again on the file's new
  // creation, and the pods that follow show whether it did.)
  std::variant<std::string, Problem> Registered(const std::string& owner,
                                                const std::string& after) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + o_.timeout;
    std::string seen;
    while (true) {
      absl::StatusOr<std::string> metrics = node_.KubeletMetrics();
      std::set<std::string> registered;
      if (metrics.ok()) {
        registered = RegisteredSockets(*metrics);
        // The kubelet's reconciler, once a second, unregisters the old
        // process's registration and registers the new one, in the same
        // pass or the next: a stale path counts once seen unregistered, or
        // once its new file is two passes old.
        for (auto it = stale_.begin(); it != stale_.end();) {
          struct stat st;
          const bool replaced =
              ::stat(it->c_str(), &st) == 0 &&
              absl::Now() - absl::TimeFromTimespec(st.st_mtim) >= 2 * kReconcilerPeriod &&
              absl::TimeFromTimespec(st.st_mtim) > driver_started_;
          it = registered.count(*it) > 0 && !replaced ? std::next(it) : stale_.erase(it);
        }
        for (const std::string& s : stale_) registered.erase(s);
        seen.clear();
      } else {
        seen = absl::StrCat("dpconform could not read the kubelet's metrics (",
                            metrics.status().message(), ")");
      }
      std::vector<std::string> others;
      for (const std::string& socket : SocketsIn(PluginsRegistry())) {
        const RegistrationInfo info = GetInfo(socket);
        if (!info.answered) continue;
        const bool ours = info.type == "DRAPlugin" && info.name == driver();
        if (ours && registered.count(socket) > 0) {
          registered_after_ = absl::Now() - start;
          run_.sockets.insert(socket);
          return socket;
        }
        if (ours && metrics.ok()) {
          others.push_back(absl::StrCat(socket, " answers GetInfo with ", info.Describe(),
                                        ", but the kubelet has not registered it (it refused "
                                        "the versions or could not reach the endpoint)"));
        } else if (!ours && info.type == "DRAPlugin") {
          // Named in case it is the driver under another name.
          others.push_back(absl::StrCat(socket, " answers GetInfo with ", info.Describe(),
                                        registered.count(socket) > 0 ? " (registered)" : ""));
        }
      }
      if (!stale_.empty()) {
        others.push_back(absl::StrCat("the kubelet still holds its registration of ",
                                      absl::StrJoin(stale_, ", "),
                                      " for a process that is gone (its file was left behind)"));
      }
      if (!others.empty()) {
        seen = absl::StrCat(seen, seen.empty() ? "" : "; ", absl::StrJoin(others, "; "));
      }
      if (std::optional<std::string> ended = DriverEnded()) {
        return Problem{owner,
                       absl::StrCat("the driver ", *ended, " before the kubelet registered it"),
                       absl::StrCat(*ended, " ", after, "; its output ends: ", DriverOutputTail()),
                       Expected(), kUsersRegister};
      }
      if (absl::Now() >= deadline) {
        return Problem{
            owner,
            absl::StrCat("the kubelet registered no DRAPlugin named ", driver(), " within ",
                         absl::FormatDuration(o_.timeout), " ", after),
            absl::StrCat(seen.empty() ? absl::StrCat("no socket in ", PluginsRegistry(),
                                                     " answers GetInfo as a DRAPlugin named ",
                                                     driver())
                                      : seen,
                         "; its output ends: ", DriverOutputTail()),
            Expected(), kUsersRegister};
      }
      // Sooner while a stale registration may be replaced: the kubelet may
      // be without it for less than a second.
      absl::SleepFor(stale_.empty() ? kPoll : absl::Milliseconds(50));
    }
  }
  absl::Duration registered_after() const { return registered_after_; }

  // With no driver process running: the sockets the kubelet registered
  // for the driver before, and whether the driver removed their files.
  // Where it did, waits until the kubelet unregistered them. A file left
  // behind, with no process answering on it, keeps the kubelet's
  // registration of a process that is gone; a new process answering on
  // the same path then passes for registered before the kubelet has
  // registered it again (Registered waits for that).
  std::set<std::string> LeftBehind() {
    std::set<std::string> left;
    for (const std::string& s : run_.sockets) {
      if (::access(s.c_str(), F_OK) == 0 && !GetInfo(s).answered) left.insert(s);
    }
    const absl::Time deadline = absl::Now() + o_.timeout;
    while (absl::Now() < deadline) {
      absl::StatusOr<std::string> metrics = node_.KubeletMetrics();
      if (!metrics.ok()) break;
      const std::set<std::string> registered = RegisteredSockets(*metrics);
      bool waiting = false;
      for (const std::string& s : run_.sockets) {
        waiting = waiting || (left.count(s) == 0 && registered.count(s) > 0);
      }
      if (!waiting) break;
      absl::SleepFor(kPoll);
    }
    return left;
  }

  // Before the driver starts: the sockets an earlier process left behind
  // (LeftBehind), which the kubelet must be seen to unregister before a
  // registration there counts.
  void NoteLeftBehind() { stale_ = LeftBehind(); }

  // The driver's devices the node's ResourceSlices publish, by pool, once
  // at least one is published in whole pools within `wait`; else a
  // Problem of `owner`'s.
  std::variant<Pools, Problem> Published(const std::string& owner, absl::Duration wait) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + wait;
    std::string problem;
    while (true) {
      problem.clear();
      absl::StatusOr<Json> list = node_.api().Get(ResourcePath(
          run_, absl::StrCat("resourceslices?fieldSelector=spec.nodeName%3D", node_.name())));
      Pools pools;
      if (list.ok()) {
        std::vector<Json> items = (*list).value("items", Json::array());
        pools = PublishedPools(items, driver(), node_.name(), &problem);
      } else {
        problem = absl::StrCat("dpconform could not list the ResourceSlices: ",
                               list.status().message());
      }
      if (problem.empty() && DeviceCount(pools) > 0) {
        published_after_ = absl::Now() - start;
        return pools;
      }
      if (absl::Now() >= deadline) {
        return Problem{
            owner,
            absl::StrCat("no device of ", driver(), " published for node ", node_.name(),
                         " within ", absl::FormatDuration(wait)),
            problem.empty() ? absl::StrCat("published no ResourceSlice with a device for the "
                                           "node; its output ends: ",
                                           DriverOutputTail())
                            : problem,
            absl::StrCat("ResourceSlices of driver ", driver(), " with spec.nodeName ",
                         node_.name(), ", whole pools of at least one device"),
            "the scheduler finds no device for claims: pods with claims stay Pending"};
      }
      absl::SleepFor(kPoll);
    }
  }
  absl::Duration published_after() const { return published_after_; }

  // Makes a ResourceClaim of one device of the run's DeviceClass for each
  // of `requests` (their names).
  absl::StatusOr<std::string> MakeClaim(const std::vector<std::string>& requests) {
    const std::string name = absl::StrCat(prefix_, "-", made_++);
    Json list = Json::array();
    for (const std::string& r : requests) {
      if (run_.version == "v1beta1") {
        list.push_back({{"name", r}, {"deviceClassName", run_.device_class}, {"count", 1}});
      } else {
        list.push_back({{"name", r},
                        {"exactly", {{"deviceClassName", run_.device_class}, {"count", 1}}}});
      }
    }
    Json claim = {{"apiVersion", absl::StrCat("resource.k8s.io/", run_.version)},
                  {"kind", "ResourceClaim"},
                  {"metadata",
                   {{"name", name},
                    {"namespace", node_.namespace_name()},
                    {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}}}},
                  {"spec", {{"devices", {{"requests", list}}}}}};
    absl::StatusOr<Json> made = node_.api().Post(
        ResourcePath(run_, absl::StrCat("namespaces/", node_.namespace_name(), "/resourceclaims")),
        claim);
    if (!made.ok()) return made.status();
    claims_.push_back(name);
    return name;
  }

  absl::StatusOr<Json> GetClaim(const std::string& name) {
    return node_.api().Get(ResourcePath(
        run_, absl::StrCat("namespaces/", node_.namespace_name(), "/resourceclaims/", name)));
  }

  // A claim of `requests` (one device each) and a pod of one container per
  // entry of `containers` (the requests it is given), placed by the
  // scheduler on this node; the kubelet's verdict within `wait`.
  PodOutcome ClaimPod(const std::vector<std::string>& requests,
                      const std::vector<std::vector<std::string>>& containers,
                      absl::Duration wait, std::string* claim, std::string* pod) {
    PodOutcome out;
    absl::StatusOr<std::string> c = MakeClaim(requests);
    absl::Status s = c.status();
    if (c.ok()) {
      *claim = *c;
      *pod = absl::StrCat(prefix_, "-", made_++);
      s = node_.CreateClaimPod(*pod, *claim, containers);
      if (s.ok()) pods_.push_back(*pod);
    }
    if (!s.ok()) {
      out.kind = PodOutcome::kImage;  // the harness's problem, not the driver's
      out.reason = "not created";
      out.message = std::string(s.message());
      return out;
    }
    return node_.WaitPod(*pod, wait);
  }

  // A claim pod's outcome that is not kRunning, as `owner`'s Problem.
  Problem PodProblem(const std::string& owner, const std::string& pod, const PodOutcome& out) {
    return OutcomeProblem(
        owner, pod, out, o_.timeout,
        {"answered NodePrepareResources so that the kubelet failed the pod",
         "a prepared claim with every allocated device in the answer",
         "answered NodePrepareResources with CDI device names the container runtime could not "
         "resolve (no spec in its CDI directories, or a spec naming what does not exist)",
         absl::StrCat("CDI names whose specs are in the runtime's CDI directories (",
                      kRuntimeCdiDir, ")"),
         "(the test harness, not the driver: --pod_image must be on the node, and --kubeconfig "
         "may make pods and ResourceClaims in --namespace)",
         "published devices the claim was allocated from, but the kubelet did not get the "
         "claim prepared in time (a failed or slow NodePrepareResources), or the scheduler "
         "found no device",
         "NodePrepareResources answered well within its 45 s deadline",
         "pods with claims stay Pending or ContainerCreating"});
  }

  // Deletes `pod` and waits until the kubelet let it go: it unprepares the
  // pod's claims before the pod is removed. A Problem of `owner`'s if the
  // pod is still there after --timeout.
  std::optional<Problem> Unprepared(const std::string& owner, const std::string& pod,
                                    absl::Duration* took) {
    const absl::Time start = absl::Now();
    absl::Status s = node_.DeletePod(pod, o_.timeout);
    *took = absl::Now() - start;
    if (s.ok()) {
      pods_.erase(std::remove(pods_.begin(), pods_.end(), pod), pods_.end());
      return std::nullopt;
    }
    const std::string warning = node_.LatestWarning(pod);
    return Problem{owner,
                   absl::StrCat("pod ", pod, " was not gone ", absl::FormatDuration(o_.timeout),
                                " after its deletion",
                                warning.empty() ? "" : absl::StrCat(" (", warning, ")")),
                   "did not answer NodeUnprepareResources for the pod's claim (or answered it "
                   "with an error), so the kubelet keeps the pod",
                   "NodeUnprepareResources answered for a claim it prepared",
                   "deleted pods stay Terminating; their claims stay reserved"};
  }

  // The devices the claim was allocated ("pool/device" by request), or
  // why not.
  std::map<std::string, std::string> Allocation(const Json& claim, std::string* problem) {
    std::map<std::string, std::string> out;
    const Json results = claim.value("status", Json::object())
                             .value("allocation", Json::object())
                             .value("devices", Json::object())
                             .value("results", Json::array());
    for (const Json& r : results) {
      if (r.value("driver", "") != driver()) {
        *problem = absl::StrCat("the claim was allocated a device of driver ",
                                r.value("driver", ""), ", not ", driver());
      }
      out[r.value("request", "")] = absl::StrCat(r.value("pool", ""), "/", r.value("device", ""));
    }
    if (out.empty()) *problem = "the claim shows no allocation";
    return out;
  }

  // The claim's devices ("pool/device") the pod-resources socket lists for
  // each container of `pod`, with the CDI names in `cdi`.
  std::map<std::string, std::set<std::string>> ListedDevices(const std::string& pod,
                                                             const std::string& claim,
                                                             std::set<std::string>* cdi) {
    std::map<std::string, std::set<std::string>> out;
    absl::StatusOr<std::map<std::string, std::vector<RealNode::ClaimDevice>>> listed =
        node_.ContainerClaims(pod);
    if (!listed.ok()) return out;
    for (const auto& [container, devices] : *listed) {
      for (const RealNode::ClaimDevice& d : devices) {
        if (d.claim != claim || d.driver != driver()) continue;
        out[container].insert(absl::StrCat(d.pool, "/", d.device));
        cdi->insert(d.cdi.begin(), d.cdi.end());
      }
    }
    return out;
  }

  std::string ContainerId(const std::string& pod) { return node_.RunningContainerId(pod); }

 private:
  std::string Expected() const {
    return absl::StrCat("a socket in ", PluginsRegistry(),
                        " whose GetInfo says type DRAPlugin, name ", driver(),
                        ", and a DRA service this kubelet knows (v1.DRAPlugin from 1.34, "
                        "v1beta1.DRAPlugin)");
  }

  const ConformOptions& o_;
  RealNode& node_;
  DraRun& run_;
  const std::string dir_;
  const std::string prefix_;
  std::unique_ptr<ChildProcess> driver_;
  std::string ended_;
  std::vector<std::string> pods_;
  std::vector<std::string> claims_;
  int made_ = 0;
  std::set<std::string> stale_;  // NoteLeftBehind
  absl::Time driver_started_;
  absl::Duration registered_after_;
  absl::Duration published_after_;
};

// --- Scenarios ----------------------------------------------------------------------

// Registered and published: where every later scenario starts.
std::optional<CellResult> Ready(RealDraCell& c, const std::string& scenario, Pools* pools) {
  std::variant<std::string, Problem> r = c.Registered("dra-registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem(scenario, *p);
  std::variant<Pools, Problem> pub = c.Published("dra-publishes", c.options().timeout);
  if (auto* p = std::get_if<Problem>(&pub)) return FromProblem(scenario, *p);
  *pools = std::get<Pools>(pub);
  return std::nullopt;
}

CellResult RealDraRegisters(RealDraCell& c) {
  std::variant<std::string, Problem> r = c.Registered("dra-registers", "after it started");
  if (auto* p = std::get_if<Problem>(&r)) return FromProblem("dra-registers", *p);
  return Pass(absl::StrCat("the kubelet registered ", std::get<std::string>(r)),
              {absl::StrCat("registered ", Ms(c.registered_after()), " after the driver started")});
}

CellResult RealDraPublishes(RealDraCell& c) {
  Pools pools;
  if (auto r = Ready(c, "dra-publishes", &pools)) return *r;
  return Pass(absl::StrCat(DeviceCount(pools), " devices in ", pools.size(),
                           " pool(s) published for node ", c.node().name()),
              {absl::StrCat("published ", Ms(c.published_after()), " after it registered")});
}

// A claim of one device, a pod that uses it: the pod runs with the claim's
// device, and, deleted, lets the kubelet unprepare it.
CellResult RealDraPrepare(RealDraCell& c) {
  Pools pools;
  if (auto r = Ready(c, "dra-prepare", &pools)) return *r;
  std::string claim, pod;
  PodOutcome out = c.ClaimPod({"r0"}, {{}}, c.options().timeout, &claim, &pod);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("dra-prepare", c.PodProblem("dra-prepare", pod, out));
  }
  std::string problem;
  absl::StatusOr<Json> got = c.GetClaim(claim);
  std::map<std::string, std::string> allocated =
      got.ok() ? c.Allocation(*got, &problem) : std::map<std::string, std::string>{};
  if (!got.ok()) problem = std::string(got.status().message());
  if (!problem.empty()) {
    return Fail(absl::StrCat("pod ", pod, " runs, but its claim ", claim, ": ", problem),
                "(the API server's account of the claim)", "one device of the driver allocated",
                "claims show devices of another driver");
  }
  std::set<std::string> cdi;
  std::map<std::string, std::set<std::string>> listed = c.ListedDevices(pod, claim, &cdi);
  std::vector<std::string> notes = {absl::StrCat("pod ", pod, " runs with ", allocated["r0"])};
  if (!listed.empty() && listed["c0"] != std::set<std::string>{allocated["r0"]}) {
    return Fail(absl::StrCat("pod ", pod, " runs, but the kubelet lists ",
                             absl::StrJoin(listed["c0"], ","), " for it, not the allocated ",
                             allocated["r0"]),
                "answered NodePrepareResources with devices other than the claim's allocation",
                "every allocated device of the claim, and no other, in the answer",
                "monitoring agents see the wrong devices for the pod");
  }
  notes.push_back(listed.empty() ? "the kubelet's pod-resources socket lists no claim devices"
                                 : absl::StrCat("the kubelet lists it, with CDI devices ",
                                                cdi.empty() ? "(none)" : absl::StrJoin(cdi, ",")));
  absl::Duration took;
  if (std::optional<Problem> p = c.Unprepared("dra-prepare", pod, &took)) {
    return FromProblem("dra-prepare", *p);
  }
  notes.push_back(absl::StrCat("deleted and unprepared in ", Ms(took)));
  return Pass("a claim was prepared for a running pod and unprepared after it", notes);
}

// A claim of two requests, one device each, given to two containers.
CellResult RealDraSeveralRequests(RealDraCell& c) {
  Pools pools;
  if (auto r = Ready(c, "dra-several-requests", &pools)) return *r;
  if (DeviceCount(pools) < 2) {
    return NotApplicable("the driver publishes one device: a claim of two cannot be allocated");
  }
  std::string claim, pod;
  PodOutcome out =
      c.ClaimPod({"r0", "r1"}, {{"r0"}, {"r1"}}, c.options().timeout, &claim, &pod);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem("dra-several-requests", c.PodProblem("dra-several-requests", pod, out));
  }
  std::string problem;
  absl::StatusOr<Json> got = c.GetClaim(claim);
  std::map<std::string, std::string> allocated =
      got.ok() ? c.Allocation(*got, &problem) : std::map<std::string, std::string>{};
  if (problem.empty() && (allocated.size() != 2 || allocated["r0"] == allocated["r1"])) {
    problem = absl::StrCat("the claim's allocation is ",
                           got.ok() ? got->value("status", Json::object()).dump() : "");
  }
  if (!problem.empty()) {
    return Fail(absl::StrCat("pod ", pod, " runs, but its claim ", claim, ": ", problem),
                "(the API server's account of the claim)",
                "one device of the driver for each request", "");
  }
  std::set<std::string> cdi;
  std::map<std::string, std::set<std::string>> listed = c.ListedDevices(pod, claim, &cdi);
  const std::set<std::string> both = {allocated["r0"], allocated["r1"]};
  for (const auto& [container, devices] : listed) {
    if (devices != both) {
      return Fail(absl::StrCat("pod ", pod, "'s container ", container, " is listed with ",
                               absl::StrJoin(devices, ","), ", not the claim's ",
                               absl::StrJoin(both, ",")),
                  "answered NodePrepareResources for a claim of two requests without both "
                  "allocated devices",
                  "every allocated device of the claim in the answer",
                  "a container of the pod lacks a device its claim was allocated");
    }
  }
  std::vector<std::string> notes = {
      absl::StrCat("r0: ", allocated["r0"], ", r1: ", allocated["r1"], "; both containers run")};
  if (listed.empty()) notes.push_back("the kubelet's pod-resources socket lists no claim devices");
  absl::Duration took;
  if (std::optional<Problem> p = c.Unprepared("dra-several-requests", pod, &took)) {
    return FromProblem("dra-several-requests", *p);
  }
  notes.push_back(absl::StrCat("deleted and unprepared in ", Ms(took)));
  return Pass("a claim of two requests was prepared for a pod of two containers", notes);
}

// With a claim's pod running, `disrupt` happens (a Problem if it could
// not): the driver must be registered again, the pod keep its container, a
// new claim's pod run (within `pod_wait`), and the first pod, deleted, be
// unprepared.
CellResult SurvivesDisruption(RealDraCell& c, const std::string& scenario,
                              const std::string& what,
                              const std::function<std::optional<Problem>()>& disrupt,
                              absl::Duration pod_wait, const std::string& users_see) {
  Pools pools;
  if (auto r = Ready(c, scenario, &pools)) return *r;
  std::string claim, first;
  PodOutcome out = c.ClaimPod({"r0"}, {{}}, c.options().timeout, &claim, &first);
  if (out.kind != PodOutcome::kRunning) {
    return FromProblem(scenario, c.PodProblem("dra-prepare", first, out));
  }
  const std::string container = c.ContainerId(first);
  if (std::optional<Problem> p = disrupt()) return FromProblem(scenario, *p);
  const absl::Time back = absl::Now();
  std::variant<std::string, Problem> r = c.Registered(scenario, absl::StrCat("after ", what));
  if (auto* p = std::get_if<Problem>(&r)) {
    p->users_see = users_see;
    return FromProblem(scenario, *p);
  }
  std::vector<std::string> notes = {
      absl::StrCat("registered again ", Ms(absl::Now() - back), " after ", what)};
  if (c.ContainerId(first) != container || container.empty()) {
    return Fail(absl::StrCat("pod ", first, ", running before ", what, ", lost its container"),
                absl::StrCat("was ", notes[0]), "running pods keep their containers",
                "running pods killed by a restart");
  }
  std::string claim2, second;
  out = c.ClaimPod({"r0"}, {{}}, pod_wait, &claim2, &second);
  if (out.kind != PodOutcome::kRunning) {
    Problem p = c.PodProblem(scenario, second, out);
    p.summary = absl::StrCat(p.summary, ", after ", what);
    p.users_see = users_see;
    return FromProblem(scenario, p);
  }
  notes.push_back(absl::StrCat("a new claim's pod ran ", Ms(absl::Now() - back), " after ", what));
  absl::Duration took;
  if (std::optional<Problem> p = c.Unprepared(scenario, first, &took)) {
    p->summary = absl::StrCat(p->summary, " (prepared before ", what, ")");
    return FromProblem(scenario, *p);
  }
  notes.push_back(absl::StrCat("the pod from before, deleted, unprepared in ", Ms(took)));
  std::variant<Pools, Problem> pub = c.Published(scenario, c.options().timeout + kHelperSyncDelay);
  if (auto* p = std::get_if<Problem>(&pub)) return FromProblem(scenario, *p);
  return Pass(absl::StrCat("registered again after ", what, "; the running pod kept its "
                           "container, a new claim was prepared"),
              notes);
}

CellResult RealDraKubeletRestart(RealDraCell& c) {
  // The kubelet deletes the node's slices as it starts; a driver on
  // upstream's helper publishes again kHelperSyncDelay later, and the new
  // pod waits for them.
  return SurvivesDisruption(
      c, "dra-kubelet-restart", "the kubelet's restart",
      [&c]() -> std::optional<Problem> {
        absl::Status s = c.RestartKubelet();
        if (s.ok()) return std::nullopt;
        return Problem{"dra-kubelet-restart",
                       absl::StrCat("--restart_kubelet failed: ", s.message()),
                       "(the test harness, not the driver)", "", "nothing: fix the command"};
      },
      c.options().timeout + kHelperSyncDelay,
      "after a kubelet restart, pods with claims of the driver's devices stay ContainerCreating");
}

CellResult RealDraDriverRestart(RealDraCell& c) {
  return SurvivesDisruption(
      c, "dra-driver-restart", "the driver's restart",
      [&c]() -> std::optional<Problem> {
        c.StopDriver();
        if (std::set<std::string> left = c.LeftBehind(); !left.empty()) {
          return Problem{
              "dra-driver-restart",
              absl::StrCat("the driver, stopped with SIGTERM, left ", absl::StrJoin(left, ", "),
                           " behind, and the kubelet keeps its registration"),
              "did not remove its registration socket when it exited",
              "a driver that exits removes its registration socket, so that the kubelet "
              "unregisters it",
              "after a driver restart, the kubelet calls an endpoint that is gone until it "
              "notices the new process: pods with claims fail FailedPrepareDynamicResources"};
        }
        c.NoteLeftBehind();
        absl::Status s = c.StartDriver();
        if (s.ok()) return std::nullopt;
        return Problem{"dra-driver-restart",
                       absl::StrCat("dpconform could not start the driver again: ", s.message()),
                       "(the test harness, not the driver)", "", ""};
      },
      c.options().timeout,
      "after a driver update, pods with claims stay ContainerCreating or Terminating");
}

struct RealDraEntry {
  const char* name;
  CellResult (*run)(RealDraCell&);
};

const std::vector<RealDraEntry>& RealDraEntries() {
  static const auto* const kEntries = new std::vector<RealDraEntry>{
      {"dra-registers", RealDraRegisters},
      {"dra-publishes", RealDraPublishes},
      {"dra-prepare", RealDraPrepare},
      {"dra-several-requests", RealDraSeveralRequests},
      {"dra-kubelet-restart", RealDraKubeletRestart},
      {"dra-driver-restart", RealDraDriverRestart},
  };
  return *kEntries;
}

// The newest resource.k8s.io version the API server serves that dpconform
// speaks.
absl::StatusOr<std::string> ResourceVersion(RealNode& node) {
  absl::StatusOr<Json> group = node.api().Get("/apis/resource.k8s.io");
  if (!group.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the API server serves no resource.k8s.io (", group.status().message(),
        "): DRA is not enabled in this cluster"));
  }
  std::set<std::string> served;
  for (const Json& v : (*group).value("versions", Json::array())) {
    served.insert(v.value("version", ""));
  }
  for (const char* v : kResourceVersions) {
    if (served.count(v) > 0) return std::string(v);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the API server serves resource.k8s.io ", absl::StrJoin(served, ", "),
      "; dpconform speaks v1, v1beta2 and v1beta1"));
}

}  // namespace

const std::vector<std::string>& RealDraScenarios() {
  static const auto* const kNames = [] {
    auto* v = new std::vector<std::string>;
    for (const RealDraEntry& e : RealDraEntries()) v->push_back(e.name);
    return v;
  }();
  return *kNames;
}

absl::StatusOr<std::vector<CellResult>> RunRealDraConformance(const ConformOptions& o) {
  if (o.real_kubelets.empty()) return std::vector<CellResult>{};
  if (absl::Status s = ValidateRealOptions(o); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<RealNode>> node = ConnectRealNode(o);
  if (!node.ok()) return node.status();
  RealNode& n = **node;
  DraRun run;
  absl::StatusOr<std::string> version = ResourceVersion(n);
  if (!version.ok()) return version.status();
  run.version = *version;
  if (absl::StatusOr<std::string> m = n.KubeletMetrics(); !m.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kubelet's registrations are read from its metrics through the API server's node "
        "proxy, which --kubeconfig may not read: ", m.status().message()));
  }
  if (absl::Status s = n.DeleteOurPods(o.timeout); !s.ok()) return s;
  run.run = RealRunId();
  run.device_class = absl::StrCat("dpconform-", run.run);
  Json device_class = {
      {"apiVersion", absl::StrCat("resource.k8s.io/", run.version)},
      {"kind", "DeviceClass"},
      {"metadata",
       {{"name", run.device_class}, {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}}}},
      {"spec",
       {{"selectors",
         {{{"cel", {{"expression", absl::StrCat("device.driver == \"", o.dra_driver, "\"")}}}}}}}}};
  if (absl::StatusOr<Json> made = n.api().Post(ResourcePath(run, "deviceclasses"), device_class);
      !made.ok()) {
    return absl::Status(made.status().code(), absl::StrCat("the DeviceClass of the driver's "
                                                           "devices: ",
                                                           made.status().message()));
  }
  struct RemoveClass {
    RealNode& n;
    DraRun& run;
    ~RemoveClass() {
      n.api()
          .Delete(ResourcePath(run, absl::StrCat("deviceclasses/", run.device_class)))
          .IgnoreError();
    }
  } remove_class{n, run};

  return RunRealCells(
      o, n, RealDraScenarios(), "dra-kubelet-restart",
      [&](const std::string& scenario, size_t i, const std::string& dir) {
        RealDraCell cell(o, n, run, dir, absl::StrCat("dpconform-", run.run, "-", i));
        cell.NoteLeftBehind();
        if (absl::Status s = cell.StartDriver(); !s.ok()) {
          return Fail(absl::StrCat("could not start the driver command: ", s.message()), "", "",
                      "");
        }
        for (const RealDraEntry& e : RealDraEntries()) {
          if (scenario == e.name) return e.run(cell);
        }
        return Fail(absl::StrCat("no real-kubelet DRA scenario ", scenario), "", "", "");
      });
}

}  // namespace dpproxy::conform
