// migration_bench: a resource moved between the device-plugin path and
// DRA by configuration reloads (SIGHUP) while pods asking for it arrive
// and end. One dpproxy process serves both sides (kubelet.api: dra, the
// resource's `paths` entry moving device-plugin -> both -> dra -> both ->
// device-plugin); a sample plugin with 16 devices sits behind it; the
// kubelet sim (1.36) and the API-server sim stand for the node and the
// cluster, and the scheduler's rule (tools/apiserver_sim/extended_pods.h)
// sends each pod through the device plugin while the node's allocatable
// is above 0, else through DRA. It prints how long each move took to be in
// effect and what the pods saw beside the floor a drain-free move is held
// to: no pod failed, none stuck, none kept waiting while a device was
// free, no running pod lost, no device held twice, no drop of the plugin's
// stream. One pod of the device plugin runs from the first phase to the
// last, so every pod through DRA starts beside it after the kubelet's
// endpoint grace (played at 0), and each `both` phase ends with a pod
// started when exactly one device is free. A benchmark that prints
// figures; nothing here has a time limit.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/kube/kube_client.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tools/apiserver_sim/apiserver_sim.h"
#include "tools/apiserver_sim/extended_pods.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/control.grpc.pb.h"

DEFINE_string(dpproxy, "", "Path of the dpproxy binary.");
DEFINE_string(sample_plugin, "", "Path of the sample_plugin binary.");
DEFINE_int32(devices, 16, "Devices of the resource moved.");
DEFINE_int32(steps, 300, "Pod steps (a pod started or ended) after each move has taken effect.");
DEFINE_bool(move_fence, true,
            "dpproxy's dra.move_fence: the node tainted while a resource leaves the device "
            "manager. false shows what a move costs without it.");
DEFINE_double(steps_per_second, 20, "Pace of the pod stream (a load generator's rate).");
DEFINE_int32(endpoint_grace_seconds, 0,
             "The kubelet's endpointStopGracePeriod (300 on a real kubelet): how long it "
             "keeps a stopped device plugin's endpoint. 0 starts every pod as one started "
             "after it.");

