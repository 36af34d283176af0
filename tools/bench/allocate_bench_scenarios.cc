// allocate_bench's scenarios beyond the Allocate paths (allocate_bench.h):
// start-up with allocations, dpproxy upgraded under a pod stream, kubelet
// restarts without the checkpoint, reconciliation at scale, health flips.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>
#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/events/event_log.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/state_store.h"
#include "proxy/util/files.h"
#include "tools/bench/allocate_bench.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/control.grpc.pb.h"

DECLARE_string(dpproxy);
DECLARE_string(sample_plugin);
DECLARE_int32(flips);

namespace dpproxy::bench {

int64_t KiloBytes(const std::string& proc_field) {  // "1234 kB"
  int64_t kb = -1;
  return absl::SimpleAtoi(proc_field.substr(0, proc_field.find(' ')), &kb) ? kb : -1;
}

Startup MeasureStartup(const std::string& dir, int allocations) {
  const std::string state_dir = absl::StrCat(dir, "/startup-", allocations);
  if (!MakeDirs(state_dir).ok()) return Startup();
  ::chmod(state_dir.c_str(), 0700);
  state::State st;
  state::Resource* r = st.add_resources();
  r->set_name("bench.example.com/startup");
  r->set_kubelet_api("v1beta1");
  r->mutable_backend()->set_endpoint(dir + "/gone.sock");
  r->mutable_backend()->set_api_version("v1beta1");
  for (int i = 0; i < 8; ++i) {
    v1beta1::Device* d = r->add_devices();
    d->set_id(absl::StrCat("dev-", i));
    d->set_health("Healthy");
  }
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < allocations; ++i) {
    state::Allocation* a = st.add_allocations();
    a->set_id(static_cast<uint64_t>(i + 1));
    a->set_resource("bench.example.com/startup");
    a->add_device_ids(absl::StrCat("dev-", i % 8));
    v1beta1::ContainerAllocateResponse r;
    (*r.mutable_envs())["BENCH_DEVICE"] = absl::StrCat("dev-", i % 8);
    SetResponse(a, r);
    a->set_backend_api("v1beta1");
    a->set_allocated_unix_ms(now_ms);
    a->set_pod_namespace("default");
    a->set_pod_name(absl::StrCat("pod-", i));
    a->set_container("main");
  }
  st.set_next_allocation_id(static_cast<uint64_t>(allocations + 1));
  if (!FileStateStore(state_dir + "/state.pb").Save(st).ok()) return Startup();
  sim::KubeletSimOptions so;
  so.root_dir = state_dir + "-k";
  so.personality = sim::Personality::kV1Beta1Sync;
  sim::KubeletSim kubelet(so);
  if (!kubelet.Start().ok()) return Startup();
  const auto t0 = std::chrono::steady_clock::now();
  Child proxy = Spawn({FLAGS_dpproxy, "--kubelet_root=" + so.root_dir,
                       "--plugin_dir=" + state_dir + "-p", "--state_dir=" + state_dir,
                       "--status_file=", "--metrics_address=", "--reconcile_interval=0s",
                       "--minloglevel=1"});
  const bool up = kubelet.events()
                      .WaitForEvent("registered", {{"resource", "bench.example.com/startup"}},
                                    absl::Seconds(60))
                      .has_value();
  Startup out;
  out.ms = up ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count()
              : -1;
  out.rss_kb = KiloBytes(ProcField(proxy, "VmRSS"));
  Stop(proxy);
  kubelet.Stop();
  return out;
}



// Milliseconds from the first event since `from` in which the kubelet had
// fewer than `devices` allocatable (or lost the plugin) to the next in
// which it had them all again; 0 if there was none.
double GapMs(sim::KubeletSim& kubelet, size_t from, int devices) {
  std::optional<absl::Time> lost;
  for (const Json& e : kubelet.events().Since(from)) {
    const std::string kind = e.value("event", "");
    absl::Time t;
    std::string err;
    if (!absl::ParseTime("%Y-%m-%dT%H:%M:%E3SZ", e.value("ts", ""), &t, &err)) continue;
    const bool down = kind == "plugin_lost" ||
                      (kind == "devices" && e.value("allocatable", 0) < devices);
    if (down && !lost.has_value()) lost = t;
    if (lost.has_value() && kind == "devices" && e.value("allocatable", 0) >= devices) {
      return absl::ToDoubleMilliseconds(t - *lost);
    }
  }
  return lost.has_value() ? -1 : 0;  // -1: not back
}

