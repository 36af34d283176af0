#include "tools/conform/dra.h"
#include "tools/conform/real.h"

#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proxy/kube/kube_client.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/scheduler.h"
#include "tools/kubelet_sim/cdi_registry.h"

namespace dpproxy::conform {
namespace {

using Json = nlohmann::json;

constexpr char kNode[] = "node-1";
constexpr char kToken[] = "dpconform";

CellResult Result(Outcome outcome, std::string summary) {
  CellResult r;
  r.outcome = outcome;
  r.summary = std::move(summary);
  return r;
}

CellResult Failed(std::string summary, std::string did, std::string expects, std::string users) {
  CellResult r = Result(Outcome::kFail, std::move(summary));
  r.plugin_did = std::move(did);
  r.kubelet_expects = std::move(expects);
  r.users_see = std::move(users);
  return r;
}

// How long upstream's kubelet-plugin helper waits after a change of its
// slices before it syncs the pool again (see KubeletRestart).
constexpr absl::Duration kHelperSyncDelay = absl::Seconds(30);

// The resource.k8s.io versions a cluster of this release serves, newest
// first, as it is set up to use DRA: 1.32 v1beta1 and 1.33 v1beta2 as well
// (betas switched on with --runtime-config), v1 from 1.34, where the betas
// are off by default.
std::vector<std::string> ResourceApiVersions(const sim::KubeletVersion& k) {
  if (k.minor <= 32) return {"v1beta1"};
  if (k.minor == 33) return {"v1beta2", "v1beta1"};
  return {"v1"};
}

// A check failed on the way to another scenario's: that cell is blocked.
CellResult Blocked(const std::string& by, const CellResult& why) {
  CellResult r = Result(Outcome::kBlocked, why.summary);
  r.blocked_by = by;
  return r;
}

// One DRA cell: an API server, a kubelet of one release with the runtime's
// CDI resolution, and the driver's command.
class DraCell {
 public:
  DraCell(const ConformOptions& o, const sim::KubeletVersion& k, std::string dir)
      : o_(o),
        version_(k),
        dir_(std::move(dir)),
        api_(sim::ApiServerSim::Options{CertFile(), KeyFile(), kToken, ResourceApiVersions(k)}) {}
  ~DraCell() {
    StopDriver();
    if (kubelet_) kubelet_->Stop();
    api_.Stop();
  }

  absl::Status Start() {
    // HTTPS, as a real API server: client-go (every Go driver) sends a
    // kubeconfig's credentials only over TLS.
    if (absl::Status s = MakeServingCertificate(); !s.ok()) return s;
    if (absl::Status s = api_.Start(); !s.ok()) return s;
    // The node, as its kubelet registered it: a driver built on upstream's
    // kubelet-plugin helper reads it (its slices name the node as owner).
    api_.PutNode(kNode, absl::StrCat("v", version_.name, ".0"));
    kubeconfig_ = JoinPath(dir_, "kubeconfig");
    if (absl::Status s = WriteFileAtomic(
            kubeconfig_,
            absl::StrCat("current-context: node\n"
                         "contexts: [{name: node, context: {cluster: sim, user: driver}}]\n"
                         "clusters: [{name: sim, cluster: {server: \"",
                         api_.url(), "\", certificate-authority: \"", CertFile(),
                         "\"}}]\nusers: [{name: driver, user: {token: ", kToken, "}}]\n"));
        !s.ok()) {
      return s;
    }
    KubeConfig kc;
    kc.server = api_.url();
    kc.token = kToken;
    kc.ca_file = CertFile();
    absl::StatusOr<std::unique_ptr<KubeClient>> client = KubeClient::Create(kc);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    sim::KubeletSimOptions so;
    so.root_dir = JoinPath(dir_, "k");
    so.kubelet = version_;
    so.personality = version_.personality;
    so.dial_timeout = o_.dial_timeout;
    so.cdi_dirs = {CdiDir()};
    so.kubeconfig = kubeconfig_;
    so.node_name = kNode;
    kubelet_ = std::make_unique<sim::KubeletSim>(so);
    if (absl::Status s = MakeDirs(CdiDir()); !s.ok()) return s;
    if (absl::Status s = MakeDirs(JoinPath(dir_, "work")); !s.ok()) return s;
    if (absl::Status s = kubelet_->Start(); !s.ok()) return s;
    return StartDriver();
  }

  // The first wait for the registration takes at most `d` (conform.h,
  // RunGatedCells); later ones the timeout.
  void LimitFirstWait(absl::Duration d) { first_wait_ = d; }
  absl::Duration TakeWait() {
    const absl::Duration d = first_wait_.value_or(o_.timeout);
    first_wait_.reset();
    return d;
  }

  absl::Status StartDriver() {
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        StartCommand(o_, o_.plugin_command, Values(), JoinPath(dir_, "driver.log"));
    if (!child.ok()) return child.status();
    driver_ = *std::move(child);
    return absl::OkStatus();
  }
  void StopDriver() {
    if (driver_) driver_->Stop(o_.stop_grace);
    driver_.reset();
  }

  std::vector<std::pair<std::string, std::string>> Values() const {
    return DraValues(o_, JoinPath(dir_, "k"), kubeconfig_, kNode, CdiDir(), JoinPath(dir_, "work"),
                     version_.name);
  }

  std::string CdiDir() const { return JoinPath(dir_, "cdi"); }
  std::string PluginsRegistry() const { return JoinPath(dir_, "k/plugins_registry"); }
  // The API server's certificate for 127.0.0.1, its own CA (the
  // kubeconfig's certificate-authority), and its key.
  std::string CertFile() const { return JoinPath(dir_, "apiserver.crt"); }
  std::string KeyFile() const { return JoinPath(dir_, "apiserver.key"); }