namespace dpproxy {
namespace {

using Json = nlohmann::json;
constexpr char kResource[] = "bench.example.com/gpu";
constexpr char kDriver[] = "gpu.bench.example.com";

std::unique_ptr<ChildProcess> Spawn(const std::vector<std::string>& args) {
  ChildSpec spec;
  spec.argv = args;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
  if (!child.ok()) {
    std::cerr << "migration_bench: " << child.status().message() << "\n";
    exit(1);
  }
  return *std::move(child);
}

[[noreturn]] void Fail(const std::string& why) {
  std::cerr << "migration_bench: " << why << "\n";
  exit(1);
}

// Polls `done` until it holds, calling `between` meanwhile (the pod
// stream goes on); false after `timeout`.
bool Until(const std::function<bool()>& done, const std::function<void()>& between,
           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    between();
  }
  return true;
}

struct Move {
  std::string from, to;
  double ms = -1;  // until in effect; -1: not within 60 s
  std::map<std::string, int> served;  // by route, while and after it took effect
  int pending = 0, failed = 0;
  std::set<std::string> fenced;  // pods that found the node tainted (and waited)
  std::set<std::string> idle;    // pods refused while a device had been free
  int beside_legacy = 0;         // pods through DRA started beside the pinned one
  std::string one_free = "-";    // a `both` phase's pod with exactly one device free
};

// A device free this long (a reconciliation pass and a slice update) and
// a pod refused anyway: the pod waits while a device idles.
constexpr absl::Duration kIdleGrace = absl::Seconds(3);
// A pod waiting this long is stuck.
constexpr absl::Duration kStuck = absl::Seconds(60);

int Run() {
  if (FLAGS_steps_per_second <= 0) {
    std::cerr << "migration_bench: --steps_per_second must be above 0\n";
    return 2;
  }
  if (FLAGS_dpproxy.empty() || FLAGS_sample_plugin.empty()) {
    std::cerr << "migration_bench: --dpproxy and --sample_plugin are required\n";
    return 2;
  }
  char tmpl[] = "/tmp/dpp-migrate.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Fail("cannot make a temporary directory");
  const std::string dir = tmpl;

  sim::ApiServerSim api(sim::ApiServerSim::Options{"", "", "bench-token", {"v1"}});
  if (!api.Start().ok()) Fail("the API-server sim did not start");
  const std::string kubeconfig = dir + "/kubeconfig";
  (void)WriteFileAtomic(kubeconfig, absl::StrCat(R"(current-context: node
contexts: [{name: node, context: {cluster: sim, user: agent}}]
clusters: [{name: sim, cluster: {server: ")", api.url(), R"("}}]
users: [{name: agent, user: {token: bench-token}}]
)"));
  KubeConfig kc;
  kc.server = api.url();
  kc.token = "bench-token";
  std::unique_ptr<KubeClient> client = *KubeClient::Create(kc);
  if (!client
           ->Post("/apis/resource.k8s.io/v1/deviceclasses",
                  sim::ExtendedResourceDeviceClass("bench-gpu", kDriver, kResource))
           .ok()) {
    Fail("the DeviceClass was not created");
  }

  sim::KubeletSimOptions so;
  so.root_dir = dir + "/k";
  so.kubeconfig = kubeconfig;
  so.node_name = "node-1";
  so.cdi_dirs = {dir + "/cdi"};
  so.kubelet = *sim::ParseKubeletVersion("1.36");
  so.endpoint_grace = absl::Seconds(FLAGS_endpoint_grace_seconds);
  // The node's status, which the scheduler routes by, as the kubelet
  // writes it: every 10 s, into the Node.
  api.PutNode("node-1", "v1.36.2");
  std::atomic<int> status_writes{0};
  so.on_node_status = [&api, &status_writes](const std::map<std::string, int64_t>& allocatable) {
    api.SetNodeAllocatable("node-1", allocatable);
    ++status_writes;
  };
  sim::KubeletSim kubelet(so);
  if (!kubelet.Start().ok()) Fail("the kubelet sim did not start");

  const std::string config = dir + "/dpproxy.yaml";
  auto write_config = [&](const std::string& path) {
    (void)WriteFileAtomic(config, absl::StrCat("kubelet: {root: ", so.root_dir, ", api: dra}\n",
                                               "dra: {driver: ", kDriver,
                                               ", node_name: node-1, kubeconfig: ", kubeconfig,
                                               ", cdi_dir: ", dir, "/cdi, move_fence: ",
                                               FLAGS_move_fence ? "true" : "false", "}\n", "paths: {",
                                               kResource, ": ", path, "}\n"));
  };
  write_config("device-plugin");
  std::unique_ptr<ChildProcess> proxy =
      Spawn({FLAGS_dpproxy, "--config=" + config, "--plugin_dir=" + dir + "/p",
             "--state_dir=" + dir + "/s", "--status_file=", "--metrics_address=",
             "--reconcile_interval=1s", "--reconcile_grace=0s", "--reconcile_start_grace=2s",
             "--minloglevel=2"});
  const std::string ctl = dir + "/plugin.ctl";
  std::unique_ptr<ChildProcess> plugin =
      Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + std::string(kResource),
             absl::StrCat("--devices=", FLAGS_devices), "--id_pattern=gpu-{i}",
             "--kubelet_socket=" + dir + "/p/kubelet.sock", "--control_socket=" + ctl,
             "--quiet"});
  if (!kubelet.WaitForResource(kResource, FLAGS_devices, absl::Seconds(30)) ||
      !kubelet.events()
           .WaitForEvent("dra_driver_registered", {{"driver", kDriver}}, absl::Seconds(30))
           .has_value()) {
    Fail("the resource or the DRA driver did not come up");
  }
  auto streams = [&]() -> int64_t {
    auto stub = sample::PluginControl::NewStub(MakeUnixChannel(ctl));
    grpc::ClientContext ctx;
    sample::PluginStatus st;
    return stub->GetStatus(&ctx, sample::GetStatusRequest(), &st).ok()
               ? st.list_and_watch_streams()
               : -1;
  };
  const int64_t streams_before = streams();

