// allocate_bench: the cost of dpproxy's extra hop. In one run it measures
// Allocate (one container, one device, as the kubelet sends it) directly to
// a sample plugin and through dpproxy to the same plugin, over the same
// sockets with channels made once (as the kubelet does), in interleaved
// blocks so machine noise hits both alike; then prints p50/p99 in
// microseconds, the ratios, and dpproxy's resident memory. A benchmark that
// prints figures, not a test: nothing here has a time limit.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/common/files.h"
#include "proxy/common/grpc_util.h"
#include "tools/kubelet_sim/kubelet_sim.h"

DEFINE_string(dpproxy, "", "Path of the dpproxy binary.");
DEFINE_string(sample_plugin, "", "Path of the sample_plugin binary.");
DEFINE_int32(iterations, 3000, "Allocate calls per path and plugin version.");
DEFINE_int32(block, 100, "Calls per block; blocks of the two paths alternate.");

namespace dpproxy {
namespace {

extern "C" char** environ;

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "allocate_bench: cannot start " << args[0] << "\n";
    exit(1);
  }
  return pid;
}

void Stop(pid_t pid) {
  kill(pid, SIGTERM);
  int status;
  waitpid(pid, &status, 0);
}

std::string ProcField(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
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

struct Result {
  std::string label;
  std::vector<double> direct, proxied;
  int errors = 0;
};

void Measure(const Call& direct, const Call& proxied, Result* r) {
  for (int i = 0; i < 200; ++i) {  // warm-up: connections, caches
    direct();
    proxied();
  }
  int done = 0;
  while (done < FLAGS_iterations) {
    int n = std::min(FLAGS_block, FLAGS_iterations - done);
    for (int i = 0; i < n; ++i) {
      double us = TimeOne(direct);
      if (us >= 0) r->direct.push_back(us);
    }
    for (int i = 0; i < n; ++i) {
      double us = TimeOne(proxied);
      if (us >= 0) r->proxied.push_back(us);
    }
    done += n;
  }
}

int Run() {
  if (FLAGS_dpproxy.empty() || FLAGS_sample_plugin.empty()) {
    std::cerr << "allocate_bench: --dpproxy and --sample_plugin are required\n";
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
  pid_t proxy = Spawn({FLAGS_dpproxy, "--kubelet_root=" + so.root_dir, "--plugin_dir=" + plugins,
                       "--status_file=" + dir + "/status.json", "--state_dir=" + dir + "/state", "--metrics_address=",
                       "--minloglevel=1"});
  if (!WaitForPath(plugins + "/kubelet.sock", absl::Seconds(10))) {
    std::cerr << "allocate_bench: dpproxy did not start\n";
    return 1;
  }
  std::vector<Result> results;
  for (const std::string api : {"v1beta1", "v1alpha"}) {
    const std::string resource = absl::StrCat("bench.example.com/", api);
    const std::string sock_name = absl::StrCat("bench-", api, ".sock");
    pid_t plugin = Spawn({FLAGS_sample_plugin, "--api=" + api, "--resource=" + resource,
                          "--devices=4", "--socket_name=" + sock_name,
                          "--kubelet_socket=" + plugins + "/kubelet.sock", "--quiet"});
    if (!kubelet.WaitForResource(resource, 4, absl::Seconds(10))) {
      std::cerr << "allocate_bench: " << resource << " did not come up through dpproxy\n";
      Stop(plugin);
      Stop(proxy);
      return 1;
    }
    std::string proxied_socket;
    const sim::State state = kubelet.GetState();
    for (const auto& r : state.resources()) {
      if (r.name() == resource) proxied_socket = r.endpoint();
    }
    Result r;
    r.label = absl::StrCat(api, " plugin");
    const std::string direct_socket = plugins + "/" + sock_name;
    Call direct = api == "v1beta1" ? BetaAllocate(direct_socket, &r.errors)
                                   : AlphaAllocate(direct_socket, &r.errors);
    Call proxied = BetaAllocate(proxied_socket, &r.errors);
    Measure(direct, proxied, &r);
    results.push_back(std::move(r));
    Stop(plugin);
  }
  const std::string rss = ProcField(proxy, "VmRSS");
  const std::string hwm = ProcField(proxy, "VmHWM");
  const std::string threads = ProcField(proxy, "Threads");
  Stop(proxy);
  kubelet.Stop();

  std::cout << absl::StrFormat(
      "Allocate, one container with one device, %d calls per path, blocks of %d alternating\n"
      "(direct: a v1beta1 or v1alpha client on the plugin's socket; via dpproxy: a v1beta1\n"
      "kubelet-style client on dpproxy's socket, translated to the plugin's version)\n\n",
      FLAGS_iterations, FLAGS_block);
  std::cout << absl::StrFormat("%-16s %12s %12s %14s %14s %10s %10s %7s\n", "backend",
                               "direct p50", "direct p99", "dpproxy p50", "dpproxy p99",
                               "p50 ratio", "p99 ratio", "errors");
  for (const Result& r : results) {
    double dp50 = Percentile(r.direct, 0.5), dp99 = Percentile(r.direct, 0.99);
    double pp50 = Percentile(r.proxied, 0.5), pp99 = Percentile(r.proxied, 0.99);
    std::cout << absl::StrFormat("%-16s %10.0fus %10.0fus %12.0fus %12.0fus %9.2fx %9.2fx %7d\n",
                                 r.label, dp50, dp99, pp50, pp99, pp50 / dp50, pp99 / dp99,
                                 r.errors);
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
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return dpproxy::Run();
}