  absl::Status MakeServingCertificate() const {
    ChildSpec spec;
    spec.argv = {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                 "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                 "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                 KeyFile(), "-out", CertFile()};
    spec.output_path = JoinPath(dir_, "openssl.log");
    absl::StatusOr<std::unique_ptr<ChildProcess>> p = ChildProcess::Start(spec);
    if (!p.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the API server's certificate: cannot run openssl (", p.status().message(), ")"));
    }
    std::optional<int> status = (*p)->Wait(absl::Seconds(30));
    if (!status.has_value() || *status != 0) {
      absl::StatusOr<std::string> out = ReadFile(spec.output_path);
      return absl::FailedPreconditionError(absl::StrCat(
          "the API server's certificate: openssl failed: ", out.ok() ? *out : ""));
    }
    return absl::OkStatus();
  }
  sim::KubeletSim& kubelet() { return *kubelet_; }
  sim::ApiServerSim& api() { return api_; }
  KubeClient* client() { return client_.get(); }
  const ConformOptions& options() const { return o_; }
  const sim::KubeletVersion& version() const { return version_; }

  // The end of the driver's output, for failure messages.
  std::string DriverOutputTail() const {
    absl::StatusOr<std::string> out = ReadFile(JoinPath(dir_, "driver.log"));
    if (!out.ok() || out->empty()) return "(no output)";
    return out->size() <= 400 ? *out : "..." + out->substr(out->size() - 400);
  }

  // The driver's devices on the node, by pool (PublishedPools).
  std::map<std::string, std::vector<std::string>> Pools(std::string* problem) {
    std::vector<Json> slices;
    for (auto& [name, s] : api_.Slices()) slices.push_back(std::move(s));
    return PublishedPools(slices, o_.dra_driver, kNode, problem);
  }