  sim::ExtendedResourcePods pods(&kubelet, client.get(), kResource, "node-1");
  std::mt19937 rng(20261127);
  std::vector<Move> moves;
  int step = 0, killed = 0, held_twice = 0, started = 0, stuck = 0;
  std::set<std::string> twice;  // devices seen with two holders
  // The devices pods hold now, and since when one has been free.
  auto held = [&] {
    int n = 0;
    for (const auto& [uid, p] : pods.running()) n += static_cast<int>(p.devices.size());
    return n;
  };
  absl::Time free_since = absl::InfiniteFuture();
  auto check = [&] {
    const sim::State st = kubelet.GetState();
    std::set<std::string> running;
    std::map<std::string, int> holders;
    for (const auto& p : st.pods()) {
      if (p.phase() != "Running") continue;
      running.insert(p.uid());
      for (const auto& r : p.running()) {
        for (const std::string& d : r.device_ids()) ++holders[d];
        for (const std::string& d : r.claim_devices()) ++holders[d];
      }
    }
    for (const auto& [uid, p] : pods.running()) {
      if (running.count(uid) == 0) ++killed;
    }
    for (const auto& [d, n] : holders) {
      if (n > 1 && twice.insert(d).second) ++held_twice;
    }
    if (held() >= FLAGS_devices) {
      free_since = absl::InfiniteFuture();
    } else if (free_since == absl::InfiniteFuture()) {
      free_since = absl::Now();
    }
  };
  // The pod of the device plugin that runs from the first phase to the
  // last ("" until it has started).
  std::string legacy;
  bool legacy_pinned = true;
  // Pods the scheduler left pending, retried in order, as it retries them.
  struct Waiting {
    std::string name;
    absl::Time since;
    bool stuck = false;
  };
  std::deque<Waiting> waiting;
  // Starts pod `name`: kOk when it runs, kResourceExhausted when it is
  // pending, another code when it failed (for good: the scheduler does
  // not try it again).
  auto try_start = [&](const std::string& name, Move& m) {
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(name, 1);
    if (p.ok()) {
      const bool dra = p->route == sim::ExtendedResourceRoute::kDra;
      ++m.served[dra ? "dra" : "device-plugin"];
      if (dra && !legacy.empty() && pods.running().count(legacy) > 0) ++m.beside_legacy;
      if (!dra && legacy.empty()) legacy = p->uid;
      return absl::StatusCode::kOk;
    }
    if (p.status().code() == absl::StatusCode::kResourceExhausted) {
      if (absl::StrContains(p.status().message(), "taint")) {
        m.fenced.insert(name);
      } else if (absl::Now() - free_since > kIdleGrace) {
        m.idle.insert(name);
      }
    } else {
      ++m.failed;
      std::cerr << "migration_bench: " << p.status() << "\n";
    }
    return p.status().code();
  };
  auto end_one = [&] {
    std::vector<std::string> uids;
    for (const auto& [uid, p] : pods.running()) {
      if (!(legacy_pinned && uid == legacy)) uids.push_back(uid);
    }
    if (uids.empty()) return false;
    if (absl::Status s = pods.End(uids[rng() % uids.size()]); !s.ok()) {
      std::cerr << "migration_bench: ending a pod: " << s << "\n";
    }
    return true;
  };
  // One step of the stream: a pod starts (three times in five; the first
  // pending one, else a new one) or a running one ends.
  const absl::Duration tick = absl::Seconds(1 / FLAGS_steps_per_second);
  absl::Time next_step = absl::Now();
  auto one_step = [&](Move& m) {
    // The stream's pace: the next step at its time, however long this
    // one took.
    next_step = std::max(next_step + tick, absl::Now());
    ++step;
    if (pods.running().size() <= 1 || rng() % 5 < 3) {
      if (!waiting.empty()) {
        Waiting& w = waiting.front();
        if (try_start(w.name, m) != absl::StatusCode::kResourceExhausted) {
          waiting.pop_front();  // running, or failed for good
        } else if (!w.stuck && absl::Now() - w.since > kStuck) {
          w.stuck = true;
          ++stuck;
        }
      } else {
        ++started;
        const std::string name = absl::StrCat("pod-", step);
        if (try_start(name, m) == absl::StatusCode::kResourceExhausted) {
          ++m.pending;
          waiting.push_back({name, absl::Now()});
        }
      }
    } else {
      end_one();
    }
    check();
  };
  // Polls `start` until it holds (true) or 10 s pass.
  auto keep_trying = [&](const std::function<bool()>& start) {
    return Until(start, [] { absl::SleepFor(absl::Milliseconds(20)); }, absl::Seconds(10));
  };
  // A `both` phase's probe: the pods waiting are started (ending others to
  // make room), the node is brought to exactly one free device, and a pod
  // asks for it. It must run at once, whichever path the scheduler picks.
  auto one_free_probe = [&](Move& m) {
    while (!waiting.empty()) {
      if (held() >= FLAGS_devices) end_one();
      if (!keep_trying([&] {
            return try_start(waiting.front().name, m) != absl::StatusCode::kResourceExhausted;
          })) {
        m.one_free = absl::StrCat("a pending pod did not start");
        return;
      }
      waiting.pop_front();
    }
    while (held() > FLAGS_devices - 1 && end_one()) {
    }
    while (held() < FLAGS_devices - 1) {
      const std::string name = absl::StrCat("fill-", ++step);
      ++started;
      if (!keep_trying([&] { return try_start(name, m) != absl::StatusCode::kResourceExhausted; })) {
        m.one_free = "the node could not be filled";
        return;
      }
    }
    check();
    const std::string name = absl::StrCat("one-free-", ++step);
    ++started;
    absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(name, 1);
    if (!p.ok()) {
      m.one_free = std::string(p.status().message());
      m.idle.insert(name);
      return;
    }
    ++m.served[p->route == sim::ExtendedResourceRoute::kDra ? "dra" : "device-plugin"];
    m.one_free = p->route == sim::ExtendedResourceRoute::kDra ? "ran, via DRA" : "ran, via plugin";
    check();
  };
  auto kubelet_resource = [&](const std::function<bool(const sim::ResourceState&)>& pred) {
    const sim::State st = kubelet.GetState();
    for (const auto& r : st.resources()) {
      if (r.name() == kResource) return pred(r);
    }
    return false;
  };
  // What shows that each path is in effect.
  const std::map<std::string, std::function<bool()>> in_effect = {
      {"both", [&] { return !api.Slices().empty() && kubelet_resource([](const auto& r) {
                             return r.connected();
                           }); }},
      {"dra", [&] { return kubelet_resource([](const auto& r) { return r.allocatable() == 0; }); }},
      {"device-plugin", [&] { return api.Slices().empty(); }},
  };