Upgrades MeasureUpgrades(const std::string& dir, const std::string& version, int rounds) {
  Upgrades out;
  out.kubelet = version;
  const std::string base = absl::StrCat(dir, "/upgrade-", version);
  sim::KubeletSimOptions so;
  so.root_dir = base + "-k";
  absl::StatusOr<sim::KubeletVersion> v = sim::ParseKubeletVersion(version);
  if (!v.ok()) return out;
  so.kubelet = *v;
  sim::KubeletSim kubelet(so);
  if (!kubelet.Start().ok()) return out;
  const std::string resource = "bench.example.com/upgrade";
  auto start_proxy = [&](bool takeover) {
    std::vector<std::string> args = {
        FLAGS_dpproxy, "--kubelet_root=" + so.root_dir, "--plugin_dir=" + base + "-p",
        "--state_dir=" + base + "-s", "--status_file=", "--metrics_address=",
        "--minloglevel=1"};
    if (takeover) args.push_back("--takeover");
    return Spawn(args);
  };
  Child proxy = start_proxy(false);
  Child plugin;
  if (WaitForPath(base + "-p/kubelet.sock", absl::Seconds(10))) {
    plugin = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                    "--devices=4", "--socket_name=bench-upgrade.sock",
                    "--kubelet_socket=" + base + "-p/kubelet.sock", "--quiet"});
  }
  if (plugin == nullptr || !kubelet.WaitForResource(resource, 4, absl::Seconds(10))) {
    std::cerr << "allocate_bench: the upgrade figure's resource did not come up\n";
    Stop(plugin);
    Stop(proxy);
    return out;
  }
  // Pods admitted one after another (each deleted once admitted).
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0}, admitted{0};
  std::thread pods([&] {
    for (int i = 0; !stop; ++i) {
      sim::AllocateRequest r;
      r.set_pod_name(absl::StrCat("upgrade-", i));
      auto* c = r.add_containers();
      c->set_name("main");
      c->set_resource(resource);
      c->set_count(1);
      absl::StatusOr<sim::AllocateResponse> a = kubelet.Allocate(r);
      if (!a.ok()) {
        ++failed;
        continue;
      }
      ++admitted;
      (void)kubelet.DeletePod(a->pod_uid());
    }
  });
  for (int i = 0; i < rounds; ++i) {
    for (bool takeover : {false, true}) {
      const size_t from = kubelet.events().Size();
      const int failed_before = failed.load();
      Child next;
      if (takeover) {
        next = start_proxy(true);
        // The old one exits by itself once the new one is registered.
        const std::optional<int> exited = proxy->Wait(absl::Seconds(30));
        if (!exited.has_value()) std::cerr << "allocate_bench: no handoff within 30 s\n";
        Stop(proxy);
      } else {
        Stop(proxy);
        next = start_proxy(false);
      }
      proxy = std::move(next);
      kubelet.WaitForResource(resource, 4, absl::Seconds(10));
      // Pods go on through the new one before the next upgrade.
      const int mark = admitted.load();
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (admitted.load() < mark + 3 && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(5));  // a bench's pacing, not a test's wait
      }
      (takeover ? out.takeover_gap_ms : out.restart_gap_ms).push_back(GapMs(kubelet, from, 4));
      (takeover ? out.takeover_failed : out.restart_failed) += failed.load() - failed_before;
    }
  }
  stop = true;
  pods.join();
  out.pods = admitted.load() + failed.load();
  Stop(proxy);
  Stop(plugin);
  kubelet.Stop();
  return out;
}


int UsedTwice(const sim::State& st) {
  int n = 0;
  for (const auto& r : st.resources()) {
    for (const auto& d : r.devices()) n += d.used_by_size() > 1;
  }
  return n;
}

sim::AllocateRequest OnePod(const std::string& name, const std::string& resource, int count) {
  sim::AllocateRequest r;
  r.set_pod_name(name);
  auto* c = r.add_containers();
  c->set_name("main");
  c->set_resource(resource);
  c->set_count(count);
  return r;
}