 private:
  const ConformOptions& o_;
  const sim::KubeletVersion version_;
  const std::string dir_;
  sim::ApiServerSim api_;
  std::string kubeconfig_;
  std::unique_ptr<KubeClient> client_;
  std::unique_ptr<sim::KubeletSim> kubelet_;
  std::unique_ptr<ChildProcess> driver_;
  std::optional<absl::Duration> first_wait_;
};

const char* const kUsersRegister =
    "the kubelet never calls the driver: pods with claims for its devices stay "
    "ContainerCreating (\"driver name ... not found in the list of registered DRA drivers\")";

// Registered through the plugin watcher, on a service this release knows.
std::optional<CellResult> Registered(DraCell& c, size_t from = 0) {
  const std::string driver = c.options().dra_driver;
  const absl::Duration wait = c.TakeWait();
  if (c.kubelet().events().WaitForEvent("dra_driver_registered", {{"driver", driver}}, wait,
                                        from)) {
    return std::nullopt;
  }
  std::optional<Json> rejected = c.kubelet().events().WaitForEvent(
      "registration_rejected", {}, absl::ZeroDuration(), from);
  const std::string did =
      rejected.has_value()
          ? absl::StrCat("registered and was refused: ", rejected->value("error", rejected->dump()))
          : absl::StrCat("no DRAPlugin named ", driver, " appeared in ",
                         c.PluginsRegistry(), " within ", absl::FormatDuration(wait),
                         "; its output ends: ", c.DriverOutputTail());
  return Failed("the driver did not register with the kubelet", did,
                absl::StrCat("kubelet ", c.version().name,
                             " registers a socket in plugins_registry/ whose GetInfo says type "
                             "DRAPlugin, name ",
                             driver, ", and lists a service it knows (",
                             c.version().minor >= 34 ? "v1.DRAPlugin or v1beta1.DRAPlugin"
                                                     : "v1beta1.DRAPlugin",
                             ")"),
                kUsersRegister);
}

// Waits until `pred` holds, checking again after each request the API
// server answers (slices change only through requests).
bool WaitForApi(DraCell& c, const std::function<bool()>& pred, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    const size_t from = c.api().events().Size();
    if (pred()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    c.api().events().WaitForEvent("request", {}, deadline - now, from);
  }
}

// At least one device published for the node, in whole pools, within
// `wait` (default --timeout).
std::optional<CellResult> Published(DraCell& c, std::map<std::string, std::vector<std::string>>* out,
                                    std::optional<absl::Duration> wait = std::nullopt) {
  const absl::Duration within = wait.value_or(c.options().timeout);
  std::string problem;
  const bool seen = WaitForApi(
      c,
      [&] {
        problem.clear();
        std::map<std::string, std::vector<std::string>> pools = c.Pools(&problem);
        size_t n = 0;
        for (const auto& [p, d] : pools) n += d.size();
        if (n == 0 || !problem.empty()) return false;
        *out = std::move(pools);
        return true;
      },
      within);
  if (seen) return std::nullopt;
  return Failed("no devices of the driver were published for the node",
                problem.empty()
                    ? absl::StrCat("no ResourceSlice of driver ", c.options().dra_driver,
                                   " with spec.nodeName ", kNode, " and a device appeared within ",
                                   absl::FormatDuration(within))
                    : problem,
                "a node-local driver publishes its devices as ResourceSlices (spec.nodeName "
                "set, every slice of a pool at one generation, resourceSliceCount of them)",
                "the scheduler sees no devices of the driver on the node: claims for them stay "
                "unallocated and their pods Pending");
}

struct Prepared {
  std::string uid;
  Json answer;   // the claim's entry in the kubelet's answer
  Json results;  // the claim's allocation: [{request, driver, pool, device}]
};

std::optional<CellResult> AllocateAndPrepare(DraCell& c, sim::ClaimAllocation a, Prepared* p);

// The answer's devices and CDI names, to compare two answers.
std::vector<std::string> AnswerIds(const Json& answer) {
  std::vector<std::string> out;
  for (const Json& d : answer.value("devices", Json::array())) {
    out.push_back(absl::StrCat(d.value("device", ""), ":",
                               d.value("cdi_device_ids", Json::array()).dump()));
  }
  return out;
}

// The claim prepared again after `after` ("the kubelet restart") answers
// the same devices and CDI names as before.
std::optional<CellResult> SameAnswer(DraCell& c, const Prepared& before, const std::string& after) {
  absl::StatusOr<Json> again =
      c.kubelet().PrepareClaims(c.options().dra_driver, {{"default", "conform", before.uid}});
  const Json entry = again.ok() ? again->value(before.uid, Json()) : Json();
  if (again.ok() && !entry.is_null() && entry.value("error", "").empty() &&
      AnswerIds(entry) == AnswerIds(before.answer)) {
    return std::nullopt;
  }
  return Failed(absl::StrCat("a claim prepared again after ", after, " was not answered the same"),
                again.ok() ? absl::StrCat("answered ", entry.dump(), " where it answered ",
                                          before.answer.dump())
                           : std::string(again.status().message()),
                "prepare is idempotent: the kubelet prepares its claims again after its own and "
                "the driver's restarts, and gets the same devices and CDI names",
                "containers of running pods restart without their devices, or with others");
}

// A claim of one device allocated and prepared: every allocated device in
// the answer, each CDI name resolvable.
std::optional<CellResult> AllocateAndPrepare(DraCell& c, const std::string& name, Prepared* p) {
  sim::ClaimAllocation a;
  a.name = name;
  a.count = 1;
  return AllocateAndPrepare(c, std::move(a), p);
}

std::optional<CellResult> AllocateAndPrepare(DraCell& c, sim::ClaimAllocation a, Prepared* p) {
  const std::string name = a.name;
  a.driver = c.options().dra_driver;
  a.node = kNode;
  absl::StatusOr<Json> claim = sim::CreateAllocatedClaim(c.client(), a);
  if (!claim.ok()) {
    return Failed(absl::StrCat("the scheduler could not allocate a device: ",
                               claim.status().message()),
                  "published slices the scheduler could not allocate from",
                  "a free device in the node's published pools", "claims stay unallocated");
  }
  p->uid = (*claim)["metadata"]["uid"].get<std::string>();
  absl::StatusOr<Json> r =
      c.kubelet().PrepareClaims(c.options().dra_driver, {{"default", name, p->uid}});
  if (!r.ok()) {
    return Failed("NodePrepareResources failed as a call", std::string(r.status().message()),
                  "an answer with an entry per claim (an error of one claim goes in its entry)",
                  "the pod stays ContainerCreating while the kubelet retries");
  }
  p->answer = (*r).value(p->uid, Json());
  if (p->answer.is_null()) {
    return Failed("the answer has no entry for the claim",
                  absl::StrCat("answered ", r->dump(), " for claim UID ", p->uid),
                  "an entry keyed by the claim's UID", "the pod stays ContainerCreating");
  }
  const std::string error = p->answer.value("error", "");
  if (!error.empty()) {
    return Failed("the driver refused to prepare a claim the scheduler allocated",
                  absl::StrCat("answered the claim with error: ", error),
                  "its devices prepared and their CDI names", "the pod stays ContainerCreating");
  }
  p->results = claim->value("/status/allocation/devices/results"_json_pointer, Json::array());
  std::set<std::string> missing;
  for (const Json& r : p->results) missing.insert(r.value("device", ""));
  std::vector<std::string> errors;
  for (const Json& d : p->answer.value("devices", Json::array())) {
    missing.erase(d.value("device", ""));
    if (d.value("cdi_device_ids", Json::array()).empty()) {
      errors.push_back(absl::StrCat("device ", d.value("device", ""), " has no CDI name"));
    }
    for (const Json& e : d.value("/runtime/errors"_json_pointer, Json::array())) {
      errors.push_back(e.get<std::string>());
    }
  }
  if (!missing.empty()) {
    return Failed("the answer does not name the allocated device",
                  absl::StrCat("answered devices ", p->answer.value("devices", Json()).dump()),
                  absl::StrCat("device(s) ", absl::StrJoin(missing, ", "),
                               " of the claim's allocation"),
                  "the container is started without the device it was allocated");
  }
  if (!errors.empty()) {
    return Failed("the container runtime cannot use what the driver answered",
                  absl::StrJoin(errors, "; "),
                  absl::StrCat("CDI names defined by exactly one spec in the CDI directories (",
                               c.CdiDir(), ")"),
                  "CreateContainerError: unresolvable CDI devices");
  }
  return std::nullopt;
}

// Registered, published, and one claim prepared: what the restart
// scenarios start from. A failure on the way blocks them.
std::optional<CellResult> PreparedOne(DraCell& c, Prepared* p) {
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return Blocked("dra-publishes", *f);
  if (auto f = AllocateAndPrepare(c, "conform", p)) return Blocked("dra-prepare", *f);
  return std::nullopt;
}

CellResult Registers(DraCell& c) {
  if (auto f = Registered(c)) return *f;
  const std::optional<sim::KubeletSim::DraDriver> d = c.kubelet().dra_driver(c.options().dra_driver);
  return Result(Outcome::kPass,
                absl::StrCat("registered, service ", d.has_value() ? d->service : "?"));
}

CellResult Publishes(DraCell& c) {
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return *f;
  size_t n = 0;
  for (const auto& [p, d] : pools) n += d.size();
  return Result(Outcome::kPass, absl::StrCat(n, " device(s) in ", pools.size(), " pool(s)"));
}

CellResult Prepare(DraCell& c) {
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return Blocked("dra-publishes", *f);
  Prepared p;
  if (auto f = AllocateAndPrepare(c, "conform", &p)) return *f;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Json> un =
        c.kubelet().UnprepareClaims(c.options().dra_driver, {{"default", "conform", p.uid}});
    const std::string error =
        un.ok() ? un->value(p.uid, Json::object()).value("error", "") : std::string(un.status().message());
    if (!error.empty()) {
      return Failed(i == 0 ? "unprepare failed" : "a repeated unprepare failed",
                    absl::StrCat("answered: ", error),
                    "unprepare succeeds, also for a claim already unprepared (the kubelet "
                    "repeats it after restarts)",
                    "the pod stays Terminating until unprepare succeeds (kubernetes#129402)");
    }
  }
  return Result(Outcome::kPass, "prepared with resolvable CDI names; unprepared twice");
}

CellResult KubeletRestart(DraCell& c) {
  Prepared before;
  if (auto blocked = PreparedOne(c, &before)) return *blocked;
  const size_t from = c.kubelet().events().Size();
  const absl::Time restart = absl::Now();
  if (absl::Status s = c.kubelet().Restart(c.version()); !s.ok()) {
    return Result(Outcome::kFail, absl::StrCat("dpconform could not restart its kubelet: ", s.message()));
  }
  if (auto f = Registered(c, from)) {
    f->summary = "the driver did not register again after the kubelet restarted";
    return *f;
  }
  const absl::Duration registered = absl::Now() - restart;
  std::map<std::string, std::vector<std::string>> pools;
  // The kubelet deleted the node's slices as it started. Upstream's
  // kubelet-plugin helper syncs a pool 30 s after the last change it saw
  // (DefaultSyncDelay, k8s.io/dynamic-resource-allocation/resourceslice),
  // so a driver built on it publishes again that long after the restart:
  // the wait allows that on top of --timeout, and the note says how long.
  if (auto f = Published(c, &pools, c.options().timeout + kHelperSyncDelay)) {
    f->summary = "the node's slices, deleted by the kubelet's start, were not published again";
    f->users_see = "the scheduler no longer sees the node's devices until the driver restarts";
    return *f;
  }
  const absl::Duration republished = absl::Now() - restart;
  if (auto f = SameAnswer(c, before, "the kubelet restart")) return *f;
  CellResult r = Result(Outcome::kPass, "registered and published again; prepare repeated the same");
  r.notes = {absl::StrCat("registered again ", absl::ToInt64Milliseconds(registered),
                          " ms after the restart, slices back after ",
                          absl::ToInt64Milliseconds(republished), " ms")};
  return r;
}

CellResult DriverRestart(DraCell& c) {
  Prepared before;
  if (auto blocked = PreparedOne(c, &before)) return *blocked;
  // A driver upgrade or crash: the pod's claim stays prepared in the
  // kubelet, which prepares it again when it restarts or the pod's
  // containers restart.
  const size_t from = c.kubelet().events().Size();
  c.StopDriver();
  if (absl::Status s = c.StartDriver(); !s.ok()) {
    return Result(Outcome::kFail, absl::StrCat("could not start the driver again: ", s.message()));
  }
  if (auto f = Registered(c, from)) {
    f->summary = "the driver did not register again after it restarted";
    return *f;
  }
  if (auto f = SameAnswer(c, before, "the driver restarted")) return *f;
  absl::StatusOr<Json> un =
      c.kubelet().UnprepareClaims(c.options().dra_driver, {{"default", "conform", before.uid}});
  const std::string error = un.ok() ? un->value(before.uid, Json::object()).value("error", "")
                                    : std::string(un.status().message());
  if (!error.empty()) {
    return Failed("a claim prepared before the driver restarted could not be unprepared",
                  absl::StrCat("answered: ", error), "unprepare succeeds",
                  "the pod stays Terminating (kubernetes#129402)");
  }
  return Result(Outcome::kPass, "registered again; the prepared claim answered the same and unprepared");
}

CellResult UnknownClaim(DraCell& c) {
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  absl::StatusOr<Json> r =
      c.kubelet().PrepareClaims(c.options().dra_driver, {{"default", "absent", "no-such-uid"}});
  if (!r.ok()) {
    // The kubelet prepares one pod's claims of a driver per call and gives
    // the pod up at any error, of an entry or of the call
    // (pkg/kubelet/cm/dra/manager.go, prepareResources): either way only
    // that pod waits. Upstream's kubelet-plugin helper fails the call.
    const std::string said(r.status().message());
    if (said.find("absent") == std::string::npos) {
      return Failed("a claim the API server does not have failed the call without naming it",
                    said, "an error naming the claim, in its entry or as the call's error",
                    "the pod's events say its prepare failed, not which claim is wrong");
    }
    return Result(Outcome::kPass, absl::StrCat("refused as the call's error: ", said));
  }
  const std::string error = r->value("no-such-uid", Json::object()).value("error", "");
  if (error.empty()) {
    return Failed("a claim the API server does not have was answered as prepared",
                  absl::StrCat("answered ", r->dump()),
                  "an error naming the claim (the driver reads it and checks its UID)",
                  "a pod starts without the devices its claim names");
  }
  return Result(Outcome::kPass, absl::StrCat("refused in its entry: ", error));
}

// The health stream (DRAResourceHealth, KEP-4680): what a kubelet that
// watches it (1.36 every driver, 1.37 those that list the service) reads.
CellResult Health(DraCell& c) {
  if (c.version().minor < 36) {
    return Result(Outcome::kNotApplicable,
                  absl::StrCat("kubelet ", c.version().name, " watches no device health"));
  }
  const size_t from = c.kubelet().events().Size();
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  const std::string driver = c.options().dra_driver;
  const std::optional<sim::KubeletSim::DraDriver> d = c.kubelet().dra_driver(driver);
  if (!d.has_value() || d->health.empty()) {
    return Result(Outcome::kNotApplicable,
                  "the driver lists no health service (v1.DRAResourceHealth or "
                  "v1alpha1.DRAResourceHealth) in its GetInfo");
  }
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return Blocked("dra-publishes", *f);
  const bool sent = c.kubelet()
                        .events()
                        .WaitFor(
                            [&](const Json& e) {
                              const std::string n = e.value("event", "");
                              return e.value("driver", "") == driver &&
                                     (n == "dra_health" || n == "dra_health_unsupported");
                            },
                            c.options().timeout, from)
                        .has_value();
  const bool unsupported =
      c.kubelet().events().WaitForEvent("dra_health_unsupported", {{"driver", driver}},
                                        absl::ZeroDuration(), from).has_value();
  const std::string users =
      "pods' status shows no health for the driver's devices (allocatedResourcesStatus), and "
      "a failing device is not seen";
  if (c.version().minor == 36 && unsupported) {
    // 1.36 asks every driver, whether it lists the service or not.
    return Result(Outcome::kNotApplicable,
                  "the driver serves no v1alpha1.DRAResourceHealth (kubelet 1.36 asks every "
                  "driver, and asks again every 5 s)");
  }
  if (!sent || unsupported) {
    return Failed(
        unsupported ? "the health service it lists answered Unimplemented"
                    : "no health message within the timeout",
        unsupported ? absl::StrCat("listed ", d->health, " in GetInfo but does not serve it")
                    : absl::StrCat("accepted NodeWatchResources (", d->health,
                                   ") and sent nothing within ",
                                   absl::FormatDuration(c.options().timeout)),
        "a driver that lists a health service sends the full state of its devices at once, "
        "then again at each change",
        users);
  }
  std::set<std::string> published;
  for (const auto& [pool, names] : pools) {
    for (const std::string& n : names) published.insert(absl::StrCat(pool, "/", n));
  }
  const std::map<std::string, sim::KubeletSim::DraDeviceHealth> health =
      c.kubelet().DraHealth(driver);
  std::vector<std::string> unknown_devices;
  int healthy = 0;
  for (const auto& [key, h] : health) {
    if (!published.count(key)) unknown_devices.push_back(key);
    healthy += h.health == "HEALTHY";
  }
  if (health.empty()) {
    // Health is reported per device, and a device left out is one the
    // driver says nothing about: allowed, and nothing to check.
    return Result(Outcome::kNotApplicable,
                  absl::StrCat("the driver serves ", d->health,
                               " but its messages name no device: it reports no health (the "
                               "kubelet shows its devices' health as Unknown in pod status)"));
  }
  if (!unknown_devices.empty()) {
    return Failed("its health messages name devices it does not publish",
                  absl::StrCat("named ", absl::StrJoin(unknown_devices, ", "),
                               "; its slices publish ", absl::StrJoin(published, ", ")),
                  "each message lists the driver's devices by pool and name, as its "
                  "ResourceSlices publish them",
                  users);
  }
  return Result(Outcome::kPass,
                absl::StrCat(health.size(), " device(s) reported on ", d->health, ", ", healthy,
                             " healthy"));
}

// A claim of two requests, one device each: the kubelet gives a container
// that names one request (resources.claims[].request) the devices whose
// request_names hold it.
CellResult SeveralRequests(DraCell& c) {
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return Blocked("dra-publishes", *f);
  size_t n = 0;
  for (const auto& [pool, devices] : pools) n += devices.size();
  if (n < 2) {
    return Result(Outcome::kNotApplicable,
                  "the driver publishes one device: a claim of two requests needs two");
  }
  sim::ClaimAllocation a;
  a.name = "two-requests";
  a.count = 2;
  a.requests = {"first", "second"};
  Prepared p;
  if (auto f = AllocateAndPrepare(c, std::move(a), &p)) return *f;
  std::vector<std::string> wrong;
  for (const Json& r : p.results) {
    const std::string request = r.value("request", ""), device = r.value("device", "");
    for (const Json& d : p.answer.value("devices", Json::array())) {
      if (d.value("device", "") != device) continue;
      const Json names = d.value("request_names", Json::array());
      if (std::find(names.begin(), names.end(), Json(request)) == names.end()) {
        wrong.push_back(absl::StrCat("device ", device, " (request ", request,
                                     ") answered with request_names ", names.dump()));
      }
    }
  }
  if (!wrong.empty()) {
    return Failed("devices answered without the request they were allocated for",
                  absl::StrJoin(wrong, "; "),
                  "each device answered with request_names naming its claim request (the "
                  "allocation's results[].request)",
                  "a container that names one request of the claim is started without that "
                  "request's device");
  }
  return Result(Outcome::kPass,
                "a claim of two requests prepared: each device answered with its request");
}

// The host device nodes CDI names give a container, as the runtime
// resolves them in the cell's CDI directory.
std::set<std::string> CdiNodes(DraCell& c, const std::vector<std::string>& names) {
  std::set<std::string> out;
  if (names.empty()) return out;
  const sim::CdiResolution r = sim::ResolveCdiDevices({c.CdiDir()}, names);
  for (const Json& n : r.edits["deviceNodes"]) out.insert(n.value("hostPath", n.value("path", "")));
  return out;
}

// The host device nodes of a device plugin's answer: its device specs and
// its CDI devices.
std::set<std::string> DevicePluginNodes(DraCell& c, const sim::ContainerAllocation& a) {
  std::vector<std::string> cdi;
  for (const auto& d : a.response().cdi_devices()) cdi.push_back(d.name());
  std::set<std::string> out = CdiNodes(c, cdi);
  for (const auto& d : a.response().devices()) out.insert(d.host_path());
  return out;
}

// The host device nodes of a prepared claim, as the runtime resolved them.
std::set<std::string> ClaimNodes(const Json& answer) {
  std::set<std::string> out;
  for (const Json& d : answer.value("devices", Json::array())) {
    for (const Json& n : d.value("/runtime/edits/deviceNodes"_json_pointer, Json::array())) {
      out.insert(n.value("hostPath", n.value("path", "")));
    }
  }
  return out;
}

std::vector<std::string> Common(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::vector<std::string> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// The driver registered and published, and the device plugin beside it
// registered with healthy devices (`*healthy` of them); else the cell's
// result: n/a without --resource, blocked, or failed.
std::optional<CellResult> BothReady(DraCell& c, int* healthy) {
  if (c.options().resources.empty()) {
    return Result(Outcome::kNotApplicable,
                  "no --resource: no device plugin for the same hardware beside the driver");
  }
  if (auto f = Registered(c)) return Blocked("dra-registers", *f);
  std::map<std::string, std::vector<std::string>> pools;
  if (auto f = Published(c, &pools)) return Blocked("dra-publishes", *f);
  const std::string resource = c.options().resources.front();
  std::optional<Json> e = c.kubelet().events().WaitFor(
      [&](const Json& j) {
        return j.value("event", "") == "devices" && j.value("resource", "") == resource &&
               j.value("allocatable", int64_t{0}) > 0;
      },
      c.options().timeout);
  if (!e.has_value()) {
    return Failed(
        absl::StrCat("the device plugin for ", resource, " never listed a healthy device"),
        absl::StrCat("no device-plugin registration of ", resource,
                     " with a healthy device within ", absl::FormatDuration(c.options().timeout)),
        "the device plugin for the same hardware registered at {kubelet_socket}",
        absl::StrCat("pods asking for ", resource, " stay Pending"));
  }
  *healthy = static_cast<int>(e->value("allocatable", int64_t{0}));
  return std::nullopt;
}

// Admits a pod of one container asking for `count` of the device plugin's
// resource.
absl::StatusOr<sim::AllocateResponse> AdmitDevicePluginPod(DraCell& c, const std::string& pod,
                                                           int count) {
  sim::AllocateRequest req;
  req.set_pod_name(pod);
  sim::ContainerRequest* container = req.add_containers();
  container->set_name("c0");
  container->set_resource(c.options().resources.front());
  container->set_count(count);
  return c.kubelet().Allocate(req);
}

constexpr char kOneHolder[] =
    "a device has one holder: the driver leaves out of its pool (or refuses to prepare) what "
    "device-plugin pods hold, and the plugin lists as unhealthy (or refuses to allocate) what "
    "claims hold";
constexpr char kUsersShare[] =
    "two pods use one device at once: the kubelet's device manager and its DRA manager do not "
    "know of each other, and the scheduler counts the extended resource and the pool apart";

// A device plugin and a DRA driver for the same hardware (--resource with
// --dra_driver: a vendor serving both, or moving from one to the other):
// device-plugin pods take every device the plugin lists, then a claim of
// one device is allocated from the driver's pool and prepared. It must not
// get a device node those pods hold: the scheduler finds no free device
// (the driver withdrew them), or the driver refuses the claim, or the
// claim's device nodes are others.
CellResult ClaimBesidePods(DraCell& c) {
  int healthy = 0;
  if (auto f = BothReady(c, &healthy)) return *f;
  const size_t slices_from = c.api().events().Size();
  absl::StatusOr<sim::AllocateResponse> pods = AdmitDevicePluginPod(c, "every-device", healthy);
  if (!pods.ok()) {
    return Failed(absl::StrCat("a pod of all ", healthy, " healthy devices was not admitted: ",
                               pods.status().message()),
                  "refused an Allocate for every device it lists as healthy",
                  "the devices a plugin lists Healthy can be allocated",
                  "pods fail with UnexpectedAdmissionError");
  }
  std::set<std::string> held;
  for (const sim::ContainerAllocation& a : pods->allocations()) {
    const std::set<std::string> nodes = DevicePluginNodes(c, a);
    held.insert(nodes.begin(), nodes.end());
  }
  sim::ClaimAllocation a;
  a.name = "beside-pods";
  a.count = 1;
  a.driver = c.options().dra_driver;
  a.node = kNode;
  // A driver that withdraws the held devices writes its slices: it gets
  // `settle` to start, and the write its answer.
  (void)c.api().events().WaitFor(
      [](const Json& j) {
        return j.value("event", "") == "request" && j.value("method", "") != "GET" &&
               absl::StrContains(j.value("path", ""), "/resourceslices");
      },
      c.options().settle, slices_from);
  absl::StatusOr<Json> claim = sim::CreateAllocatedClaim(c.client(), a);
  if (!claim.ok()) {
    return Result(Outcome::kPass,
                  absl::StrCat("with every device held by device-plugin pods, the scheduler "
                               "finds none free in the driver's pool (",
                               claim.status().message(), ")"));
  }
  const std::string uid = (*claim)["metadata"]["uid"].get<std::string>();
  absl::StatusOr<Json> r =
      c.kubelet().PrepareClaims(c.options().dra_driver, {{"default", a.name, uid}});
  const Json entry = r.ok() ? r->value(uid, Json()) : Json();
  if (!r.ok() || entry.is_null() || !entry.value("error", "").empty()) {
    return Result(Outcome::kPass,
                  absl::StrCat("the driver refused a claim of a device that device-plugin pods "
                               "hold: ",
                               !r.ok() ? std::string(r.status().message())
                                       : entry.value("error", std::string("no entry"))));
  }
  const std::vector<std::string> shared = Common(held, ClaimNodes(entry));
  if (!shared.empty()) {
    return Failed(absl::StrCat("a claim was prepared with ", shared.front(),
                               ", which a device-plugin pod holds"),
                  absl::StrCat("prepared claim ", a.name, " with device node(s) ",
                               absl::StrJoin(shared, ", "),
                               " while the device plugin had allocated them to pod every-device"),
                  kOneHolder, kUsersShare);
  }
  return Result(Outcome::kPass, "the claim's device nodes are none that device-plugin pods hold");
}

// The other order: a claim of one device is prepared first, then a pod
// asks the device plugin for every device it lists. It must not be
// admitted onto the claim's device: the plugin lists that device as
// unhealthy (the kubelet then admits fewer) or refuses the Allocate, or
// its device nodes are others.
CellResult PodsBesideClaim(DraCell& c) {
  int listed = 0;  // before the claim: the plugin may turn its device unhealthy
  if (auto f = BothReady(c, &listed)) return *f;
  const size_t lists_from = c.kubelet().events().Size();
  Prepared claim;
  if (auto f = AllocateAndPrepare(c, "before-pods", &claim)) return Blocked("dra-prepare", *f);
  const std::set<std::string> claimed = ClaimNodes(claim.answer);
  // The plugin's list as the kubelet holds it once the claim is prepared:
  // a plugin that turns the claim's device unhealthy gets `settle` to.
  const std::string resource = c.options().resources.front();
  (void)c.kubelet().events().WaitFor(
      [&](const Json& j) {
        return j.value("event", "") == "devices" && j.value("resource", "") == resource;
      },
      c.options().settle, lists_from);
  int healthy = 0;
  const sim::State state = c.kubelet().GetState();
  for (const sim::ResourceState& rs : state.resources()) {
    if (rs.name() != resource) continue;
    for (const sim::DeviceState& d : rs.devices()) healthy += d.health() == "Healthy";
  }
  if (healthy == 0) {
    return Result(Outcome::kPass, "the device plugin lists no healthy device while the claim "
                                  "holds one");
  }
  absl::StatusOr<sim::AllocateResponse> pods = AdmitDevicePluginPod(c, "every-device", healthy);
  if (!pods.ok()) {
    return Result(Outcome::kPass, absl::StrCat("a pod of every healthy device was refused while "
                                               "a claim holds one: ",
                                               pods.status().message()));
  }
  std::set<std::string> got;
  for (const sim::ContainerAllocation& a : pods->allocations()) {
    const std::set<std::string> nodes = DevicePluginNodes(c, a);
    got.insert(nodes.begin(), nodes.end());
  }
  const std::vector<std::string> shared = Common(claimed, got);
  if (!shared.empty()) {
    return Failed(absl::StrCat("a device-plugin pod was given ", shared.front(),
                               ", which a prepared claim holds"),
                  absl::StrCat("listed the claim's device as healthy and allocated device "
                               "node(s) ", absl::StrJoin(shared, ", "), " to pod every-device"),
                  kOneHolder, kUsersShare);
  }
  return Result(Outcome::kPass, absl::StrCat("the pod of ", healthy,
                                             " devices got none of the claim's device nodes"));
}

struct DraEntry {
  ScenarioInfo info;
  CellResult (*run)(DraCell&);
};

const std::vector<DraEntry>& DraEntries() {
  static const auto* const kEntries = new std::vector<DraEntry>{
      {{"dra-registers", "DRA driver registers",
        "a socket in plugins_registry/ answers GetInfo as a DRAPlugin of --dra_driver with a "
        "service this release knows (v1.DRAPlugin from 1.34, v1beta1.DRAPlugin from 1.32)"},
       Registers},
      {{"dra-publishes", "devices published",
        "ResourceSlices of the driver for the node: at least one device, every pool whole "
        "(resourceSliceCount slices at its newest generation)"},
       Publishes},
      {{"dra-prepare", "prepare and unprepare",
        "a claim the scheduler allocated from the published devices is prepared: the "
        "allocated device in the answer, every CDI name defined by one spec in the CDI "
        "directory; unprepare succeeds, twice"},
       Prepare},
      {{"dra-several-requests", "claim of several requests",
        "a claim of two requests, one device each, is prepared with both devices, each "
        "answered with request_names naming its request; n/a where fewer than two devices "
        "are published"},
       SeveralRequests},
      {{"dra-beside-device-plugin", "a claim beside device-plugin pods",
        "with --resource, a device plugin for the same hardware: pods take every device the "
        "plugin lists, then a claim of one device is allocated and prepared; it must get none "
        "of their device nodes (the scheduler finds none free, the driver refuses, or the "
        "nodes are others); n/a without --resource"},
       ClaimBesidePods},
      {{"dra-device-plugin-beside-claim", "device-plugin pods beside a claim",
        "with --resource: a claim of one device is prepared, then a pod asks the device plugin "
        "for every device it lists as healthy; it must get none of the claim's device nodes "
        "(the plugin lists it unhealthy, refuses, or the nodes are others); n/a without "
        "--resource"},
       PodsBesideClaim},
      {{"dra-kubelet-restart", "kubelet restart",
        "after a kubelet restart (which deletes the node's slices) the driver registers and "
        "publishes again, and preparing the same claim again answers the same"},
       KubeletRestart},
      {{"dra-driver-restart", "driver restart",
        "the driver restarts (an upgrade, a crash): it registers again, and a claim prepared "
        "before is answered the same and unprepared"},
       DriverRestart},
      {{"dra-health", "device health stream",
        "from 1.36, where the kubelet watches it (1.36 every driver's v1alpha1 stream, 1.37 "
        "the service the driver lists, v1 first): the stream sends at once the health of "
        "devices the driver publishes, by pool and name; n/a where the driver lists no "
        "health service"},
       Health},
      {{"dra-unknown-claim", "unknown claim",
        "a claim the API server does not have is an error naming it, in its entry or as the "
        "call's (the kubelet gives the pod up at either)"},
       UnknownClaim},
  };
  return *kEntries;
}

const DraEntry* FindDra(const std::string& name) {
  for (const DraEntry& e : DraEntries()) {
    if (name == e.info.name) return &e;
  }
  return nullptr;
}

CellResult RunDraCell(const ConformOptions& o, const sim::KubeletVersion& k, const DraEntry& e,
                      const std::string& dir, std::optional<absl::Duration> first_wait) {
  const absl::Time start = absl::Now();
  CellResult result;
  {
    DraCell cell(o, k, dir);
    if (first_wait.has_value()) cell.LimitFirstWait(*first_wait);
    if (absl::Status s = cell.Start(); !s.ok()) {
      result = Result(Outcome::kFail, absl::StrCat("could not start the cell: ", s.message()));
    } else {
      result = e.run(cell);
    }
  }
  result.kubelet = k.name;
  result.generation = k.GenerationName();
  result.scenario = e.info.name;
  result.duration = absl::Now() - start;
  result.dir = dir;
  return result;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> DraValues(
    const ConformOptions& o, const std::string& kubelet_root, const std::string& kubeconfig,
    const std::string& node_name, const std::string& cdi_dir, const std::string& work_dir,
    const std::string& kubelet_version) {
  return {{"kubelet_root", kubelet_root},
          {"plugins_registry", JoinPath(kubelet_root, "plugins_registry")},
          {"kubelet_socket", JoinPath(kubelet_root, "device-plugins/kubelet.sock")},
          {"plugin_dir", JoinPath(kubelet_root, "device-plugins")},
          {"resource", o.resources.empty() ? std::string() : o.resources.front()},
          {"kubeconfig", kubeconfig},
          {"node_name", node_name},
          {"cdi_dir", cdi_dir},
          {"driver", o.dra_driver},
          {"work_dir", work_dir},
          {"kubelet_version", kubelet_version}};
}

std::map<std::string, std::vector<std::string>> PublishedPools(const std::vector<Json>& slices,
                                                               const std::string& driver,
                                                               const std::string& node,
                                                               std::string* problem) {
  std::vector<Json> ours;
  for (const Json& s : slices) {
    const Json spec = s.value("spec", Json::object());
    if (spec.value("driver", "") == driver && spec.value("nodeName", "") == node) {
      ours.push_back(spec);
    }
  }
  std::map<std::string, std::pair<int64_t, int64_t>> meta;  // newest generation, count
  std::map<std::string, std::map<int64_t, int>> seen;       // slices per generation
  for (const Json& spec : ours) {
    const Json pool = spec.value("pool", Json::object());
    const std::string pool_name = pool.value("name", "");
    const int64_t g = pool.value("generation", int64_t{0});
    ++seen[pool_name][g];
    auto& m = meta[pool_name];
    if (g >= m.first) m = {g, pool.value("resourceSliceCount", int64_t{0})};
  }
  std::map<std::string, std::vector<std::string>> pools;
  for (const Json& spec : ours) {
    const std::string pool_name = spec.value("/pool/name"_json_pointer, std::string());
    if (spec.value("/pool/generation"_json_pointer, int64_t{0}) != meta[pool_name].first) {
      continue;
    }
    for (const Json& d : spec.value("devices", Json::array())) {
      pools[pool_name].push_back(d.value("name", ""));
    }
  }
  for (const auto& [pool, m] : meta) {
    if (seen[pool][m.first] != m.second && problem != nullptr) {
      *problem = absl::StrCat("pool ", pool, " at generation ", m.first, " has ",
                              seen[pool][m.first], " slice(s) of the ", m.second,
                              " its resourceSliceCount says");
    }
  }
  return pools;
}

const std::vector<ScenarioInfo>& DraScenarios() {
  static const auto* const kInfos = [] {
    auto* v = new std::vector<ScenarioInfo>;
    for (const DraEntry& e : DraEntries()) v->push_back(e.info);
    return v;
  }();
  return *kInfos;
}

const std::vector<Placeholder>& DraPlaceholders() {
  static const auto* const kPlaceholders = new std::vector<Placeholder>{
      {"kubelet_root", "the kubelet's root directory: the registration socket goes in "
                       "<kubelet_root>/plugins_registry, the service socket conventionally in "
                       "<kubelet_root>/plugins/<driver>"},
      {"plugins_registry", "<kubelet_root>/plugins_registry"},
      {"kubelet_socket", "<kubelet_root>/device-plugins/kubelet.sock, where a device plugin for "
                         "the same hardware registers (--resource)"},
      {"plugin_dir", "<kubelet_root>/device-plugins"},
      {"resource", "the first --resource, the device plugin's resource; empty without one"},
      {"kubeconfig", "a kubeconfig for the cell's API server (HTTPS with its CA, a bearer "
                     "token); on a real kubelet, --kubeconfig"},
      {"node_name", "the node's name (node-1), as NODE_NAME from the downward API"},
      {"cdi_dir", "the CDI spec directory the cell's runtime reads (for /var/run/cdi); on a "
                  "real kubelet, /var/run/cdi"},
      {"driver", "--dra_driver"},
      {"work_dir", "a directory of the driver's own for this cell (state, control sockets)"},
      {"kubelet_version", "the kubelet release this cell plays, e.g. 1.34"},
  };
  return *kPlaceholders;
}

std::vector<std::string> DefaultDraKubelets() { return {"1.32", "1.34", "1.37"}; }

absl::Status ValidateDraOptions(const ConformOptions& o) {
  if (o.plugin_command.empty()) {
    return absl::InvalidArgumentError("--plugin: the driver's command line is required");
  }
  std::vector<std::pair<std::string, std::string>> values;
  for (const Placeholder& p : DraPlaceholders()) values.emplace_back(p.name, "x");
  if (absl::StatusOr<std::string> s = Expand(o.plugin_command, values); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--plugin: ", s.status().message()));
  }
  for (const std::string& s : o.scenarios) {
    if (FindDra(s) == nullptr) {
      std::vector<std::string> names;
      for (const DraEntry& e : DraEntries()) names.push_back(e.info.name);
      return absl::InvalidArgumentError(absl::StrCat("--scenarios: unknown DRA scenario \"", s,
                                                     "\"; known: ", absl::StrJoin(names, ", ")));
    }
  }
  if (o.kubelets.empty() && o.real_kubelets.empty()) {
    return absl::InvalidArgumentError("--kubelets: no kubelet release");
  }
  for (const sim::KubeletVersion& k : o.kubelets) {
    if (k.minor < 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kubelets: kubelet ", k.name, " has no DRA driver API dpconform plays (1.32 or "
          "later: v1beta1.DRAPlugin, v1.DRAPlugin from 1.34)"));
    }
  }
  if (o.jobs < 1 || o.jobs > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--jobs=", o.jobs, " must be 1 to 64"));
  }
  if (o.work_root.size() > 40) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--work_dir=", o.work_root, " is too long (", o.work_root.size(),
        " bytes; at most 40): the sockets inside must stay within the 107-byte limit"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CellResult>> RunDraConformance(const ConformOptions& o) {
  if (absl::Status s = ValidateDraOptions(o); !s.ok()) return s;
  // The real node first: a node that cannot be used says so before the
  // simulated cells take their time.
  absl::StatusOr<std::vector<CellResult>> real = RunRealDraConformance(o);
  if (!real.ok()) return real.status();
  std::vector<const DraEntry*> scenarios;
  if (o.scenarios.empty()) {
    for (const DraEntry& e : DraEntries()) scenarios.push_back(&e);
  } else {
    for (const std::string& s : o.scenarios) scenarios.push_back(FindDra(s));
  }
  std::vector<std::pair<const sim::KubeletVersion*, const DraEntry*>> jobs;
  std::vector<std::pair<const void*, std::string>> grid;
  for (const sim::KubeletVersion& k : o.kubelets) {
    for (const DraEntry* s : scenarios) {
      jobs.emplace_back(&k, s);
      grid.emplace_back(&k, s->info.name);
    }
  }
  absl::StatusOr<std::vector<CellResult>> results =
      jobs.empty()
          ? std::vector<CellResult>{}
          : RunGatedCells(
                o, grid, "dra-registers",
                [&](size_t i, const std::string& dir, std::optional<absl::Duration> first_wait) {
                  return RunDraCell(o, *jobs[i].first, *jobs[i].second, dir, first_wait);
                },
                [&](size_t i, const std::string& why) {
                  return UnmadeResult(why, *jobs[i].first, jobs[i].second->info.name);
                });
  if (!results.ok()) return results;
  results->insert(results->end(), real->begin(), real->end());
  return results;
}

}  // namespace dpproxy::conform