  const std::vector<std::string> path = {"device-plugin", "both", "dra", "both", "device-plugin"};
  const auto t0 = std::chrono::steady_clock::now();
  double first_move_at_ms = -1;
  // The stream starts once the node's status shows the devices (the
  // kubelet's first status update after the plugin registered).
  if (!Until([&] {
        const Json a = api.Node("node-1").value("/status/allocatable"_json_pointer, Json::object());
        return a.value(kResource, "") == absl::StrCat(FLAGS_devices);
      },
             [] { absl::SleepFor(absl::Milliseconds(20)); }, absl::Seconds(30))) {
    Fail("the node's status never showed the devices");
  }
  for (size_t i = 0; i < path.size(); ++i) {
    Move m;
    m.to = path[i];
    // Looked at every 2 ms; the stream goes on at its pace meanwhile.
    auto meanwhile = [&] {
      if (absl::Now() >= next_step) {
        one_step(m);
      } else {
        absl::SleepFor(std::min(next_step - absl::Now(), absl::Milliseconds(2)));
      }
    };
    // The last phase lets the pinned pod of the device plugin end.
    if (i + 1 == path.size()) legacy_pinned = false;
    if (i > 0) {
      m.from = path[i - 1];
      // Each move right after the kubelet wrote the node's status: the
      // scheduler routes on the status from before the move for a whole
      // period, the worst case. The stream goes on meanwhile.
      const int writes = status_writes.load();
      (void)Until([&] { return status_writes.load() > writes; }, meanwhile, absl::Seconds(15));
      write_config(m.to);
      const auto sent = std::chrono::steady_clock::now();
      if (first_move_at_ms < 0) {
        first_move_at_ms = std::chrono::duration<double, std::milli>(sent - t0).count();
      }
      kill(proxy->pid(), SIGHUP);
      if (Until(in_effect.at(m.to), meanwhile, absl::Seconds(60))) {
        m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent)
                   .count();
      }
    }
    for (int k = 0; k < FLAGS_steps; ++k) {
      absl::SleepFor(next_step - absl::Now());
      one_step(m);
    }
    if (m.to == "both") one_free_probe(m);
    moves.push_back(m);
  }
  // The pods still waiting start as others end; any that cannot is stuck.
  while (!waiting.empty()) {
    if (held() >= FLAGS_devices) end_one();
    if (!Until([&] {
          return try_start(waiting.front().name, moves.back()) !=
                 absl::StatusCode::kResourceExhausted;
        },
               [] { absl::SleepFor(absl::Milliseconds(20)); }, kStuck)) {
      break;
    }
    waiting.pop_front();
  }
  for (const Waiting& w : waiting) {
    if (!w.stuck) ++stuck;
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
      first_move_at_ms / 1000;
  const int64_t streams_after = streams();

  std::cout << absl::StrFormat(
      "Moving a %d-device resource between paths by reloads under a pod stream\n"
      "(one dpproxy serving both sides; pods of 1 device, a pod started or ended %.0f times\n"
      "a second, %d steps after each move, pending pods retried first; the scheduler's\n"
      "route: device plugin while allocatable > 0, else DRA; reconciliation every second\n"
      "frees ended pods' devices; one pod of the device plugin runs until the last phase,\n"
      "the kubelet's endpoint grace is %d s; each move right after a node-status write)\n",
      FLAGS_devices, FLAGS_steps_per_second, FLAGS_steps, FLAGS_endpoint_grace_seconds);
  std::cout << absl::StrFormat("%-24s %10s %11s %8s %8s %7s %5s %7s  %s\n", "move", "in effect",
                               "via plugin", "via DRA", "pending", "fenced", "idle", "failed",
                               "exactly one device free");
  int failed = 0, idle = 0, beside_legacy = 0;
  for (const Move& m : moves) {
    failed += m.failed;
    idle += static_cast<int>(m.idle.size());
    beside_legacy += m.beside_legacy;
    const std::string label = m.from.empty() ? absl::StrCat("(start: ", m.to, ")")
                                             : absl::StrCat(m.from, " -> ", m.to);
    std::cout << absl::StrFormat(
        "%-24s %10s %11d %8d %8d %7d %5d %7d  %s\n", label,
        m.from.empty() ? "-" : m.ms < 0 ? "not in 60s" : absl::StrFormat("%.0fms", m.ms),
        m.served.count("device-plugin") ? m.served.at("device-plugin") : 0,
        m.served.count("dra") ? m.served.at("dra") : 0, m.pending,
        static_cast<int>(m.fenced.size()),
        static_cast<int>(m.idle.size()), m.failed, m.one_free);
  }
  std::cout << absl::StrFormat(
      "%d pods started in %d steps: %d failed, %d stuck (waiting over %ds), %d refused while a "
      "device had been free over %ds, %d running pods lost, %d devices held twice, %d plugin "
      "stream drops (floor: 0 each); %d pods through DRA started beside a pod of the device "
      "plugin; the moves took %.1f s from the first reload to the end of the stream\n",
      started, step, failed, stuck, static_cast<int>(absl::ToInt64Seconds(kStuck)), idle,
      static_cast<int>(absl::ToInt64Seconds(kIdleGrace)), killed, held_twice,
      static_cast<int>(streams_after - streams_before), beside_legacy, total_s);

  plugin->Stop(absl::Seconds(10));
  proxy->Stop(absl::Seconds(10));
  kubelet.Stop();
  api.Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << "migration_bench: a resource moved between the device-plugin path and DRA by\n"
                 "reloads while pods arrive and end. Run it with tools/dev bench migration.\n\n"
                 "Flags:\n"
              << dpproxy::FlagsHelp({"bench/migration_bench.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return dpproxy::Run();
}
