// storm_bench: a node's device plugins through a storm of kubelet restarts
// and node reboots, through dpproxy and, beside it as the floor, the same
// plugins registered directly with a kubelet of their own.
//
// Eight backends of mixed versions and sizes, as a GPU node has them (a
// GPU, MIG-style partitions, RDMA, a 10,000-device list, ...), each holding
// a running pod. Each kubelet restart (Stop, Start: the kubelet_sim plays
// the real one's start, which removes every socket in device-plugins/ and
// re-admits the pods it finds about a second later) is timed from the new
// kubelet.sock to every resource registered with its full list, and the
// re-admission that follows is checked: a pod the kubelet finds no device
// for fails with UnexpectedAdmissionError. Each node reboot kills the
// kubelet, dpproxy and every plugin, wipes the kubelet's device-plugins/
// directory (checkpoint included) and starts them together again; it is
// timed the same way, and checked for whether every resource registered
// before the kubelet re-admitted its first pod. dpproxy's threads and RSS
// are read before and after.
//
// The floor's kubelet plays the same release; v1alpha backends register
// with it as v1beta1 plugins of the same size (a 1.37 kubelet refuses
// v1alpha, which is why they run behind dpproxy).
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gflags/gflags.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/util/files.h"
#include "tools/bench/bench_util.h"
#include "tools/kubelet_sim/kubelet_sim.h"

DEFINE_string(dpproxy, "", "Path of the dpproxy binary.");
DEFINE_string(sample_plugin, "", "Path of the sample_plugin binary.");
DEFINE_int32(restarts, 1000, "Kubelet restarts, each played on both kubelets.");
DEFINE_int32(reboots, 100, "Node reboots, each played on both nodes.");
DEFINE_string(work_dir, "/tmp", "Where the bench makes its directory (removed at the end).");

namespace dpproxy::bench {
namespace {

using Json = nlohmann::json;

// One backend: a sample plugin of one resource.
struct Backend {
  const char* name;  // the resource is storm.example.com/<name>
  const char* api;
  int devices;
  std::vector<std::string> flags;
  std::string resource() const { return absl::StrCat("storm.example.com/", name); }
};

const std::vector<Backend>& Backends() {
  static const auto* const kBackends = new std::vector<Backend>{
      {"gpu", "v1beta1", 8, {"--preferred"}},
      {"mig", "v1beta1", 56, {"--preferred"}},
      {"rdma", "v1alpha", 4, {}},
      {"big", "v1beta1", 10000, {}},
      {"nic", "v1alpha", 16, {}},
      {"fpga", "v1beta1", 2, {"--pre_start_required"}},
      {"vf", "v1beta1", 128, {}},
      {"npu", "v1alpha", 8, {}},
  };
  return *kBackends;
}

// What one side (direct or through dpproxy) saw in one phase (the
// kubelet restarts, or the reboots).
struct Phase {
  std::vector<double> ms;             // start -> every resource registered, full lists
  std::vector<double> registered_ms;  // ... registered (Register answered)
  int failed_pods = 0;                // re-admissions refused
  std::string first_failure;          // the first one's pod and the kubelet's message
  int registered_first = 0;           // every resource before the first re-admission
  int judged = 0;
};
struct Side {
  Phase restarts, reboots;
  int missed = 0;  // a start after which some resource never came
};

// One node: a kubelet, its plugins and, for the proxied side, dpproxy.
class Node {
 public:
  Node(std::string dir, bool proxied) : dir_(std::move(dir)), proxied_(proxied) {
    sim::KubeletSimOptions o;
    o.root_dir = JoinPath(dir_, "k");
    o.kubelet = *sim::ParseKubeletVersion("1.37");
    o.personality = o.kubelet->personality;
    kubelet_ = std::make_unique<sim::KubeletSim>(o);
  }
  ~Node() { KillAll(); }

  sim::KubeletSim& kubelet() { return *kubelet_; }
  Child& proxy() { return proxy_; }

  bool Start() {
    if (!kubelet_->Start().ok()) return false;
    StartProcesses();
    return true;
  }

  void StartProcesses() {
    if (proxied_) {
      proxy_ = Spawn({FLAGS_dpproxy, "--kubelet_root=" + JoinPath(dir_, "k"),
                      "--plugin_dir=" + JoinPath(dir_, "p"), "--state_dir=" + JoinPath(dir_, "s"),
                      "--status_file=", "--metrics_address=", "--minloglevel=2"});
    }
    const std::string socket = proxied_ ? JoinPath(dir_, "p/kubelet.sock")
                                        : kubelet_->kubelet_socket();
    for (const Backend& b : Backends()) {
      std::vector<std::string> args = {
          FLAGS_sample_plugin,
          absl::StrCat("--api=", proxied_ ? b.api : "v1beta1"),
          "--resource=" + b.resource(),
          absl::StrCat("--devices=", b.devices),
          absl::StrCat("--socket_name=storm-", b.name, ".sock"),
          "--kubelet_socket=" + socket,
          "--quiet"};
      // Options v1alpha has not: the floor's v1beta1 stand-ins keep them
      // only where the backend is v1beta1 itself.
      if (std::string(b.api) == "v1beta1") args.insert(args.end(), b.flags.begin(), b.flags.end());
      plugins_.push_back(Spawn(args));
    }
  }

