// Storms, bounded in count and time (DPP_STORM=N for more): kubelet restarts
// during a stream of allocations, and bursts of valid and invalid plugin
// registrations. After each: every allocation the kubelet was answered for
// is in dpproxy's state, and dpproxy's threads, file descriptors and
// resident memory are back to their level before the storm. Backend plugins are real processes,
// killed with SIGKILL.
#include <dirent.h>
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/process.h"
#include "tests/testing/raw_clients.h"
#include "tests/testing/sanitizers.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;

constexpr char kGpu[] = "vendor.com/gpu";


int CountEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
    closedir(d);
  }
  return n;
}
int Threads() { return CountEntries("/proc/self/task"); }

// A process's threads (`proc` is "self" or a pid), counted by name.
std::map<std::string, int> ThreadNames(const std::string& proc = "self") {
  const std::string dir = absl::StrCat("/proc/", proc, "/task");
  std::map<std::string, int> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      absl::StatusOr<std::string> comm = ReadFile(absl::StrCat(dir, "/", e->d_name, "/comm"));
      if (comm.ok()) ++names[std::string(absl::StripTrailingAsciiWhitespace(*comm))];
    }
    closedir(d);
  }
  return names;
}

// Threads fall in three classes, told apart by their names, each with its
// own slack for coming back to its level after a storm:
//  - gRPC's shared pools (its executors, timer threads, event engine and
//    callback completion queue): they grow with load to bounds gRPC sets
//    (the executors to twice the cores, each, and they never shrink);
//  - synchronous servers' pollers (the simulated kubelet's): gRPC keeps a
//    few idle ones, and a stream left open holds one each;
//  - every other thread (dpproxy's, the simulator's own, the test's).
enum class ThreadClass { kGrpcPool, kSyncServer, kOther };
ThreadClass ClassOf(const std::string& name) {
  if (name.rfind("grpcpp_sync_ser", 0) == 0) return ThreadClass::kSyncServer;
  for (const char* prefix :
       {"default-executo", "resolver-execu", "grpc_global_tim", "event_engine", "nexting_thread"}) {
    if (name.rfind(prefix, 0) == 0) return ThreadClass::kGrpcPool;
  }
  return ThreadClass::kOther;
}
int ThreadsOfClass(const std::map<std::string, int>& names, ThreadClass c) {
  int n = 0;
  for (const auto& [name, count] : names) n += ClassOf(name) == c ? count : 0;
  return n;
}

// How the thread names changed: "+2 default-executo, -1 grpcpp_sync_ser".
std::string ThreadChange(const std::map<std::string, int>& before) {
  std::map<std::string, int> change;
  for (const auto& [name, n] : before) change[name] -= n;
  for (const auto& [name, n] : ThreadNames()) change[name] += n;
  std::vector<std::string> parts;
  for (const auto& [name, n] : change) {
    if (n != 0) parts.push_back(absl::StrCat(n > 0 ? "+" : "", n, " ", name));
  }
  return parts.empty() ? "no change by name" : absl::StrJoin(parts, ", ");
}
int Fds() { return CountEntries("/proc/self/fd"); }

// Under ASan, malloc is ASan's: freed memory waits in its quarantine
// (resident, by design) and mallinfo2 counts nothing. Memory is then left
// to LeakSanitizer, which reports any leak at exit and fails the test.
constexpr bool kMemoryFiguresMeanSomething = !testing::kAddressSanitizer;