CheckpointLoss MeasureCheckpointLoss(const std::string& dir, const std::string& version,
                                     bool through_dpproxy, int rounds) {
  CheckpointLoss out;
  out.kubelet = version;
  out.path = through_dpproxy ? "dpproxy" : "direct";
  const std::string base = absl::StrCat(dir, "/ckpt-", version, "-", out.path);
  absl::StatusOr<sim::KubeletVersion> v = sim::ParseKubeletVersion(version);
  if (!v.ok()) return out;
  const std::string resource = "bench.example.com/held";
  for (int round = 0; round < rounds; ++round) {
    const std::string root = absl::StrCat(base, "-", round);
    sim::KubeletSimOptions so;
    so.root_dir = root + "-k";
    so.kubelet = *v;
    sim::KubeletSim kubelet(so);
    if (!kubelet.Start().ok()) return out;
    Child proxy, plugin;
    const std::string events = root + "-events.jsonl";
    std::string plugin_kubelet = kubelet.kubelet_socket();
    if (through_dpproxy) {
      proxy = Spawn({FLAGS_dpproxy, "--kubelet_root=" + so.root_dir, "--plugin_dir=" + root + "-p",
                     "--state_dir=" + root + "-s", "--status_file=", "--metrics_address=",
                     "--reconcile_interval=1s", "--events=" + events, "--minloglevel=1"});
      plugin_kubelet = root + "-p/kubelet.sock";
      if (!WaitForPath(plugin_kubelet, absl::Seconds(10))) return out;
    }
    plugin = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                    "--devices=4", "--socket_name=bench-held.sock",
                    "--kubelet_socket=" + plugin_kubelet, "--quiet"});
    if (!kubelet.WaitForResource(resource, 4, absl::Seconds(10))) {
      std::cerr << "allocate_bench: the checkpoint-loss figure's resource did not come up\n";
      return out;
    }
    absl::StatusOr<sim::AllocateResponse> a = kubelet.Allocate(OnePod("a", resource, 2));
    absl::StatusOr<sim::AllocateResponse> b = kubelet.Allocate(OnePod("b", resource, 1));
    if (!a.ok() || !b.ok()) return out;
    if (through_dpproxy) {
      // dpproxy has named the pods (its first pass, 1 s after start).
      const absl::Time until = absl::Now() + absl::Seconds(30);
      while (absl::Now() < until) {
        absl::StatusOr<std::string> text = ReadFile(events);
        if (text.ok() && absl::StrContains(*text, "\"annotated\":2")) break;
        absl::SleepFor(absl::Milliseconds(20));  // a bench's pacing on a file it cannot watch
      }
    }
    kubelet.Stop();
    (void)::unlink(kubelet.checkpoint_path().c_str());
    if (!kubelet.Start().ok()) return out;
    kubelet.WaitForResource(resource, 4, absl::Seconds(10));
    kubelet.WaitForPodsSynced(absl::Seconds(10));
    const sim::State synced = kubelet.GetState();
    for (const auto& p : synced.pods()) out.running_denied += p.phase() != "Running";
    for (const char* name : {"c", "d", "e"}) {
      out.new_failed += !kubelet.Allocate(OnePod(name, resource, 1)).ok();
    }
    const absl::Time deleted = absl::Now();
    (void)kubelet.DeletePod(a->pod_uid());
    if (kubelet.Allocate(OnePod("f", resource, 2)).ok()) {
      out.delete_to_admit_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - deleted));
    } else {
      ++out.after_delete_failed;
    }
    out.used_twice += UsedTwice(kubelet.GetState());
    ++out.rounds;
    Stop(plugin);
    Stop(proxy);
    kubelet.Stop();
  }
  return out;
}

Reconciliation ReconcileAtScale(const std::string& dir, int pods) {
  Reconciliation out;
  const std::string base = dir + "/reconcile";
  sim::KubeletSimOptions so;
  so.root_dir = base + "-k";
  so.personality = sim::Personality::kV1Beta1Sync;
  sim::KubeletSim kubelet(so);
  if (!kubelet.Start().ok()) return out;
  const std::string events = base + "-events.jsonl";
  // Admission with reconciliation off, so that no pod is named before the
  // pass that is timed.
  auto start_proxy = [&](const std::string& interval) {
    return Spawn({FLAGS_dpproxy, "--kubelet_root=" + so.root_dir, "--plugin_dir=" + base + "-p",
                  "--state_dir=" + base + "-s", "--status_file=", "--metrics_address=",
                  "--events=" + events, "--reconcile_interval=" + interval,
                  "--minloglevel=1"});
  };
  Child proxy = start_proxy("0s");
  const std::string resource = "bench.example.com/reconcile";
  if (WaitForPath(base + "-p/kubelet.sock", absl::Seconds(10))) {
    Child plugin = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                          absl::StrCat("--devices=", pods), "--socket_name=bench-reconcile.sock",
                          "--kubelet_socket=" + base + "-p/kubelet.sock", "--quiet"});
    bool admitted = kubelet.WaitForResource(resource, pods, absl::Seconds(20));
    for (int i = 0; admitted && i < pods; ++i) {
      sim::AllocateRequest r;
      r.set_pod_name(absl::StrCat("pod-", i));
      auto* c = r.add_containers();
      c->set_name("main");
      c->set_resource(resource);
      c->set_count(1);
      admitted = kubelet.Allocate(r).ok();
    }
    // dpproxy restarted with every allocation journaled and no pod named
    // yet: its first pass, 10 s after its start, names them all.
    Stop(proxy);
    proxy = start_proxy("1m");
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (admitted && out.pass_ms < 0 && absl::Now() < deadline) {
      std::ifstream in(events);
      std::string line;
      while (std::getline(in, line)) {
        Json e = Json::parse(line, nullptr, false);
        if (e.is_discarded() || e.value("event", "") != "reconciled") continue;
        if (e.value("pods", 0) != pods) continue;
        out.pass_ms = e.value("duration_ms", -1.0);
        out.annotated = e.value("annotated", 0);
        break;
      }
      if (out.pass_ms < 0) absl::SleepFor(absl::Milliseconds(100));  // polling a file
    }
    if (admitted) {
      auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(kubelet.pod_resources_socket()));
      std::vector<double> lists;
      for (int i = 0; i < 5; ++i) {
        grpc::ClientContext ctx;
        v1::ListPodResourcesResponse resp;
        const auto t0 = std::chrono::steady_clock::now();
        if (stub->List(&ctx, v1::ListPodResourcesRequest(), &resp).ok()) {
          lists.push_back(std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
        }
      }
      out.list_ms = Percentile(lists, 0.5);
    }
    Stop(plugin);
  }
  Stop(proxy);
  kubelet.Stop();
  return out;
}


