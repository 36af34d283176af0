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
#include "tools/bench/allocate_bench.h"
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

namespace dpproxy::bench {



namespace {

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


int64_t ThreadCpuNs() {
  struct timespec t;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// The floor of a durable answer: one 200-byte record written and
// fdatasync'd in a file in the state directory. Appended (the file grows,
// so each fdatasync also writes its size), or overwritten in a file
// preallocated to 1 MiB (only data reaches the disk, as dpproxy's journal
// writes: the floor it is judged against). A Call, so that the floor is
// measured in the same rotation of blocks as the paths it is compared with,
// under the same load, not alone at a quiet moment.
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

// The bench's dpproxies and their kubelets: one with its state directory
// and one without (reaching the Allocate plugins as static backends), and
// with --compare_dpproxy this build and the other, started alike, so that a
// change is measured before and after in the same rounds.
struct Bench {
  std::string dir, plugins;
  sim::KubeletSimOptions so;
  std::unique_ptr<sim::KubeletSim> kubelet, kubelet_nj;
  Child proxy, proxy_nj;
  struct Build {
    std::string label;
    std::unique_ptr<sim::KubeletSim> kubelet;
    Child proxy;
  };
  std::vector<Build> builds;
  int rereg_round = 0;
};

absl::Status StartBench(const std::string& dir, Bench* b) {
  b->dir = dir;
  b->plugins = dir + "/p";
  b->so.root_dir = dir + "/k";
  b->so.personality = sim::Personality::kV1Beta1Sync;
  b->kubelet = std::make_unique<sim::KubeletSim>(b->so);
  if (!b->kubelet->Start().ok()) return absl::UnavailableError("the kubelet did not start");
  b->proxy = Spawn({FLAGS_dpproxy, "--kubelet_root=" + b->so.root_dir,
                    "--plugin_dir=" + b->plugins, "--status_file=" + dir + "/status.json",
                    "--state_dir=" + dir + "/state", "--metrics_address=", "--minloglevel=1"});
  sim::KubeletSimOptions so_nj = b->so;
  so_nj.root_dir = dir + "/k-nj";
  b->kubelet_nj = std::make_unique<sim::KubeletSim>(so_nj);
  if (!b->kubelet_nj->Start().ok()) return absl::UnavailableError("the kubelet did not start");
  b->proxy_nj = Spawn(
      {FLAGS_dpproxy, "--kubelet_root=" + so_nj.root_dir, "--plugin_dir=" + dir + "/p-nj",
       "--status_file=", "--state_dir=", "--metrics_address=", "--minloglevel=1",
       "--static_backend=bench.example.com/v1beta1=" + b->plugins +
           "/bench-v1beta1.sock@v1beta1,bench.example.com/v1alpha=" + b->plugins +
           "/bench-v1alpha.sock@v1alpha"});
  if (!WaitForPath(b->plugins + "/kubelet.sock", absl::Seconds(10)) ||
      !WaitForPath(dir + "/p-nj/kubelet.sock", absl::Seconds(10))) {
    return absl::UnavailableError("dpproxy did not start");
  }
  if (!FLAGS_compare_dpproxy.empty()) {
    const std::pair<const char*, std::string> which[] = {{"this build", FLAGS_dpproxy},
                                                         {"compared build", FLAGS_compare_dpproxy}};
    for (const auto& [label, binary] : which) {
      const std::string name = absl::StrCat("build", b->builds.size());
      sim::KubeletSimOptions o = b->so;
      o.root_dir = absl::StrCat(b->dir, "/k-", name);
      Bench::Build build{label, std::make_unique<sim::KubeletSim>(o), nullptr};
      if (!build.kubelet->Start().ok()) return absl::UnavailableError("a kubelet did not start");
      build.proxy = Spawn({binary, "--kubelet_root=" + o.root_dir,
                       absl::StrCat("--plugin_dir=", dir, "/p-", name), "--status_file=",
                       absl::StrCat("--state_dir=", dir, "/state-", name), "--metrics_address=",
                       "--minloglevel=1",
                       "--static_backend=bench.example.com/v1beta1=" + b->plugins +
                           "/bench-v1beta1.sock@v1beta1"});
      if (!WaitForPath(absl::StrCat(b->dir, "/p-", name, "/kubelet.sock"), absl::Seconds(10))) {
        return absl::UnavailableError(absl::StrCat(binary, " did not start"));
      }
      b->builds.push_back(std::move(build));
    }
  }
  return absl::OkStatus();
}

// Re-registration: dpproxy (with a v1beta1 plugin behind it) on the bench's
// kubelet; the floor is a v1beta1 sample plugin registered directly with a
// second kubelet of the same personality. `others`: how many more
// resources dpproxy serves on its kubelet at that point; the floor's
// kubelet gets as many more plugins, so that both kubelets take the same
// number of registrations at each restart.
Reregistration MeasureReregistration(Bench& b, int others) {
  Reregistration out;
  const std::string resource = absl::StrCat("bench.example.com/rereg", b.rereg_round);
  const std::string sock = absl::StrCat("bench-rereg", b.rereg_round, ".sock");
  Child behind = Spawn({FLAGS_sample_plugin, "--api=v1beta1", "--resource=" + resource,
                        "--devices=4", "--socket_name=" + sock,
                        "--kubelet_socket=" + b.plugins + "/kubelet.sock", "--quiet"});
  sim::KubeletSimOptions so2 = b.so;
  so2.root_dir = absl::StrCat(b.dir, "/k-direct", b.rereg_round++);
  sim::KubeletSim kubelet2(so2);
  // The floor's kubelet starts with the same checkpoint and pods as
  // dpproxy's (after the Allocate phases, some 22,000 allocations): a
  // kubelet rewrites its checkpoint at every registration and list, and
  // that cost belongs to the floor too.
  std::error_code ec;
  std::filesystem::create_directories(kubelet2.device_plugin_dir(), ec);
  std::filesystem::copy_file(b.kubelet->checkpoint_path(), kubelet2.checkpoint_path(), ec);
  std::filesystem::copy_file(b.kubelet->pods_path(), kubelet2.pods_path(), ec);
  out.allocations = b.kubelet->GetState().allocations_size();
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
  out.resources = 1 + others;
  if (direct == nullptr || !neighbours_up ||
      !b.kubelet->WaitForResource(resource, 4, absl::Seconds(10)) ||
      !kubelet2.WaitForResource(resource, 4, absl::Seconds(10))) {
    std::cerr << "allocate_bench: the re-registration plugins did not come up\n";
  } else {
    for (int i = 0; i < FLAGS_restarts; ++i) {
      const double d = RestartAndWait(kubelet2, resource, &out.missed);
      if (d >= 0) out.direct_ms.push_back(d);
      const double p = RestartAndWait(*b.kubelet, resource, &out.missed);
      if (p >= 0) out.proxied_ms.push_back(p);
    }
  }
  Stop(direct);
  for (Child& c : neighbours) Stop(c);
  Stop(behind);
  kubelet2.Stop();
  return out;
}

// Allocate by path for each plugin version (latencies in alternating
// blocks), then, for v1beta1, throughput from concurrent clients.
absl::Status MeasureAllocatePaths(Bench& b, Figures* f) {
  for (const std::string api : {"v1beta1", "v1alpha"}) {
    const std::string resource = absl::StrCat("bench.example.com/", api);
    const std::string sock_name = absl::StrCat("bench-", api, ".sock");
    Child plugin = Spawn({FLAGS_sample_plugin, "--api=" + api, "--resource=" + resource,
                          "--devices=4", "--socket_name=" + sock_name,
                          "--kubelet_socket=" + b.plugins + "/kubelet.sock", "--quiet"});
    if (!b.kubelet->WaitForResource(resource, 4, absl::Seconds(10)) ||
        !b.kubelet_nj->WaitForResource(resource, 4, absl::Seconds(10))) {
      std::cerr << "allocate_bench: " << resource << " did not come up through dpproxy\n";
      Stop(plugin);
      return absl::UnavailableError(absl::StrCat(resource, " did not come up through dpproxy"));
    }
    auto endpoint = [&](sim::KubeletSim& k) {
      const sim::State state = k.GetState();
      for (const auto& r : state.resources()) {
        if (r.name() == resource) return r.endpoint();
      }
      return std::string();
    };
    const std::string journaled = endpoint(*b.kubelet), unjournaled = endpoint(*b.kubelet_nj);
    const std::string direct_socket = b.plugins + "/" + sock_name;
    Result r;
    r.label = absl::StrCat(api, " plugin");
    std::vector<Call> calls;
    r.paths.push_back("direct");
    calls.push_back(api == "v1beta1" ? BetaAllocate(direct_socket, &r.errors)
                                     : AlphaAllocate(direct_socket, &r.errors));
    // The bare hop forwards v1beta1 unchanged; it has no v1alpha edge.
    const std::string bare_socket = b.dir + "/bare.sock";
    const std::string durable_socket = b.dir + "/bare-durable.sock";
    Child bare, durable;
    if (api == "v1beta1") {
      bare = Spawn({FLAGS_bare_hop, "--listen=" + bare_socket, "--target=" + direct_socket});
      if (!WaitForPath(bare_socket, absl::Seconds(10))) {
        return absl::UnavailableError("bare_hop did not start");
      }
      r.paths.push_back("bare hop");
      calls.push_back(BetaAllocate(bare_socket, &r.errors));
      // The floor of a forwarder that makes each call durable before it
      // answers: its file on the state directory's disk.
      durable = Spawn({FLAGS_bare_hop, "--listen=" + durable_socket, "--target=" + direct_socket,
                       "--journal=" + b.dir + "/state/bare-hop.journal"});
      if (!WaitForPath(durable_socket, absl::Seconds(30))) {
        return absl::UnavailableError("bare_hop --journal did not start");
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
          FdatasyncFloor(b.dir + "/state/floor-preallocated", true, &r.errors, f->sync_cost));
      r.paths.push_back("fdatasync, appended");
      calls.push_back(FdatasyncFloor(b.dir + "/state/floor-appended", false, &r.errors));
      // The preallocated write again, each right after an Allocate through
      // dpproxy without journal: a sync that follows other work, as the
      // journal's does, takes longer than one of a back-to-back series
      // (about 30 us on this machine's disk); this row's extra over the
      // no-journal row is what one durable write per call costs.
      r.paths.push_back("no journal + fdatasync");
      calls.push_back([allocate = BetaAllocate(unjournaled, &r.errors),
                       sync = FdatasyncFloor(b.dir + "/state/floor-after-call", true, &r.errors)] {
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
      std::vector<pid_t> middles = {-1, bare->pid(), b.proxy_nj->pid(), b.proxy->pid(),
                                    durable->pid()};
      for (Bench::Build& build : b.builds) {
        if (!build.kubelet->WaitForResource(resource, 4, absl::Seconds(10))) {
          return absl::UnavailableError(
              absl::StrCat(resource, " did not come up through the ", build.label));
        }
        labels.push_back(build.label);
        sockets.push_back(endpoint(*build.kubelet));
        middles.push_back(build.proxy->pid());
      }
      std::vector<Throughput> t =
          Concurrent(sockets, middles, plugin->pid(),
                     [](const std::string& sock, int* e) { return BetaAllocate(sock, e); },
                     FLAGS_clients, FLAGS_concurrent_calls, FLAGS_concurrent_rounds);
      for (size_t p = 0; p < labels.size(); ++p) f->many.emplace_back(labels[p], std::move(t[p]));
      Stop(bare);
      Stop(durable);
    }
    f->results.push_back(std::move(r));
    Stop(plugin);
  }
  return absl::OkStatus();
}

int Run() {
  if (FLAGS_dpproxy.empty() || FLAGS_sample_plugin.empty() || FLAGS_bare_hop.empty()) {
    std::cerr << "allocate_bench: --dpproxy, --sample_plugin and --bare_hop are required\n";
    return 2;
  }
  char tmpl[] = "/tmp/dpp-bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  Bench b;
  if (absl::Status s = StartBench(dir, &b); !s.ok()) {
    std::cerr << "allocate_bench: " << s.message() << "\n";
    return 1;
  }
  Figures f;
  f.settings = {FLAGS_iterations, FLAGS_block, FLAGS_clients, FLAGS_concurrent_calls,
                FLAGS_concurrent_rounds, FLAGS_restarts, FLAGS_startup_allocations, FLAGS_flips,
                FLAGS_reconcile_pods, FLAGS_upgrades, FLAGS_checkpoint_losses};
  for (const Bench::Build& build : b.builds) f.build_labels.push_back(build.label);
  // Measured while dpproxy serves one resource, and again after the
  // Allocate phases, when it serves three (every resource registers again
  // after a restart).
  if (FLAGS_restarts > 0) f.rereg_one = MeasureReregistration(b, 0);
  // The CPU of the preallocated fdatasync floor (the journal's, per sync).
  f.sync_cost = std::make_shared<SyncCost>();
  if (absl::Status s = MeasureAllocatePaths(b, &f); !s.ok()) {
    std::cerr << "allocate_bench: " << s.message() << "\n";
    return 1;
  }
  Stop(b.proxy_nj);
  b.kubelet_nj->Stop();
  for (Bench::Build& build : b.builds) {
    Stop(build.proxy);
    build.kubelet->Stop();
  }
  if (FLAGS_restarts > 0) f.rereg_many = MeasureReregistration(b, 3);
  // Start-up, three times each, alternating: with the allocations, and the
  // floor (the same resource, no allocations).
  if (FLAGS_startup_allocations > 0) {
    for (int i = 0; i < 3; ++i) {
      const Startup empty = MeasureStartup(absl::StrCat(dir, "/s", i), 0);
      const Startup full = MeasureStartup(absl::StrCat(dir, "/s", i), FLAGS_startup_allocations);
      f.startup_empty.push_back(empty.ms);
      f.startup_full.push_back(full.ms);
      f.rss_empty.push_back(static_cast<double>(empty.rss_kb));
      f.rss_full.push_back(static_cast<double>(full.rss_kb));
    }
  }
  if (FLAGS_flips > 0) {
    f.flips_small = MeasureFlips(dir, b.plugins, *b.kubelet, 8);
    f.flips_large = MeasureFlips(dir, b.plugins, *b.kubelet, 20000);
  }
  if (FLAGS_reconcile_pods > 0) f.reconciliation = ReconcileAtScale(dir, FLAGS_reconcile_pods);
  if (FLAGS_upgrades > 0) {
    // One release per way the kubelet treats a replaced registration: 1.9
    // stops it, 1.10-1.24 ignore its end, 1.25-1.36 disconnect by name.
    for (const char* version : {"1.9", "1.24", "1.25", "1.31", "1.36"}) {
      f.upgrades.push_back(MeasureUpgrades(dir, version, FLAGS_upgrades));
    }
  }
  if (FLAGS_checkpoint_losses > 0) {
    for (const char* version : {"1.36", "1.24", "1.18"}) {
      for (bool through : {false, true}) {
        f.losses.push_back(MeasureCheckpointLoss(dir, version, through, FLAGS_checkpoint_losses));
      }
    }
  }
  f.rss = ProcField(b.proxy, "VmRSS");
  f.hwm = ProcField(b.proxy, "VmHWM");
  f.threads = ProcField(b.proxy, "Threads");
  Stop(b.proxy);
  b.kubelet->Stop();
  PrintReport(f);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace dpproxy::bench

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
  return dpproxy::bench::Run();
}