// Resident memory in KiB, after handing freed memory back to the kernel
// (so that what malloc keeps cached is not counted as held).
int64_t RssKb() {
  malloc_trim(0);
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Both event logs keep a short history during storms (as the daemon does),
// so that resident memory shows leaks, not a ring of events filling up.
void ShortEventHistories(ProxyHarness& h) {
  h.proxy().events().SetHistory(256);
  h.sim().events().SetHistory(256);
}

// Bytes malloc has handed out and not had back: what a leak grows. (RSS
// also grows with malloc's arenas and cached thread stacks, which a storm
// of restarts touches without leaking anything.)
int64_t HeapKb() { return static_cast<int64_t>(mallinfo2().uordblks) / 1024; }

// What the process holds before a storm.
struct Level {
  int threads = Threads();
  std::map<std::string, int> thread_names = ThreadNames();
  int fds = Fds();
  int64_t heap_kb = HeapKb();
  int64_t rss_kb = RssKb();
};

// Threads, fds and memory come back to their level (`kept_kb` for what
// the storm legitimately left, such as journaled allocations). Each class
// of threads has its slack (see ThreadClass): none of them near one thread
// per storm event. The heap is held to a tight bound; resident memory,
// which also holds malloc's arenas and cached thread stacks, to a loose one.
void ExpectBackToLevel(ProxyHarness& h, const Level& before, int64_t kept_kb = 0) {
  constexpr int kGrpcPoolSlack = 12;
  constexpr int kSyncServerSlack = 3;
  constexpr int kOtherThreadSlack = 1;
  const std::map<ThreadClass, int> thread_slack = {{ThreadClass::kGrpcPool, kGrpcPoolSlack},
                                                   {ThreadClass::kSyncServer, kSyncServerSlack},
                                                   {ThreadClass::kOther, kOtherThreadSlack}};
  constexpr int kFdSlack = 6;
  constexpr int64_t kHeapSlackKb = 2 * 1024;
  constexpr int64_t kRssSlackKb = 24 * 1024;
  EXPECT_TRUE(h.WaitFor(
      [&] {
        const std::map<std::string, int> now = ThreadNames();
        for (const auto& [c, slack] : thread_slack) {
          if (ThreadsOfClass(now, c) > ThreadsOfClass(before.thread_names, c) + slack) {
            return false;
          }
        }
        return true;
      },
      absl::Seconds(20)))
      << "threads " << before.threads << " before, " << Threads() << " after ("
      << ThreadChange(before.thread_names) << "); slack " << kGrpcPoolSlack
      << " in gRPC's pools, " << kSyncServerSlack << " synchronous server pollers, "
      << kOtherThreadSlack << " for the rest";
  EXPECT_TRUE(h.WaitFor([&] { return Fds() <= before.fds + kFdSlack; }, absl::Seconds(20)))
      << "fds " << before.fds << " before, " << Fds() << " after";
  std::cout << "level: threads " << before.threads << " -> " << Threads() << " ("
            << ThreadChange(before.thread_names) << "), fds " << before.fds << " -> " << Fds()
            << "\n";
  if (!kMemoryFiguresMeanSomething) return;  // LeakSanitizer's job in this build
  EXPECT_TRUE(h.WaitFor([&] { return HeapKb() <= before.heap_kb + kept_kb + kHeapSlackKb; },
                        absl::Seconds(20)))
      << "heap in use " << before.heap_kb << " KiB before, " << HeapKb() << " KiB after ("
      << kept_kb << " KiB kept by the storm's results, " << kHeapSlackKb << " KiB slack)";
  EXPECT_TRUE(h.WaitFor([&] { return RssKb() <= before.rss_kb + kept_kb + kRssSlackKb; },
                        absl::Seconds(20)))
      << "resident memory " << before.rss_kb << " KiB before, " << RssKb() << " KiB after ("
      << kept_kb << " KiB kept by the storm's results, " << kRssSlackKb << " KiB slack)";
  std::cout << "level: heap " << before.heap_kb << " -> " << HeapKb() << " KiB, RSS "
            << before.rss_kb << " -> " << RssKb() << " KiB\n";
}

// What one journaled allocation may keep in memory (the state, its index).
constexpr int64_t kKbPerAllocation = 2;

// Short-lived pods, one after another, each deleted once admitted: the
// allocations the kubelet was answered for, as a multiset of device lists.
class AllocationStream {
 public:
  explicit AllocationStream(ProxyHarness& h) : h_(h), thread_([this] { Run(); }) {}
  ~AllocationStream() { Stop(); }

  // Waits until `n` more allocations have been answered.
  bool WaitForMore(int n) {
    const int before = progress_.load();
    return h_.WaitFor([&] { return progress_.load() >= before + n; });
  }
  // Stops the stream; returns what was answered.
  const std::multiset<std::string>& Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return answered_;
  }

 private:
  void Run() {
    for (int i = 0; !stop_; ++i) {
      absl::StatusOr<sim::AllocateResponse> a = h_.sim().Allocate(
          testing::PodRequest(absl::StrCat("p", i), {{"main", 1}}, kGpu));
      if (!a.ok()) continue;  // the kubelet or the backend was away: not answered
      answered_.insert(absl::StrJoin(a->allocations(0).device_ids(), ","));
      ++progress_;
      (void)h_.sim().DeletePod(a->pod_uid());
    }
  }

  ProxyHarness& h_;
  std::atomic<bool> stop_{false};
  std::atomic<int> progress_{0};
  std::multiset<std::string> answered_;  // the thread's until Stop()
  std::thread thread_;
};

