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
// to: no pod failed, no running pod lost, no device held twice, no drop of
// the plugin's stream. A benchmark that prints figures; nothing here has a
// time limit.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
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
};

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
  // The node's status, which the scheduler routes by, as the kubelet
  // writes it: every 10 s, into the Node.
  api.PutNode("node-1", "v1.36.2");
  so.on_node_status = [&api](const std::map<std::string, int64_t>& allocatable) {
    api.SetNodeAllocatable("node-1", allocatable);
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
  int step = 0, killed = 0, held_twice = 0, started = 0;
  std::set<std::string> twice;  // devices seen with two holders
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
  };
  // One step of the stream: a pod of one device starts (three times in
  // five) or a running one ends.
  const absl::Duration tick = absl::Seconds(1 / FLAGS_steps_per_second);
  absl::Time next_step = absl::Now();
  auto one_step = [&](Move& m) {
    // The stream's pace: the next step at its time, however long this
    // one took.
    next_step = std::max(next_step + tick, absl::Now());
    ++step;
    if (pods.running().empty() || rng() % 5 < 3) {
      ++started;
      absl::StatusOr<sim::ExtendedResourcePods::Pod> p = pods.Start(absl::StrCat("pod-", step), 1);
      if (p.ok()) {
        ++m.served[p->route == sim::ExtendedResourceRoute::kDra ? "dra" : "device-plugin"];
      } else if (p.status().code() == absl::StatusCode::kResourceExhausted) {
        ++m.pending;
      } else {
        ++m.failed;
        std::cerr << "migration_bench: " << p.status() << "\n";
      }
    } else {
      auto it = pods.running().begin();
      std::advance(it, rng() % pods.running().size());
      const std::string uid = it->first;
      if (absl::Status s = pods.End(uid); !s.ok()) {
        std::cerr << "migration_bench: ending a pod: " << s << "\n";
      }
    }
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
  for (size_t i = 0; i < path.size(); ++i) {
    Move m;
    m.to = path[i];
    if (i > 0) {
      m.from = path[i - 1];
      write_config(m.to);
      const auto sent = std::chrono::steady_clock::now();
      if (first_move_at_ms < 0) {
        first_move_at_ms = std::chrono::duration<double, std::milli>(sent - t0).count();
      }
      kill(proxy->pid(), SIGHUP);
      // Looked at every 2 ms; the stream goes on at its pace meanwhile.
      auto meanwhile = [&] {
        if (absl::Now() >= next_step) {
          one_step(m);
        } else {
          absl::SleepFor(std::min(next_step - absl::Now(), absl::Milliseconds(2)));
        }
      };
      if (Until(in_effect.at(m.to), meanwhile, absl::Seconds(60))) {
        m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent)
                   .count();
      }
    }
    for (int k = 0; k < FLAGS_steps; ++k) {
      absl::SleepFor(next_step - absl::Now());
      one_step(m);
    }
    moves.push_back(m);
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
      first_move_at_ms / 1000;
  const int64_t streams_after = streams();

  std::cout << absl::StrFormat(
      "Moving a %d-device resource between paths by reloads under a pod stream\n"
      "(one dpproxy serving both sides; pods of 1 device, a pod started or ended %.0f times\n"
      "a second, %d steps after each move; the scheduler's route: device plugin while\n"
      "allocatable > 0, else DRA; reconciliation every second frees ended pods' devices)\n",
      FLAGS_devices, FLAGS_steps_per_second, FLAGS_steps);
  std::cout << absl::StrFormat("%-28s %12s %14s %10s %9s %8s\n", "move", "in effect", "via plugin",
                               "via DRA", "pending", "failed");
  int failed = 0;
  for (const Move& m : moves) {
    failed += m.failed;
    const std::string label = m.from.empty() ? absl::StrCat("(start: ", m.to, ")")
                                             : absl::StrCat(m.from, " -> ", m.to);
    std::cout << absl::StrFormat("%-28s %12s %14d %10d %9d %8d\n", label,
                                 m.from.empty() ? "-"
                                 : m.ms < 0     ? "not in 60 s"
                                                : absl::StrFormat("%.0fms", m.ms),
                                 m.served.count("device-plugin") ? m.served.at("device-plugin") : 0,
                                 m.served.count("dra") ? m.served.at("dra") : 0, m.pending,
                                 m.failed);
  }
  std::cout << absl::StrFormat(
      "%d pods started in %d steps: %d failed, %d running pods lost, %d devices held twice, "
      "%d plugin stream drops (floor: 0 each); the moves took %.1f s from the first reload to "
      "the end of the stream\n",
      started, step, failed, killed, held_twice,
      static_cast<int>(streams_after - streams_before), total_s);

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