double FlipOnce(const std::string& control_socket, sim::KubeletSim& kubelet,
                const std::string& resource, const std::string& device,
                const std::string& health, int expect_allocatable) {
  auto stub = sample::PluginControl::NewStub(MakeUnixChannel(control_socket));
  const size_t from = kubelet.events().Size();
  const auto t0 = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  sample::SetHealthRequest req;
  req.set_device_id(device);
  req.set_health(health);
  sample::PluginStatus status;
  if (!stub->SetHealth(&ctx, req, &status).ok()) return -1;
  const auto seen = kubelet.events().WaitFor(
      [&](const Json& e) {
        return e.value("event", "") == "devices" && e.value("resource", "") == resource &&
               e.contains("allocatable") && e["allocatable"].is_number() &&
               e["allocatable"].get<int>() == expect_allocatable;
      },
      absl::Seconds(20), from);
  if (!seen) return -1;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
      .count();
}

Flips MeasureFlips(const std::string& dir, const std::string& proxy_plugins,
                   sim::KubeletSim& proxied_kubelet, int devices) {
  Flips out;
  const std::string resource = absl::StrCat("bench.example.com/flip", devices);
  sim::KubeletSimOptions so;
  so.root_dir = absl::StrCat(dir, "/flip-k", devices);
  so.personality = sim::Personality::kV1Beta1Sync;
  sim::KubeletSim direct_kubelet(so);
  if (!direct_kubelet.Start().ok()) return out;
  const std::string ctl_direct = absl::StrCat(dir, "/flip-direct", devices, ".ctl");
  const std::string ctl_proxied = absl::StrCat(dir, "/flip-proxied", devices, ".ctl");
  const std::string sock = absl::StrCat("bench-flip", devices, ".sock");
  Child direct = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                        absl::StrCat("--devices=", devices), "--socket_name=" + sock,
                        "--kubelet_socket=" + direct_kubelet.kubelet_socket(),
                        "--control_socket=" + ctl_direct, "--quiet"});
  Child behind = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                        absl::StrCat("--devices=", devices), "--socket_name=" + sock,
                        "--kubelet_socket=" + proxy_plugins + "/kubelet.sock",
                        "--control_socket=" + ctl_proxied, "--quiet"});
  if (direct_kubelet.WaitForResource(resource, devices, absl::Seconds(30)) &&
      proxied_kubelet.WaitForResource(resource, devices, absl::Seconds(30)) &&
      WaitForPath(ctl_direct, absl::Seconds(10)) && WaitForPath(ctl_proxied, absl::Seconds(10))) {
    for (int i = 0; i < FLAGS_flips; ++i) {
      const std::string device = absl::StrCat("dev-", i % devices);
      for (const char* health : {"Unhealthy", "Healthy"}) {
        const int expect = std::string(health) == "Healthy" ? devices : devices - 1;
        const double d = FlipOnce(ctl_direct, direct_kubelet, resource, device, health, expect);
        if (d >= 0) out.direct_ms.push_back(d);
        const double p = FlipOnce(ctl_proxied, proxied_kubelet, resource, device, health, expect);
        if (p >= 0) out.proxied_ms.push_back(p);
      }
    }
  }
  Stop(direct);
  Stop(behind);
  direct_kubelet.Stop();
  return out;
}

}  // namespace dpproxy::bench