// Every answered allocation is journaled (once per answer: a device may be
// allocated again after its pod is deleted).
void ExpectAllJournaled(ProxyHarness& h, const std::multiset<std::string>& answered) {
  ASSERT_GT(answered.size(), 0u);
  std::multiset<std::string> journaled;
  const state::State st = h.proxy().state()->Snapshot();
  for (const auto& a : st.allocations()) journaled.insert(absl::StrJoin(a.device_ids(), ","));
  for (const std::string& d : std::set<std::string>(answered.begin(), answered.end())) {
    EXPECT_GE(journaled.count(d), answered.count(d)) << "allocation of " << d << " lost";
  }
}


TEST(StormTest, KubeletRestartsDuringAllocations) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();  // nothing is released meanwhile
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = 16;
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 16, kWait));
  // A long-running pod, as on any real node, beside the short-lived ones.
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("steady", {{"main", 1}}, kGpu)).ok());
  ShortEventHistories(h);
  const Level before;

  AllocationStream stream(h);
  const int restarts = testing::CountFromEnv("DPP_STORM", 6);
  for (int r = 0; r < restarts; ++r) {
    // Restart while allocations flow: a few answered first.
    ASSERT_TRUE(stream.WaitForMore(5)) << "restart " << r;
    ASSERT_TRUE(h.sim().Restart().ok());
  }
  const std::multiset<std::string>& answered = stream.Stop();
  ExpectAllJournaled(h, answered);
  std::cout << restarts << " kubelet restarts, " << answered.size()
            << " allocations answered, all journaled\n";
  // The kubelet kept its checkpoint every time: pods that came and went
  // around the restarts are never taken for a loss.
  const auto counts = h.proxy().events().Counts();
  EXPECT_EQ(counts.count(std::make_pair(std::string("devices_forgotten"), std::string(kGpu))),
            0u)
      << StatusToJson(h.proxy().Status())["forgotten"].dump();
  ExpectBackToLevel(h, before, kKbPerAllocation * static_cast<int64_t>(answered.size()));
}

TEST(StormTest, RegistrationBurstsOfValidAndInvalidRequests) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.dial_timeout = absl::Milliseconds(200); });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string sock = h.proxy().backend_registration_socket();
  auto burst = [&] {
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
      clients.emplace_back([&, c] {
        for (int i = 0; i < 10; ++i) {
          const std::string name = absl::StrCat("x", c, "-", i, ".sock");
          switch ((c + i) % 5) {
            case 0: (void)testing::RegisterV1Beta1(sock, "v1alpha2", "other.com/x", name); break;
            case 1: (void)testing::RegisterV1Beta1(sock, "v1beta1", "bad name", name); break;
            case 2: (void)testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", "../" + name); break;
            case 3: (void)testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", name); break;
            case 4: (void)testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", name); break;
          }
        }
      });
    }
    for (auto& t : clients) t.join();
  };
  auto dials_done = [&](int bursts) {
    return h.WaitFor([&] {
      std::map<std::string, int64_t> r = h.proxy().RegistrationRejections();
      return r["dial"] + r["busy"] >= 2 * 8 * 10 / 5 * bursts;
    }, absl::Seconds(30));
  };
  // gRPC's own pools grow to their working size under the first burst and
  // stay there; what must not happen is growth with every burst.
  burst();
  ASSERT_TRUE(dials_done(1));
  ShortEventHistories(h);
  const Level before;
  const int bursts = testing::CountFromEnv("DPP_STORM", 3);
  for (int b = 0; b < bursts; ++b) burst();
  // Every dial of the bursts ends; nothing else was disturbed.
  ASSERT_TRUE(dials_done(bursts + 1));
  EXPECT_TRUE(h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu)).ok());
  EXPECT_EQ(h.proxy().Status().resources.size(), 1u);
  ExpectBackToLevel(h, before);
}

