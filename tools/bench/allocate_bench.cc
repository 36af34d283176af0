// allocate_bench: the cost of dpproxy's extra hop. In one run it measures
// Allocate (one container, one device, as the kubelet sends it) directly to
// a sample plugin and through dpproxy to the same plugin, over the same
// sockets with channels made once (as the kubelet does), in interleaved
// blocks so machine noise hits both alike; then prints p50/p99 in
// microseconds, the ratios, and dpproxy's resident memory. A benchmark that
// prints figures, not a test: nothing here has a time limit.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <gflags/gflags.h>
#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/cli/cli.h"
#include "proxy/events/event_log.h"
#include "proxy/state/allocation_response.h"
#include "proxy/state/state_store.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/control.grpc.pb.h"

DEFINE_string(dpproxy, "", "Path of the dpproxy binary.");
DEFINE_string(sample_plugin, "", "Path of the sample_plugin binary.");
DEFINE_string(bare_hop, "", "Path of the bare_hop binary (the forwarding floor).");
DEFINE_string(compare_dpproxy, "",
              "Path of another dpproxy build, to compare with --dpproxy in one run: both "
              "builds are then also run alike (a state directory, the plugin as a static "
              "backend, a kubelet each) and take turns with the other paths in the "
              "throughput rounds, as the rows \"this build\" and \"compared build\".");
DEFINE_int32(iterations, 3000, "Allocate calls per path and plugin version.");
DEFINE_int32(block, 100, "Calls per block; blocks of the paths alternate.");
DEFINE_int32(clients, 8, "Concurrent clients for the throughput figure.");
DEFINE_int32(concurrent_calls, 2000, "Allocate calls per client for the throughput figure.");
DEFINE_int32(concurrent_rounds, 10,
             "Rounds of the throughput figure: the paths take turns, each round every "
             "path making concurrent_calls / concurrent_rounds calls per client.");
DEFINE_int32(startup_allocations, 50000,
             "Allocations in the state for the start-up figure (0: leave it out).");
DEFINE_int32(reconcile_pods, 1000,
             "Pods for the reconciliation figure (0: leave it out).");
DEFINE_int32(flips, 20, "Health flips per list size for the health-flip figure (0: none).");
DEFINE_int32(restarts, 100,
             "Kubelet restarts for the re-registration figure (0: leave it out).");
DEFINE_int32(upgrades, 10,
             "dpproxy upgrades per way and kubelet for the upgrade figure (0: leave it out).");
DEFINE_int32(checkpoint_losses, 3,
             "Kubelet restarts without the checkpoint per kubelet and path for the "
             "checkpoint-loss figure (0: leave it out).");