  // Every process killed (SIGKILL), as a reboot does.
  void KillAll() {
    for (Child& p : plugins_) {
      if (p != nullptr) p->Kill();
    }
    plugins_.clear();
    if (proxy_ != nullptr) proxy_->Kill();
    proxy_.reset();
  }

  // Waits until every backend's resource is registered (since the events
  // at `from`; ms from `t0` to the last in *registered_ms), then until each
  // has its full list; ms from `t0`, or -1.
  double AllRegistered(size_t from, absl::Time t0, double* registered_ms = nullptr) {
    for (const Backend& b : Backends()) {
      if (!kubelet_->events().WaitForEvent("registered", {{"resource", b.resource()}},
                                           absl::Seconds(30), from)) {
        return -1;
      }
    }
    if (registered_ms != nullptr) *registered_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    for (const Backend& b : Backends()) {
      if (!kubelet_->WaitForResource(b.resource(), b.devices, absl::Seconds(30))) return -1;
    }
    return absl::ToDoubleMilliseconds(absl::Now() - t0);
  }

  // One running pod per resource, one device each.
  bool AdmitPods() {
    for (const Backend& b : Backends()) {
      sim::AllocateRequest req;
      req.set_pod_name(absl::StrCat("storm-", b.name));
      sim::ContainerRequest* c = req.add_containers();
      c->set_name("c0");
      c->set_resource(b.resource());
      c->set_count(1);
      if (!kubelet_->Allocate(req).ok()) return false;
    }
    return true;
  }

  // After a start whose events begin at `from`: waits for the re-admission
  // of the pods the kubelet found; the pods it failed, and whether every
  // resource had registered before the first re-admission.
  int Readmitted(size_t from, bool* registered_first, std::string* first_failure) {
    kubelet_->WaitForPodsSynced(absl::Seconds(30));
    // The kubelet's pass over the pods it found (kubelet_sim's
    // ReadmitAfterStart): a pod that does not fit is denied, one whose
    // new Allocate fails is failed, both UnexpectedAdmissionError.
    static const std::set<std::string> kPass = {"readmission_denied", "readmission_failed",
                                                "container_running", "reallocated",
                                                "pods_synced"};
    int failed = 0;
    std::set<std::string> registered;
    bool first_seen = false;
    *registered_first = false;
    for (const Json& e : kubelet_->events().Since(from)) {
      const std::string name = e.value("event", "");
      if (name == "registered") registered.insert(e.value("resource", ""));
      if (kPass.count(name) == 0) continue;
      if (!first_seen) {
        first_seen = true;
        *registered_first = registered.size() == Backends().size();
      }
      if (name != "readmission_denied" && name != "readmission_failed") continue;
      if (++failed == 1 && first_failure->empty()) {
        *first_failure = absl::StrCat(e.value("pod", ""), ": ", e.value("reason", ""), ": ",
                                      e.value("message", ""));
      }
    }
    return failed;
  }