// Backend plugins, as real processes, killed with SIGKILL and started again
// (alternating v1alpha and v1beta1, as in an upgrade window) while
// allocations flow: every answered allocation is journaled, the devices
// come back Healthy each time, and nothing of dpproxy's is left over.
TEST(StormTest, BackendKillAndRestartCycles) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.reconcile_interval = absl::ZeroDuration();
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  auto start_plugin = [&](int cycle) {
    return testing::Spawn({testing::Runfile("tools/sample_plugin/sample_plugin"),
                           cycle % 2 == 0 ? "--api=v1alpha" : "--api=v1beta1",
                           "--resource=vendor.com/gpu", "--devices=8", "--id_pattern=gpu-{i}",
                           "--kubelet_socket=" + h.dir("p") + "/kubelet.sock", "--quiet"});
  };
  std::unique_ptr<ChildProcess> plugin = start_plugin(0);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 8, kWait));
  ShortEventHistories(h);
  const Level before;

  AllocationStream stream(h);
  const int cycles = testing::CountFromEnv("DPP_STORM", 6);
  for (int c = 1; c <= cycles; ++c) {
    ASSERT_TRUE(stream.WaitForMore(3)) << "cycle " << c;
    testing::Kill(plugin.get(), SIGKILL);
    EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }))
        << "cycle " << c;
    plugin = start_plugin(c);
    EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Healthy"; }))
        << "cycle " << c;
  }
  const std::multiset<std::string>& answered = stream.Stop();
  testing::Kill(plugin.get(), SIGTERM);
  ExpectAllJournaled(h, answered);
  std::cout << cycles << " backend kill -9 cycles, " << answered.size()
            << " allocations answered, all journaled\n";
  ExpectBackToLevel(h, before, kKbPerAllocation * static_cast<int64_t>(answered.size()));
}


int ThreadsOf(pid_t pid) { return CountEntries(absl::StrCat("/proc/", pid, "/task").c_str()); }

// How many of `pid`'s threads have a name starting with `prefix`; -1 when
// the process has none (it is gone).
int ThreadsNamed(pid_t pid, const std::string& prefix) {
  const std::map<std::string, int> names = ThreadNames(absl::StrCat(pid));
  if (names.empty()) return -1;
  int n = 0;
  for (const auto& [name, count] : names) {
    n += name.rfind(prefix, 0) == 0 ? count : 0;
  }
  return n;
}

// dpproxy as a real process with many resources: a resource costs no
// thread of its own. Every method of the kubelet-facing servers is on
// gRPC's callback API, and the streams (the kubelet's ListAndWatch, the
// backend's) are read and written on gRPC's shared threads.
TEST(ScaleTest, ThreadsPerResourceStayBounded) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);  // its kubelet and directories only
  ASSERT_TRUE(h.sim().Start().ok());
  const std::unique_ptr<ChildProcess> proxy = testing::Spawn(
      {testing::Runfile("proxy/dpproxy"), "--kubelet_root=" + h.dir("k"),
       "--plugin_dir=" + h.dir("p"), "--state_dir=" + h.dir("state"), "--status_file=",
       "--metrics_address=", "--minloglevel=2"});
  ASSERT_NE(proxy, nullptr);
  std::vector<std::unique_ptr<ChildProcess>> plugins;
  auto add_resource = [&](int i) {
    plugins.push_back(testing::Spawn(
        {testing::Runfile("tools/sample_plugin/sample_plugin"), "--api=v1beta1",
         absl::StrCat("--resource=r", i, ".example.com/dev"), "--devices=2",
         absl::StrCat("--socket_name=r", i, ".sock"),
         "--kubelet_socket=" + h.dir("p") + "/kubelet.sock", "--quiet"}));
    return h.sim().WaitForResource(absl::StrCat("r", i, ".example.com/dev"), 2, kWait);
  };
  ASSERT_TRUE(add_resource(0));
  // No server of dpproxy's is synchronous (the handoff socket's included):
  // gRPC gives each synchronous server threads that poll for the whole
  // process, waking at every call of the others.
  EXPECT_EQ(ThreadsNamed(proxy->pid(), "grpcpp_sync_ser"), 0)
      << "a synchronous gRPC server's threads in dpproxy";
  // Settled: the kubelet's stream is open and registration threads are gone.
  const int one = ThreadsOf(proxy->pid());
  constexpr int kMore = 12;
  for (int i = 1; i <= kMore; ++i) ASSERT_TRUE(add_resource(i)) << "resource " << i;
  // Twelve more resources, a handful more threads at most (gRPC's shared
  // pools may grow by one or two under the registrations' load).
  constexpr int kSlack = 4;
  EXPECT_TRUE(h.WaitFor([&] { return ThreadsOf(proxy->pid()) <= one + kSlack; },
                        absl::Seconds(20)))
      << "dpproxy had " << one << " threads with one resource and " << ThreadsOf(proxy->pid())
      << " with " << kMore + 1;
  std::cout << "dpproxy threads: " << one << " with one resource, " << ThreadsOf(proxy->pid())
            << " with " << kMore + 1 << "\n";
  for (auto& p : plugins) testing::Kill(p.get(), SIGTERM);
  testing::Kill(proxy.get(), SIGTERM);
}

}  // namespace
}  // namespace dpproxy