namespace dpproxy {
namespace {

// The bench's processes: dpproxy, plugins, the bare hop (proxy/util's
// ChildProcess, as dpconform's; output inherited).
using Child = std::unique_ptr<ChildProcess>;

Child Spawn(const std::vector<std::string>& args) {
  ChildSpec spec;
  spec.argv = args;
  absl::StatusOr<Child> child = ChildProcess::Start(spec);
  if (!child.ok()) {
    std::cerr << "allocate_bench: " << child.status().message() << "\n";
    exit(1);
  }
  return *std::move(child);
}

// SIGTERM, and SIGKILL after 10 s; nothing for a process never started.
void Stop(Child& child) {
  if (child != nullptr) child->Stop(absl::Seconds(10));
  child.reset();
}

std::string ProcField(const Child& child, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", child->pid(), "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::string v = line.substr(field.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "?";
}

bool WaitForPath(const std::string& path, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (PathExists(path)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[i];
}

// One Allocate call; returns microseconds, or -1 on error.
using Call = std::function<bool()>;

double TimeOne(const Call& call) {
  auto t0 = std::chrono::steady_clock::now();
  bool ok = call();
  auto t1 = std::chrono::steady_clock::now();
  if (!ok) return -1;
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

Call BetaAllocate(const std::string& socket, int* errors) {
  auto stub = std::shared_ptr<v1beta1::DevicePlugin::Stub>(
      v1beta1::DevicePlugin::NewStub(MakeUnixChannel(socket)));
  auto n = std::make_shared<int>(0);
  return [stub, n, errors] {
    grpc::ClientContext ctx;
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids(absl::StrCat("dev-", (*n)++ % 4));
    v1beta1::AllocateResponse resp;
    bool ok = stub->Allocate(&ctx, req, &resp).ok();
    if (!ok) ++*errors;
    return ok;
  };
}

Call AlphaAllocate(const std::string& socket, int* errors) {
  auto stub = std::shared_ptr<deviceplugin::DevicePlugin::Stub>(
      deviceplugin::DevicePlugin::NewStub(MakeUnixChannel(socket)));
  auto n = std::make_shared<int>(0);
  return [stub, n, errors] {
    grpc::ClientContext ctx;
    deviceplugin::AllocateRequest req;
    req.add_devicesids(absl::StrCat("dev-", (*n)++ % 4));
    deviceplugin::AllocateResponse resp;
    bool ok = stub->Allocate(&ctx, req, &resp).ok();
    if (!ok) ++*errors;
    return ok;
  };
}

// The floor of a durable answer: one 200-byte record written and
// fdatasync'd in a file in the state directory. Appended (the file grows,
// so each fdatasync also writes its size), or overwritten in a file
// preallocated to 1 MiB (only data reaches the disk: the floor the issue
// names, and the way dpproxy's journal writes). A Call, so that the floor
// is measured in the same rotation of blocks as the paths it is compared
// with, under the same load, not alone at a quiet moment.
// The CPU time the calling thread spends in a floor's writes and
// fdatasyncs (user and system), and how many it made.
struct SyncCost {
  std::atomic<int64_t> cpu_ns{0};
  std::atomic<int64_t> syncs{0};
};

int64_t ThreadCpuNs() {
  struct timespec t;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

Call FdatasyncFloor(const std::string& path, bool preallocated, int* errors,
                    std::shared_ptr<SyncCost> cost = nullptr) {
  struct File {
    int fd = -1;
    int n = 0;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  };
  auto f = std::make_shared<File>();
  f->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (f->fd >= 0 && preallocated) {
    const std::string zeros(1 << 20, '\0');
    if (::write(f->fd, zeros.data(), zeros.size()) != static_cast<ssize_t>(zeros.size()) ||
        ::fsync(f->fd) != 0) {
      ::close(f->fd);
      f->fd = -1;
    }
  }
  if (f->fd < 0) std::cerr << "allocate_bench: cannot prepare " << path << "\n";
  return [f, preallocated, errors, cost] {
    static const std::string record(200, 'x');
    const off_t at = static_cast<off_t>(f->n++ % 5000) * record.size();
    const int64_t start = cost != nullptr ? ThreadCpuNs() : 0;
    const ssize_t w = f->fd < 0 ? -1
                      : preallocated ? ::pwrite(f->fd, record.data(), record.size(), at)
                                     : ::write(f->fd, record.data(), record.size());
    const bool ok = w == static_cast<ssize_t>(record.size()) && ::fdatasync(f->fd) == 0;
    if (cost != nullptr) {
      cost->cpu_ns += ThreadCpuNs() - start;
      ++cost->syncs;
    }
    if (!ok) ++*errors;
    return ok;
  };
}

// Throughput from `clients` threads, each with its own channel, per path.
// The paths take turns in rounds (each round: every path in turn, `calls /
// rounds` calls per client), so that a change in the machine's load meets
// every path alike instead of the one measured at that moment.
struct Throughput {
  double per_second = 0;  // over every round
  double max_us = 0;      // the slowest call
  int errors = 0;
  std::vector<double> round_per_second;
  // CPU time per call (us) of the clients (this process), of the process in
  // the middle (none for direct) and of the plugin, over every round: on
  // two shared cores, throughput is bounded by their sum, and unlike
  // calls/s this figure moves little with the machine's other load.
  double client_cpu_us = 0, middle_cpu_us = 0, plugin_cpu_us = 0;
};

// CPU time a process has used (every thread, user and system), seconds; 0
// if it cannot be read.
double CpuSeconds(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/stat") : absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
  // After the command: state is field 3; utime and stime are fields 14, 15.
  if (f.size() < 13) return 0;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime)) return 0;
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// One round of one path: `clients` threads making `calls` calls each.
void ConcurrentRound(std::vector<Call>& c, int calls, Throughput* out, double* seconds) {
  const int clients = static_cast<int>(c.size());
  std::vector<double> worst(clients, 0);
  std::vector<std::thread> threads;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < calls; ++k) worst[i] = std::max(worst[i], TimeOne(c[i]));
    });
  }
  for (auto& t : threads) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *seconds += s;
  out->round_per_second.push_back(clients * calls / s);
  for (double w : worst) out->max_us = std::max(out->max_us, w);
}

// `make(socket, errors)` makes one client's calls for each path's socket;
// `middle[p]` is the process serving path p between the clients and the
// plugin (-1: none), `plugin` the plugin's.
std::vector<Throughput> Concurrent(const std::vector<std::string>& sockets,
                                   const std::vector<pid_t>& middle, pid_t plugin,
                                   const std::function<Call(const std::string&, int*)>& make,
                                   int clients, int calls, int rounds) {
  rounds = std::max(1, std::min(rounds, calls));
  std::vector<Throughput> out(sockets.size());
  std::vector<std::vector<Call>> c(sockets.size());
  std::vector<std::vector<int>> errors(sockets.size(), std::vector<int>(clients, 0));
  for (size_t p = 0; p < sockets.size(); ++p) {
    for (int i = 0; i < clients; ++i) c[p].push_back(make(sockets[p], &errors[p][i]));
    for (auto& call : c[p]) {
      for (int i = 0; i < 20; ++i) call();
    }
    for (int& e : errors[p]) e = 0;  // the warm-up's are not counted
  }
  std::vector<double> seconds(sockets.size(), 0);
  std::vector<double> client_cpu(sockets.size(), 0), middle_cpu(sockets.size(), 0),
      plugin_cpu(sockets.size(), 0);
  for (int r = 0; r < rounds; ++r) {
    const int n = calls / rounds + (r < calls % rounds ? 1 : 0);
    for (size_t p = 0; p < sockets.size(); ++p) {
      const double c0 = CpuSeconds(0), p0 = CpuSeconds(plugin),
                   m0 = middle[p] > 0 ? CpuSeconds(middle[p]) : 0;
      ConcurrentRound(c[p], n, &out[p], &seconds[p]);
      client_cpu[p] += CpuSeconds(0) - c0;
      plugin_cpu[p] += CpuSeconds(plugin) - p0;
      if (middle[p] > 0) middle_cpu[p] += CpuSeconds(middle[p]) - m0;
    }
  }
  const double total = static_cast<double>(clients) * calls;
  for (size_t p = 0; p < sockets.size(); ++p) {
    out[p].per_second = total / seconds[p];
    out[p].client_cpu_us = client_cpu[p] * 1e6 / total;
    out[p].middle_cpu_us = middle_cpu[p] * 1e6 / total;
    out[p].plugin_cpu_us = plugin_cpu[p] * 1e6 / total;
    for (int e : errors[p]) out[p].errors += e;
  }
  return out;
}

// Re-registration after kubelet restarts: `kubelet` is restarted `n` times
// (Stop, then Start: the device-plugins directory wiped, a new kubelet.sock
// listening) and each time the milliseconds until it has `resource`
// registered again are recorded. Restarts alternate between the two
// kubelets so that noise hits both paths alike.
struct Reregistration {
  std::vector<double> direct_ms, proxied_ms;
  int missed = 0;
  int allocations = 0;  // in both kubelets' checkpoints
  int resources = 1;     // registered with each kubelet
};

double RestartAndWait(sim::KubeletSim& kubelet, const std::string& resource, int* missed) {
  const size_t from = kubelet.events().Size();
  if (!kubelet.Restart().ok()) {
    ++*missed;
    return -1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!kubelet.events().WaitForEvent("registered", {{"resource", resource}}, absl::Seconds(10),
                                     from)) {
    ++*missed;
    return -1;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Start-up: dpproxy started on a state directory holding one resource of
// 8 devices and `allocations` allocations, timed from its start to the
// kubelet having that resource registered (from the remembered list, no
// backend needed), and its resident memory once it has: what holding the
// allocations costs. Milliseconds (-1: not registered) and kB.
struct Startup {
  double ms = -1;
  int64_t rss_kb = -1;  // once registered
};

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

// Reconciliation: `pods` pods of one device each admitted through dpproxy,
// then dpproxy's first pass over the kubelet's pod-resources API (which
// names the holder of every allocation and saves the names once), as
// dpproxy reports it (event "reconciled", duration_ms). The floor is one
// List call of the same API by the bench.
struct Reconciliation {
  double pass_ms = -1;
  double list_ms = -1;
  int annotated = 0;
};

// An upgrade of dpproxy while pods are admitted, two ways: a restart (the
// old one stopped, the new one started on the same directories) and a
// takeover (the new one started beside the old one with --takeover). For
// each: how long the kubelet had the resource without every device
// allocatable (from its events: a plugin loss or a smaller list, to all
// four back), and how many pod admissions failed meanwhile.
struct Upgrades {
  std::string kubelet;
  std::vector<double> restart_gap_ms, takeover_gap_ms;
  int restart_failed = 0, takeover_failed = 0, pods = 0;
};

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

// A kubelet restarting without its checkpoint while pods hold devices,
// with the plugin registered directly or behind dpproxy: 4 devices, pods
// holding 2 and 1, then three new pods of 1 (1 device is free), then a
// holder deleted and a pod of 2 admitted at once.
struct CheckpointLoss {
  std::string kubelet, path;
  int running_denied = 0;   // running pods denied or killed at re-admission
  int used_twice = 0;       // devices two running containers use
  int new_failed = 0;       // of the new pods, failed (two of three have no free device)
  int after_delete_failed = 0;
  std::vector<double> delete_to_admit_ms;  // the holder's deletion to the next pod admitted
  int rounds = 0;
};

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

// A health flip seen by the kubelet: the plugin's control API turns one
// device Unhealthy (then Healthy again), and the time until the kubelet
// has the new allocatable count is recorded, for a plugin registered
// directly and one behind dpproxy, alternately.
struct Flips {
  std::vector<double> direct_ms, proxied_ms;
};

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

// Latencies of one plugin's Allocate by path (direct, bare hop, dpproxy
// without and with its journal), measured in alternating blocks.
struct Result {
  std::string label;
  std::vector<std::string> paths;
  std::vector<std::vector<double>> us;
  int errors = 0;
};

void Measure(const std::vector<Call>& calls, Result* r) {
  r->us.assign(calls.size(), {});
  for (int i = 0; i < 200; ++i) {  // warm-up: connections, caches
    for (const Call& c : calls) c();
  }
  int done = 0;
  while (done < FLAGS_iterations) {
    int n = std::min(FLAGS_block, FLAGS_iterations - done);
    for (size_t p = 0; p < calls.size(); ++p) {
      for (int i = 0; i < n; ++i) {
        double us = TimeOne(calls[p]);
        if (us >= 0) r->us[p].push_back(us);
      }
    }
    done += n;
  }
}

int Run() {
  if (FLAGS_dpproxy.empty() || FLAGS_sample_plugin.empty() || FLAGS_bare_hop.empty()) {
    std::cerr << "allocate_bench: --dpproxy, --sample_plugin and --bare_hop are required\n";
    return 2;
  }
  char tmpl[] = "/tmp/dpp-bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  sim::KubeletSimOptions so;
  so.root_dir = dir + "/k";
  so.personality = sim::Personality::kV1Beta1Sync;
  sim::KubeletSim kubelet(so);
  if (!kubelet.Start().ok()) return 1;

  const std::string plugins = dir + "/p";
  Child proxy = Spawn({FLAGS_dpproxy, "--kubelet_root=" + so.root_dir, "--plugin_dir=" + plugins,
                       "--status_file=" + dir + "/status.json",
                       "--state_dir=" + dir + "/state", "--metrics_address=",
                       "--minloglevel=1"});
  // The same dpproxy without a state directory (nothing journaled), on a
  // kubelet of its own, reaching the Allocate plugins as static backends.
  sim::KubeletSimOptions so_nj = so;
  so_nj.root_dir = dir + "/k-nj";
  sim::KubeletSim kubelet_nj(so_nj);
  if (!kubelet_nj.Start().ok()) return 1;
  Child proxy_nj = Spawn(
      {FLAGS_dpproxy, "--kubelet_root=" + so_nj.root_dir, "--plugin_dir=" + dir + "/p-nj",
       "--status_file=", "--state_dir=", "--metrics_address=", "--minloglevel=1",
       "--static_backend=bench.example.com/v1beta1=" + plugins +
           "/bench-v1beta1.sock@v1beta1,bench.example.com/v1alpha=" + plugins +
           "/bench-v1alpha.sock@v1alpha"});
  if (!WaitForPath(plugins + "/kubelet.sock", absl::Seconds(10)) ||
      !WaitForPath(dir + "/p-nj/kubelet.sock", absl::Seconds(10))) {
    std::cerr << "allocate_bench: dpproxy did not start\n";
    return 1;
  }
  // --compare_dpproxy: this build and the other one, started alike, so that
  // a change is measured before and after in the same rounds.
  struct Build {
    std::string label;
    std::unique_ptr<sim::KubeletSim> kubelet;
    Child proxy;
  };
  std::vector<Build> builds;
  if (!FLAGS_compare_dpproxy.empty()) {
    const std::pair<const char*, std::string> which[] = {{"this build", FLAGS_dpproxy},
                                                         {"compared build", FLAGS_compare_dpproxy}};
    for (const auto& [label, binary] : which) {
      const std::string name = absl::StrCat("build", builds.size());
      sim::KubeletSimOptions o = so;
      o.root_dir = absl::StrCat(dir, "/k-", name);
      Build b{label, std::make_unique<sim::KubeletSim>(o), nullptr};
      if (!b.kubelet->Start().ok()) return 1;
      b.proxy = Spawn({binary, "--kubelet_root=" + o.root_dir,
                       absl::StrCat("--plugin_dir=", dir, "/p-", name), "--status_file=",
                       absl::StrCat("--state_dir=", dir, "/state-", name), "--metrics_address=",
                       "--minloglevel=1",
                       "--static_backend=bench.example.com/v1beta1=" + plugins +
                           "/bench-v1beta1.sock@v1beta1"});
      if (!WaitForPath(absl::StrCat(dir, "/p-", name, "/kubelet.sock"), absl::Seconds(10))) {
        std::cerr << "allocate_bench: " << binary << " did not start\n";
        return 1;
      }
      builds.push_back(std::move(b));
    }
  }
  // Re-registration: dpproxy (with a v1beta1 plugin behind it) on the
  // bench's kubelet; the floor is a v1beta1 sample plugin registered
  // directly with a second kubelet of the same personality. Measured while
  // dpproxy serves that one resource, and again at the end, when it serves
  // three (every resource registers again after a restart).
  int rereg_round = 0;
  // `others`: how many more resources dpproxy serves on its kubelet at that
  // point; the floor's kubelet gets as many more plugins, so that both
  // kubelets take the same number of registrations at each restart.
  auto measure_rereg = [&](Reregistration* out, int others) {
    const std::string resource = absl::StrCat("bench.example.com/rereg", rereg_round);
    const std::string sock = absl::StrCat("bench-rereg", rereg_round, ".sock");
    Child behind = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                          "--devices=4", "--socket_name=" + sock,
                          "--kubelet_socket=" + plugins + "/kubelet.sock", "--quiet"});
    sim::KubeletSimOptions so2 = so;
    so2.root_dir = absl::StrCat(dir, "/k-direct", rereg_round++);
    sim::KubeletSim kubelet2(so2);
    // The floor's kubelet starts with the same checkpoint and pods as
    // dpproxy's (after the Allocate phases, some 22,000 allocations): a
    // kubelet rewrites its checkpoint at every registration and list, and
    // that cost belongs to the floor too.
    std::error_code ec;
    std::filesystem::create_directories(kubelet2.device_plugin_dir(), ec);
    std::filesystem::copy_file(kubelet.checkpoint_path(), kubelet2.checkpoint_path(), ec);
    std::filesystem::copy_file(kubelet.pods_path(), kubelet2.pods_path(), ec);
    out->allocations = kubelet.GetState().allocations_size();
    Child direct;
    if (kubelet2.Start().ok()) {
      direct = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                      "--devices=4", "--socket_name=" + sock,
                      "--kubelet_socket=" + kubelet2.kubelet_socket(), "--quiet"});
    }
    std::vector<Child> neighbours;
    bool neighbours_up = true;
    for (int n = 0; n < others; ++n) {
      const std::string other = absl::StrCat(resource, "-neighbour", n);
      neighbours.push_back(Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + other,
                                  "--devices=4", absl::StrCat("--socket_name=neighbour", n, ".sock"),
                                  "--kubelet_socket=" + kubelet2.kubelet_socket(), "--quiet"}));
      neighbours_up = neighbours_up && kubelet2.WaitForResource(other, 4, absl::Seconds(10));
    }
    out->resources = 1 + others;
    if (direct == nullptr || !neighbours_up ||
        !kubelet.WaitForResource(resource, 4, absl::Seconds(10)) ||
        !kubelet2.WaitForResource(resource, 4, absl::Seconds(10))) {
      std::cerr << "allocate_bench: the re-registration plugins did not come up\n";
    } else {
      for (int i = 0; i < FLAGS_restarts; ++i) {
        const double d = RestartAndWait(kubelet2, resource, &out->missed);
        if (d >= 0) out->direct_ms.push_back(d);
        const double p = RestartAndWait(kubelet, resource, &out->missed);
        if (p >= 0) out->proxied_ms.push_back(p);
      }
    }
    Stop(direct);
    for (Child& c : neighbours) Stop(c);
    Stop(behind);
    kubelet2.Stop();
  };
  Reregistration rereg_one, rereg_many;
  if (FLAGS_restarts > 0) measure_rereg(&rereg_one, 0);
  std::vector<Result> results;
  std::vector<std::pair<std::string, Throughput>> many;
  // The CPU of the preallocated fdatasync floor (the journal's, per sync).
  auto sync_cost = std::make_shared<SyncCost>();
  for (const std::string api : {"v1beta1", "v1alpha"}) {
    const std::string resource = absl::StrCat("bench.example.com/", api);
    const std::string sock_name = absl::StrCat("bench-", api, ".sock");
    Child plugin = Spawn({FLAGS_sample_plugin, "--api=" + api, "--resource=" + resource,
                          "--devices=4", "--socket_name=" + sock_name,
                          "--kubelet_socket=" + plugins + "/kubelet.sock", "--quiet"});
    if (!kubelet.WaitForResource(resource, 4, absl::Seconds(10)) ||
        !kubelet_nj.WaitForResource(resource, 4, absl::Seconds(10))) {
      std::cerr << "allocate_bench: " << resource << " did not come up through dpproxy\n";
      Stop(plugin);
      Stop(proxy);
      Stop(proxy_nj);
      return 1;
    }
    auto endpoint = [&](sim::KubeletSim& k) {
      const sim::State state = k.GetState();
      for (const auto& r : state.resources()) {
        if (r.name() == resource) return r.endpoint();
      }
      return std::string();
    };
    const std::string journaled = endpoint(kubelet), unjournaled = endpoint(kubelet_nj);
    const std::string direct_socket = plugins + "/" + sock_name;
    Result r;
    r.label = absl::StrCat(api, " plugin");
    std::vector<Call> calls;
    r.paths.push_back("direct");
    calls.push_back(api == "v1beta1" ? BetaAllocate(direct_socket, &r.errors)
                                     : AlphaAllocate(direct_socket, &r.errors));
    // The bare hop forwards v1beta1 unchanged; it has no v1alpha edge.
    const std::string bare_socket = dir + "/bare.sock";
    const std::string durable_socket = dir + "/bare-durable.sock";
    Child bare, durable;
    if (api == "v1beta1") {
      bare = Spawn({FLAGS_bare_hop, "--listen=" + bare_socket, "--target=" + direct_socket});
      if (!WaitForPath(bare_socket, absl::Seconds(10))) {
        std::cerr << "allocate_bench: bare_hop did not start\n";
        return 1;
      }
      r.paths.push_back("bare hop");
      calls.push_back(BetaAllocate(bare_socket, &r.errors));
      // The floor of a forwarder that makes each call durable before it
      // answers: its file on the state directory's disk.
      durable = Spawn({FLAGS_bare_hop, "--listen=" + durable_socket, "--target=" + direct_socket,
                       "--journal=" + dir + "/state/bare-hop.journal"});
      if (!WaitForPath(durable_socket, absl::Seconds(30))) {
        std::cerr << "allocate_bench: bare_hop --journal did not start\n";
        return 1;
      }
    }
    r.paths.push_back("dpproxy, no journal");
    calls.push_back(BetaAllocate(unjournaled, &r.errors));
    r.paths.push_back("dpproxy");
    calls.push_back(BetaAllocate(journaled, &r.errors));
    if (api == "v1beta1") {
      // The floors, measured in the same rotation (see FdatasyncFloor).
      r.paths.push_back("fdatasync, preallocated");
      calls.push_back(
          FdatasyncFloor(dir + "/state/floor-preallocated", true, &r.errors, sync_cost));
      r.paths.push_back("fdatasync, appended");
      calls.push_back(FdatasyncFloor(dir + "/state/floor-appended", false, &r.errors));
      // The preallocated write again, each right after an Allocate through
      // dpproxy without journal: a sync that follows other work, as the
      // journal's does, takes longer than one of a back-to-back series
      // (about 30 us on this machine's disk); this row's extra over the
      // no-journal row is what one durable write per call costs.
      r.paths.push_back("no journal + fdatasync");
      calls.push_back([allocate = BetaAllocate(unjournaled, &r.errors),
                       sync = FdatasyncFloor(dir + "/state/floor-after-call", true, &r.errors)] {
        return allocate() && sync();
      });
      r.paths.push_back("bare hop, durable");
      calls.push_back(BetaAllocate(durable_socket, &r.errors));
    }
    Measure(calls, &r);
    if (api == "v1beta1") {
      std::vector<std::string> labels = {"direct", "bare hop", "dpproxy, no journal", "dpproxy",
                                         "bare hop, durable"};
      std::vector<std::string> sockets = {direct_socket, bare_socket, unjournaled, journaled,
                                          durable_socket};
      std::vector<pid_t> middles = {-1, bare->pid(), proxy_nj->pid(), proxy->pid(),
                                    durable->pid()};
      for (Build& b : builds) {
        if (!b.kubelet->WaitForResource(resource, 4, absl::Seconds(10))) {
          std::cerr << "allocate_bench: " << resource << " did not come up through the "
                    << b.label << "\n";
          return 1;
        }
        labels.push_back(b.label);
        sockets.push_back(endpoint(*b.kubelet));
        middles.push_back(b.proxy->pid());
      }
      std::vector<Throughput> t =
          Concurrent(sockets, middles, plugin->pid(),
                     [](const std::string& sock, int* e) { return BetaAllocate(sock, e); },
                     FLAGS_clients, FLAGS_concurrent_calls, FLAGS_concurrent_rounds);
      for (size_t p = 0; p < labels.size(); ++p) many.emplace_back(labels[p], std::move(t[p]));
      Stop(bare);
      Stop(durable);
    }
    results.push_back(std::move(r));
    Stop(plugin);
  }
  Stop(proxy_nj);
  kubelet_nj.Stop();
  for (Build& b : builds) {
    Stop(b.proxy);
    b.kubelet->Stop();
  }
  // dpproxy serves the two Allocate resources and the first round's too.
  if (FLAGS_restarts > 0) measure_rereg(&rereg_many, 3);
  // Start-up, three times each, alternating: with the allocations, and the
  // floor (the same resource, no allocations).
  std::vector<double> startup_empty, startup_full, rss_empty, rss_full;
  if (FLAGS_startup_allocations > 0) {
    for (int i = 0; i < 3; ++i) {
      const Startup empty = MeasureStartup(absl::StrCat(dir, "/s", i), 0);
      const Startup full = MeasureStartup(absl::StrCat(dir, "/s", i), FLAGS_startup_allocations);
      startup_empty.push_back(empty.ms);
      startup_full.push_back(full.ms);
      rss_empty.push_back(static_cast<double>(empty.rss_kb));
      rss_full.push_back(static_cast<double>(full.rss_kb));
    }
  }
  Flips flips_small, flips_large;
  if (FLAGS_flips > 0) {
    flips_small = MeasureFlips(dir, plugins, kubelet, 8);
    flips_large = MeasureFlips(dir, plugins, kubelet, 20000);
  }
  Reconciliation reconciliation;
  if (FLAGS_reconcile_pods > 0) reconciliation = ReconcileAtScale(dir, FLAGS_reconcile_pods);
  std::vector<Upgrades> upgrades;
  if (FLAGS_upgrades > 0) {
    // One release per way the kubelet treats a replaced registration: 1.9
    // stops it, 1.10-1.24 ignore its end, 1.25-1.36 disconnect by name.
    for (const char* version : {"1.9", "1.24", "1.25", "1.31", "1.36"}) {
      upgrades.push_back(MeasureUpgrades(dir, version, FLAGS_upgrades));
    }
  }
  std::vector<CheckpointLoss> losses;
  if (FLAGS_checkpoint_losses > 0) {
    for (const char* version : {"1.36", "1.24", "1.18"}) {
      for (bool through : {false, true}) {
        losses.push_back(MeasureCheckpointLoss(dir, version, through, FLAGS_checkpoint_losses));
      }
    }
  }
  const std::string rss = ProcField(proxy, "VmRSS");
  const std::string hwm = ProcField(proxy, "VmHWM");
  const std::string threads = ProcField(proxy, "Threads");
  Stop(proxy);
  kubelet.Stop();

  std::cout << absl::StrFormat(
      "Allocate, one container with one device, %d calls per path, blocks of %d alternating.\n"
      "direct: a client on the plugin's socket; bare hop: a minimal forwarder (gRPC's\n"
      "callback API on both sides as dpproxy, one channel, nothing else); dpproxy: the\n"
      "kubelet's v1beta1 call on dpproxy's socket, translated to the plugin's version,\n"
      "without and with its state directory.\n\n",
      FLAGS_iterations, FLAGS_block);
  std::cout << absl::StrFormat("%-16s %-24s %10s %10s %12s\n", "plugin", "path", "p50", "p99",
                               "p50/direct");
  for (const Result& r : results) {
    const double d50 = Percentile(r.us[0], 0.5);
    for (size_t p = 0; p < r.paths.size(); ++p) {
      const double p50 = Percentile(r.us[p], 0.5);
      // A floor is not an Allocate: no ratio to the direct call.
      const bool floor = absl::StartsWith(r.paths[p], "fdatasync");
      std::cout << absl::StrFormat("%-16s %-24s %8.0fus %8.0fus %s\n", p == 0 ? r.label : "",
                                   r.paths[p], p50, Percentile(r.us[p], 0.99),
                                   floor ? std::string(11, ' ') + "-"
                                         : absl::StrFormat("%11.2fx", p50 / d50));
    }
    if (r.errors > 0) std::cout << "  errors: " << r.errors << "\n";
  }
  if (!results.empty() && results[0].us.size() == 8) {
    // direct, bare hop, no journal, journal, fdatasync preallocated,
    // appended, no journal + fdatasync, bare hop durable
    const auto& u = results[0].us;
    std::cout << "\nfdatasync: 200 bytes written and fdatasync'd in the state directory, in the\n"
                 "same rotation: overwritten in a preallocated file (the floor, as dpproxy's\n"
                 "journal writes), appended (the file grows: its size is synced too), and the\n"
                 "preallocated write made right after each no-journal Allocate (a sync after\n"
                 "other work, as the journal's, is slower than one of a back-to-back series).\n";
    for (const auto& [label, q] : {std::pair<std::string, double>{"p50", 0.5}, {"p99", 0.99}}) {
      const double bare = Percentile(u[1], q), nj = Percentile(u[2], q),
                   j = Percentile(u[3], q), sync = Percentile(u[4], q),
                   after = Percentile(u[6], q) - nj;
      std::cout << absl::StrFormat(
          "v1beta1 %s: dpproxy without journal / bare hop %.2fx (goal <= 1.10); "
          "(journal - no journal) / fdatasync floor %.2f (goal <= 1.2), / one fdatasync "
          "after each call %.2f\n",
          label, nj / bare, (j - nj) / sync, (j - nj) / after);
    }
    std::cout << "The durable bare hop (bare_hop --journal) writes each request to a file and\n"
                 "fdatasyncs it while the plugin answers, group-committed, before answering: the\n"
                 "least a forwarder that keeps its calls on the disk does.\n";
    for (const auto& [label, q] : {std::pair<std::string, double>{"p50", 0.5}, {"p99", 0.99}}) {
      const double bare = Percentile(u[1], q), nj = Percentile(u[2], q),
                   j = Percentile(u[3], q), durable = Percentile(u[7], q);
      std::cout << absl::StrFormat(
          "v1beta1 %s: dpproxy with journal / durable bare hop %.2fx; the journal's cost "
          "(journal - no journal) / the durable hop's (durable - bare) %.2f\n",
          label, durable > 0 ? j / durable : 0, durable > bare ? (j - nj) / (durable - bare) : 0);
    }
  }

  std::cout << absl::StrFormat(
      "\nAllocate from %d concurrent clients, %d calls each in %d rounds (the paths take\n"
      "turns; v1beta1 plugin; each answer through dpproxy with its journal waits for its\n"
      "reservation's fdatasync, made while the plugin answers and shared by the calls\n"
      "that arrive meanwhile). /direct: over every round; per round: the median and the\n"
      "range of each round's ratio to the direct round before it.\n",
      FLAGS_clients, FLAGS_concurrent_calls, std::max(1, std::min(FLAGS_concurrent_rounds,
                                                                  FLAGS_concurrent_calls)));
  std::cout << absl::StrFormat("%-22s %10s %10s %8s %22s %7s\n", "path", "calls/s", "slowest",
                               "/direct", "per round: median (range)", "errors");
  for (const auto& [path, t] : many) {
    std::vector<double> ratios;
    const auto& direct = many[0].second.round_per_second;
    for (size_t r = 0; r < t.round_per_second.size() && r < direct.size(); ++r) {
      ratios.push_back(t.round_per_second[r] / direct[r]);
    }
    std::cout << absl::StrFormat("%-22s %10.0f %8.1fms %7.2fx %9.2fx (%.2f-%.2f) %7d\n", path,
                                 t.per_second, t.max_us / 1000,
                                 t.per_second / many[0].second.per_second,
                                 Percentile(ratios, 0.5), Percentile(ratios, 0.0),
                                 Percentile(ratios, 1.0), t.errors);
  }
  if (!many.empty()) {
    std::cout << "\nCPU time per call in those rounds (us; every thread, user and system):\n";
    std::cout << absl::StrFormat("%-22s %10s %10s %10s %10s %14s\n", "path", "clients",
                                 "middle", "plugin", "total", "total/direct");
    for (const auto& [path, t] : many) {
      const double total = t.client_cpu_us + t.middle_cpu_us + t.plugin_cpu_us;
      const auto& d = many[0].second;
      const double direct = d.client_cpu_us + d.middle_cpu_us + d.plugin_cpu_us;
      std::cout << absl::StrFormat("%-22s %10.1f %10.1f %10.1f %10.1f %13.2fx\n", path,
                                   t.client_cpu_us, t.middle_cpu_us, t.plugin_cpu_us, total,
                                   direct > 0 ? total / direct : 0);
    }
    auto row = [&](const std::string& label) -> const Throughput* {
      for (const auto& [path, t] : many) {
        if (path == label) return &t;
      }
      return nullptr;
    };
    if (many.size() >= 4) {
      const double bare = many[1].second.middle_cpu_us;
      std::cout << absl::StrFormat(
          "dpproxy's CPU per call / the bare hop's: no journal %.2fx, with journal %.2fx\n",
          bare > 0 ? many[2].second.middle_cpu_us / bare : 0,
          bare > 0 ? many[3].second.middle_cpu_us / bare : 0);
      // The journal's floor: what one durable write costs the thread that
      // makes it, on this disk, measured in the same run.
      if (sync_cost->syncs > 0) {
        const double per_sync =
            static_cast<double>(sync_cost->cpu_ns) / 1000.0 / static_cast<double>(sync_cost->syncs);
        const double extra = many[3].second.middle_cpu_us - many[2].second.middle_cpu_us;
        std::cout << absl::StrFormat(
            "the journal's CPU per call (with - without): %.1f us; one 200-byte write and\n"
            "fdatasync costs its thread %.1f us of CPU (the preallocated floor, same run): "
            "%.2f of them\n",
            extra, per_sync, per_sync > 0 ? extra / per_sync : 0);
      }
    }
    if (const Throughput *durable = row("bare hop, durable"), *journal = row("dpproxy");
        many.size() >= 4 && durable != nullptr && journal != nullptr) {
      const double bare = many[1].second.middle_cpu_us;
      const double nj = many[2].second.middle_cpu_us;
      std::cout << absl::StrFormat(
          "the durable bare hop's CPU per call / the bare hop's: %.2fx; dpproxy with its\n"
          "journal against the durable bare hop: CPU per call %.2fx, calls/s %.2f; the\n"
          "journal's CPU per call (with - without) / the durable hop's (durable - bare): "
          "%.2f\n",
          bare > 0 ? durable->middle_cpu_us / bare : 0,
          durable->middle_cpu_us > 0 ? journal->middle_cpu_us / durable->middle_cpu_us : 0,
          durable->per_second > 0 ? journal->per_second / durable->per_second : 0,
          durable->middle_cpu_us > bare
              ? (journal->middle_cpu_us - nj) / (durable->middle_cpu_us - bare)
              : 0);
    }
    if (builds.size() == 2) {
      const Throughput *mine = row(builds[0].label), *other = row(builds[1].label);
      const double bare = many[1].second.middle_cpu_us;
      if (mine != nullptr && other != nullptr) {
        std::cout << absl::StrFormat(
            "this build and the compared one (journal, static backend), CPU per call / the "
            "bare hop's:\n%.2fx and %.2fx; the compared build's CPU per call is %.2f of this "
            "build's, its calls/s %.2f of this build's\n",
            bare > 0 ? mine->middle_cpu_us / bare : 0, bare > 0 ? other->middle_cpu_us / bare : 0,
            mine->middle_cpu_us > 0 ? other->middle_cpu_us / mine->middle_cpu_us : 0,
            mine->per_second > 0 ? other->per_second / mine->per_second : 0);
      }
    }
  }
  if (FLAGS_restarts > 0) {
    std::cout << absl::StrFormat(
        "\nRe-registration after %d kubelet restarts (v1beta1-sync kubelet; from the\n"
        "restarted kubelet being up to the resource registered again)\n",
        FLAGS_restarts);
    std::cout << absl::StrFormat("%-40s %9s %9s %9s %9s\n", "path", "p50", "p90", "p99", "max");
    auto row = [](const std::string& label, const std::vector<double>& v) {
      std::cout << absl::StrFormat("%-40s %7.1fms %7.1fms %7.1fms %7.1fms\n", label,
                                   Percentile(v, 0.5), Percentile(v, 0.9), Percentile(v, 0.99),
                                   Percentile(v, 1.0));
    };
    for (const Reregistration* r : {&rereg_one, &rereg_many}) {
      row(r->resources == 1 ? "1 plugin direct (floor)"
                            : absl::StrCat(r->resources, " plugins direct (floor)"),
          r->direct_ms);
      row(absl::StrCat("via dpproxy serving ", r->resources,
                       r->resources == 1 ? " resource" : " resources"),
          r->proxied_ms);
    }
    std::cout << absl::StrFormat(
        "(one resource timed; the kubelet registers the others at the same restart. The\n"
        "second pair runs after the Allocate phases: dpproxy's journal holds their\n"
        "allocations, which reached it directly; both kubelets of a pair start from the\n"
        "same checkpoint, %d allocations)\n",
        rereg_many.allocations);
    const int missed = rereg_one.missed + rereg_many.missed;
    if (missed > 0) std::cout << missed << " restart(s) not re-registered in 10 s\n";
  }
  if (FLAGS_startup_allocations > 0) {
    std::cout << absl::StrFormat(
        "\nStart-up to the first resource registered (remembered list, no backend),\n"
        "median of 3 (-1: it did not register within 60 s)\n");
    std::cout << absl::StrFormat("%-40s %9.0fms\n", "no allocations (floor)",
                                 Percentile(startup_empty, 0.5));
    std::cout << absl::StrFormat("%-40s %9.0fms\n",
                                 absl::StrCat(FLAGS_startup_allocations, " allocations"),
                                 Percentile(startup_full, 0.5));
    // What holding them costs: the resident memory of the two starts once
    // registered (what the load freed and glibc kept included).
    const double empty_kb = Percentile(rss_empty, 0.5), full_kb = Percentile(rss_full, 0.5);
    std::cout << absl::StrFormat(
        "resident memory then: %.1f MB with none, %.1f MB with %d: %.0f bytes per allocation "
        "held (goal <= 300)\n",
        empty_kb / 1024, full_kb / 1024, FLAGS_startup_allocations,
        (full_kb - empty_kb) * 1024 / FLAGS_startup_allocations);
  }
  if (FLAGS_flips > 0) {
    std::cout << absl::StrFormat(
        "\nHealth flip seen by the kubelet (the plugin's control API, to the kubelet's new\n"
        "allocatable count), %d flips each way\n",
        FLAGS_flips);
    std::cout << absl::StrFormat("%-22s %12s %12s %14s %14s %9s\n", "devices", "direct p50",
                                 "direct p99", "dpproxy p50", "dpproxy p99", "p50 ratio");
    for (const auto& [label, f] : {std::pair<std::string, const Flips*>{"8", &flips_small},
                                   {"20,000", &flips_large}}) {
      const double dp50 = Percentile(f->direct_ms, 0.5), pp50 = Percentile(f->proxied_ms, 0.5);
      std::cout << absl::StrFormat("%-22s %10.1fms %10.1fms %12.1fms %12.1fms %8.2fx\n", label,
                                   dp50, Percentile(f->direct_ms, 0.99), pp50,
                                   Percentile(f->proxied_ms, 0.99), dp50 > 0 ? pp50 / dp50 : 0);
    }
  }
  if (FLAGS_reconcile_pods > 0) {
    std::cout << absl::StrFormat(
        "\nReconciliation, first pass over %d pods (-1: not seen within 30 s)\n"
        "%-40s %9.1fms\n%-40s %9.1fms (%d allocations named)\n",
        FLAGS_reconcile_pods, "pod-resources List (floor)", reconciliation.list_ms,
        "dpproxy's pass", reconciliation.pass_ms, reconciliation.annotated);
  }
  if (!upgrades.empty()) {
    std::cout << absl::StrFormat(
        "\nUpgrading dpproxy while pods are admitted one after another, %d times each way\n"
        "(restart: stop, then start on the same directories; takeover: --takeover beside\n"
        "the running one). Gap: how long the kubelet had fewer than all 4 devices\n"
        "allocatable (-1: not back). Floor: no gap, no failed pod.\n",
        FLAGS_upgrades);
    std::cout << absl::StrFormat("%-8s %-10s %10s %10s %14s\n", "kubelet", "way", "gap p50",
                                 "gap max", "pods failed");
    for (const Upgrades& u : upgrades) {
      for (const auto& [way, gaps, failed] :
           {std::tuple<std::string, const std::vector<double>*, int>{"restart", &u.restart_gap_ms,
                                                                      u.restart_failed},
            {"takeover", &u.takeover_gap_ms, u.takeover_failed}}) {
        std::cout << absl::StrFormat("%-8s %-10s %8.0fms %8.0fms %14d\n", u.kubelet, way,
                                     Percentile(*gaps, 0.5), Percentile(*gaps, 1.0), failed);
      }
    }
    for (const Upgrades& u : upgrades) {
      std::cout << absl::StrFormat("(%s: %d pods in all)\n", u.kubelet, u.pods);
    }
    std::cout << "(1.25-1.36 disconnect whatever client holds the resource's name when the\n"
                 "old dpproxy's stream ends, kubernetes#121994; the new one empties that entry\n"
                 "first, so the end disconnects nothing)\n";
  }
  if (!losses.empty()) {
    std::cout << absl::StrFormat(
        "\nKubelet restarts without its checkpoint, %d each, the plugin registered directly\n"
        "or behind dpproxy: pods of 2 and 1 of 4 devices run; then 3 new pods of 1 (1\n"
        "device is free), then a holder deleted and a pod of 2 admitted at once.\n"
        "Floor: no running pod denied, no device used twice, 2 new pods failed per round,\n"
        "the pod after the deletion admitted.\n",
        FLAGS_checkpoint_losses);
    std::cout << absl::StrFormat("%-8s %-8s %14s %11s %15s %20s %15s\n", "kubelet", "path",
                                 "running denied", "used twice", "new pods failed",
                                 "deletion to admit p50", "after deletion");
    for (const CheckpointLoss& l : losses) {
      std::cout << absl::StrFormat(
          "%-8s %-8s %14d %11d %11d of %d %18.0fms %9d failed\n", l.kubelet, l.path,
          l.running_denied, l.used_twice, l.new_failed, 3 * l.rounds,
          Percentile(l.delete_to_admit_ms, 0.5), l.after_delete_failed);
    }
  }
  std::cout << "\ndpproxy resident memory after the run: " << rss << " (peak " << hwm << "), "
            << threads << " threads\n";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  if (dpproxy::WantsHelp(argc, argv)) {
    std::cout << "allocate_bench: Allocate through dpproxy beside its floors (direct, a bare\n"
                 "hop, the bare hop made durable, fdatasync), re-registration, start-up,\n"
                 "reconciliation and health flips at scale. Run it with tools/dev bench.\n\n"
                 "Flags:\n"
              << dpproxy::FlagsHelp({"bench/allocate_bench.cc"});
    return 0;
  }
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return dpproxy::Run();
}