  // The reboot: everything killed, device-plugins/ emptied (checkpoint
  // included), then the kubelet, dpproxy and the plugins started together.
  bool Reboot(absl::Time* t0, size_t* from) {
    KillAll();
    kubelet_->Stop();
    std::error_code ec;
    for (const auto& entry :
         std::filesystem::directory_iterator(kubelet_->device_plugin_dir(), ec)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
    *from = kubelet_->events().Size();
    *t0 = absl::Now();
    return Start();
  }

 private:
  const std::string dir_;
  const bool proxied_;
  std::unique_ptr<sim::KubeletSim> kubelet_;
  Child proxy_;
  std::vector<Child> plugins_;
};

// A start of `n` (its events from `from`, begun at `t0`): how long every
// resource took to register and to list in full, and what the kubelet's
// re-admission of its pods made of them.
void Judge(Node& n, size_t from, absl::Time t0, Phase* phase, int* missed) {
  double registered = 0;
  const double ms = n.AllRegistered(from, t0, &registered);
  if (ms < 0) {
    ++*missed;
  } else {
    phase->ms.push_back(ms);
    phase->registered_ms.push_back(registered);
  }
  bool first = false;
  phase->failed_pods += n.Readmitted(from, &first, &phase->first_failure);
  ++phase->judged;
  if (first) ++phase->registered_first;
}

std::string Figure(const std::vector<double>& ms) {
  if (ms.empty()) return "-";
  return absl::StrFormat("%.1f / %.1f", Percentile(ms, 0.5), Percentile(ms, 0.99));
}

int Run() {
  if (FLAGS_dpproxy.empty() || FLAGS_sample_plugin.empty()) {
    std::cerr << "storm_bench: --dpproxy and --sample_plugin are required\n";
    return 2;
  }
  std::string tmpl = JoinPath(FLAGS_work_dir, "storm.XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::cerr << "storm_bench: cannot make a directory in " << FLAGS_work_dir << "\n";
    return 1;
  }
  const std::string dir = tmpl;
  int total_devices = 0;
  for (const Backend& b : Backends()) total_devices += b.devices;
  Node direct(JoinPath(dir, "d"), false), proxied(JoinPath(dir, "x"), true);
  Side sides[2];
  Node* nodes[2] = {&direct, &proxied};
  for (Node* n : nodes) {
    const size_t from = n->kubelet().events().Size();
    const absl::Time t0 = absl::Now();
    if (!n->Start() || n->AllRegistered(from, t0) < 0 || !n->AdmitPods()) {
      std::cerr << "storm_bench: the " << (n == &direct ? "direct" : "proxied")
                << " node did not come up with its pods\n";
      return 1;
    }
  }
  const std::string threads_before = ProcField(proxied.proxy(), "Threads");
  const std::string rss_before = ProcField(proxied.proxy(), "VmRSS");
  for (int i = 0; i < FLAGS_restarts; ++i) {
    for (int k = 0; k < 2; ++k) {
      Node& n = *nodes[k];
      const size_t from = n.kubelet().events().Size();
      if (!n.kubelet().Restart().ok()) {
        ++sides[k].missed;
        continue;
      }
      Judge(n, from, absl::Now(), &sides[k].restarts, &sides[k].missed);
    }
  }
  const std::string threads_after = ProcField(proxied.proxy(), "Threads");
  const std::string rss_after = ProcField(proxied.proxy(), "VmRSS");
  for (int i = 0; i < FLAGS_reboots; ++i) {
    for (int k = 0; k < 2; ++k) {
      Node& n = *nodes[k];
      absl::Time t0;
      size_t from = 0;
      if (!n.Reboot(&t0, &from)) {
        ++sides[k].missed;
        continue;
      }
      Judge(n, from, t0, &sides[k].reboots, &sides[k].missed);
    }
  }
  const std::string threads_end = ProcField(proxied.proxy(), "Threads");
  const std::string rss_end = ProcField(proxied.proxy(), "VmRSS");

  std::cout << absl::StrFormat(
      "storm_bench: %d resources (%d devices; 5 v1beta1, 3 v1alpha behind dpproxy), "
      "a running pod on each, kubelet 1.37\n"
      "  %d kubelet restarts and %d node reboots on each node\n\n",
      Backends().size(), total_devices, FLAGS_restarts, FLAGS_reboots);
  std::cout << absl::StrFormat("  %-66s %-18s %s\n", "", "direct (floor)", "through dpproxy");
  auto row = [](const std::string& what, const std::string& a, const std::string& b) {
    std::cout << absl::StrFormat("  %-66s %-18s %s\n", what, a, b);
  };
  using PhaseOf = std::pair<const char*, Phase Side::*>;
  for (const auto& [what, phase] :
       {PhaseOf{"kubelet restart", &Side::restarts}, PhaseOf{"reboot", &Side::reboots}}) {
    const Phase& a = sides[0].*phase;
    const Phase& b = sides[1].*phase;
    row(absl::StrCat(what, " -> all registered, p50 / p99 ms"), Figure(a.registered_ms),
        Figure(b.registered_ms));
    row(absl::StrCat(what, " -> all registered, full lists, p50 / p99 ms"), Figure(a.ms),
        Figure(b.ms));
    row(absl::StrCat(what, "s with every resource registered before the first admission"),
        absl::StrCat(a.registered_first, " of ", a.judged),
        absl::StrCat(b.registered_first, " of ", b.judged));
    row(absl::StrCat("pods failed UnexpectedAdmissionError after the ", what, "s"),
        absl::StrCat(a.failed_pods), absl::StrCat(b.failed_pods));
  }
  row("starts after which a resource never came back (30 s)", absl::StrCat(sides[0].missed),
      absl::StrCat(sides[1].missed));
  for (int k = 0; k < 2; ++k) {
    for (const Phase* phase : {&sides[k].restarts, &sides[k].reboots}) {
      if (!phase->first_failure.empty()) {
        std::cout << "  first pod failed " << (k == 0 ? "direct" : "through dpproxy") << " after "
                  << (phase == &sides[k].restarts ? "a restart" : "a reboot") << ": "
                  << phase->first_failure << "\n";
      }
    }
  }
  std::cout << absl::StrFormat(
      "\n  dpproxy threads: %s before the restarts, %s after; %s after the last reboot\n"
      "  dpproxy RSS: %s before the restarts, %s after; %s after the last reboot\n",
      threads_before, threads_after, threads_end, rss_before, rss_after, rss_end);
  direct.KillAll();
  proxied.KillAll();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return sides[0].missed + sides[1].missed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace dpproxy::bench

int main(int argc, char** argv) {
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << "storm_bench: a node's eight device plugins through kubelet restarts and node\n"
                 "reboots, through dpproxy and registered directly (the floor), side by side.\n"
                 "Run it with tools/dev bench storm.\n\n"
                 "Flags:\n"
              << dpproxy::FlagsHelp({"bench/storm_bench.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return dpproxy::bench::Run();
}
