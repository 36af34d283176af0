// A dpproxy upgraded beside the running one (--takeover): the state is
// handed over, the kubelet's Allocates go on throughout, and the kubelet's
// view of the devices never has a gap.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "proxy/handoff/handoff.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/handover.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;

const char kGpu[] = "vendor.com/gpu";

// Pods admitted one after another (each takes a device, and is deleted
// once admitted) until stopped: the Allocates a kubelet sends while
// dpproxy is being upgraded.
class PodStream {
 public:
  explicit PodStream(sim::KubeletSim* sim) : sim_(sim) {
    thread_ = std::thread([this] { Run(); });
  }
  ~PodStream() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Waits until `n` more pods were admitted than when it was called.
  bool WaitForMore(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const int want = admitted_ + n;
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return admitted_ >= want; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  int admitted() {
    absl::MutexLock lock(&mu_);
    return admitted_;
  }
  std::vector<std::string> failures() {
    absl::MutexLock lock(&mu_);
    return failures_;
  }

 private:
  void Run() {
    for (int i = 0; !stop_; ++i) {
      absl::StatusOr<sim::AllocateResponse> r =
          sim_->Allocate(testing::PodRequest(absl::StrCat("pod-", i), {{"main", 1}}, kGpu));
      absl::MutexLock lock(&mu_);
      if (!r.ok()) {
        failures_.push_back(absl::StrCat("pod-", i, ": ", r.status().message()));
        continue;
      }
      ++admitted_;
      mu_.Unlock();
      (void)sim_->DeletePod(r->pod_uid());
      mu_.Lock();
    }
  }

  sim::KubeletSim* const sim_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  int admitted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Every moment the kubelet saw fewer than all four devices allocatable, or
// lost the plugin, from the events of the kubelet simulator since `from`.
std::vector<std::string> Gaps(sim::KubeletSim& sim, size_t from) {
  std::vector<std::string> gaps;
  const auto events = sim.events().Since(from);
  for (const auto& e : events) {
    const std::string kind = e.value("event", "");
    if (e.value("resource", "") != kGpu) continue;
    if (kind == "plugin_lost") gaps.push_back(absl::StrCat("plugin lost: ", e.dump()));
    if (kind == "devices" && e.value("allocatable", 0) < 4) {
      gaps.push_back(absl::StrCat("allocatable ", e.value("allocatable", 0)));
    }
  }
  return gaps;
}

// The kubelet release a test runs against: "1.24", "1.31-per-socket" ...
std::function<void(sim::KubeletSimOptions&)> Kubelet(const std::string& name) {
  return [name](sim::KubeletSimOptions& so) {
    const bool per_socket = name == "1.31-per-socket";
    absl::StatusOr<sim::KubeletVersion> v = sim::ParseKubeletVersion(per_socket ? "1.31" : name);
    ASSERT_TRUE(v.ok()) << name;
    v->per_socket_clients = per_socket;
    so.kubelet = *v;
  };
}

// The kubelet, dpproxy and a plugin up; the kubelet has its four devices.
void Serve(ProxyHarness& h) {
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
}

// No registration since event `from` was refused at a socket the kubelet
// still streamed from ("already connected": the takeovers' refused
// registrations of the release socket are dpproxy's own, and expected),
// and a stop of dpproxy still has the kubelet see the devices go.
void ExpectNothingStaleThenStop(ProxyHarness& h, size_t from) {
  for (const nlohmann::json& e : h.sim().events().Since(from)) {
    if (e["event"] == "registration_rejected") {
      EXPECT_FALSE(absl::StrContains(e.value("error", ""), "already connected")) << e.dump();
    }
  }
  const size_t last = h.sim().events().Size();
  h.StopProxy();
  EXPECT_TRUE(h.sim()
                  .events()
                  .WaitForEvent("plugin_lost", {{"resource", kGpu}}, kWait, last)
                  .has_value());
}

class HandoffTest : public ::testing::TestWithParam<const char*> {};

// 20 upgrades in a row under a stream of pods: no Allocate fails, the
// kubelet never sees a device go (no plugin loss, allocatable never below
// four), and every allocation is in the journal of the last dpproxy.
TEST_P(HandoffTest, TwentyUpgradesUnderAStreamOfPods) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, Kubelet(GetParam()));
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  const size_t from = h.sim().events().Size();
  PodStream pods(&h.sim());
  ASSERT_TRUE(pods.WaitForMore(5, kWait));
  std::set<int> generations;
  for (int i = 0; i < 20; ++i) {
    absl::Status took = h.TakeOver();
    ASSERT_TRUE(took.ok()) << "handoff " << i + 1 << ": " << took.message();
    generations.insert(h.proxy().socket_generation());
    // Pods go on through the new dpproxy before the next upgrade.
    ASSERT_TRUE(pods.WaitForMore(3, kWait)) << "handoff " << i + 1;
  }
  pods.Stop();
  EXPECT_THAT(pods.failures(), ::testing::IsEmpty());
  EXPECT_THAT(Gaps(h.sim(), from), ::testing::IsEmpty());
  EXPECT_EQ(generations, (std::set<int>{0, 1}));  // the sockets alternate
  // Nothing lost: the last dpproxy's journal holds every allocation made
  // (the pods were deleted; reconciliation has not run yet).
  EXPECT_EQ(h.proxy().state()->AllocationCount(), pods.admitted());
}

// The kubelet restarts in the middle of a takeover, after the new dpproxy
// took the state and before the old one finished: the new one registers
// with the restarted kubelet, the old one (which registers nothing after
// its release) never does, the takeover completes, and the pod admitted
// before the upgrade is re-admitted by the restarted kubelet.
TEST_P(HandoffTest, AKubeletRestartInTheMiddleOfATakeover) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, Kubelet(GetParam()));
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("before", {{"main", 1}}, kGpu)).ok());
  const std::string old_socket = h.proxy().KubeletSocketOf(kGpu);
  size_t restarted_at = 0;
  absl::Status took = h.TakeOver([&] {
    restarted_at = h.sim().events().Size();
    ASSERT_TRUE(h.sim().Restart().ok());
  });
  ASSERT_TRUE(took.ok()) << took.message();
  const std::string new_socket = h.proxy().KubeletSocketOf(kGpu);
  ASSERT_NE(new_socket, old_socket);
  // The restarted kubelet has the new dpproxy's devices, from its socket.
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string new_name = new_socket.substr(new_socket.rfind('/') + 1);
  const std::string old_name = old_socket.substr(old_socket.rfind('/') + 1);
  bool new_registered = false;
  for (const auto& e : h.sim().events().Since(restarted_at)) {
    if (e.value("event", "") != "register_request") continue;
    const std::string endpoint = e.value("endpoint", "");
    EXPECT_FALSE(absl::EndsWith(endpoint, old_name)) << "the released dpproxy registered again";
    new_registered = new_registered || absl::EndsWith(endpoint, new_name);
  }
  EXPECT_TRUE(new_registered);
  // The pod from before is re-admitted, and a new one is served and
  // journaled by the new dpproxy.
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
  absl::StatusOr<sim::AllocateResponse> after =
      h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 2);
}

// 1.25-1.36 without per-socket clients: when the old dpproxy's stream
// ends, the kubelet disconnects whatever client holds the resource's name
// (kubernetes#121994). The new dpproxy empties that entry first (a
// registration whose options it refuses), so the old one's end finds no
// client and disconnects nothing: the kubelet keeps all four devices
// allocatable through every takeover, and no pod fails.
TEST(HandoffByNameTest, ATakeoverLeavesAKubeletThatDisconnectsByNameNothingToDisconnect) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, Kubelet("1.31"));
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  PodStream pods(&h.sim());
  ASSERT_TRUE(pods.WaitForMore(5, kWait));
  const size_t start = h.sim().events().Size();
  for (int i = 0; i < 5; ++i) {
    const size_t from = h.sim().events().Size();
    absl::Status took = h.TakeOver();
    ASSERT_TRUE(took.ok()) << "handoff " << i + 1 << ": " << took.message();
    // The entry was emptied by a refused registration ...
    ASSERT_TRUE(h.sim()
                    .events()
                    .WaitForEvent("client_forgotten", {{"resource", kGpu}}, kWait, from)
                    .has_value())
        << "handoff " << i + 1;
    // ... and the old dpproxy's end, once it exited, found no client.
    ASSERT_TRUE(h.sim()
                    .events()
                    .WaitForEvent("unlisted_client_ended", {{"resource", kGpu}}, kWait, from)
                    .has_value())
        << "handoff " << i + 1;
    ASSERT_TRUE(pods.WaitForMore(3, kWait)) << "handoff " << i + 1;
  }
  pods.Stop();
  EXPECT_THAT(pods.failures(), ::testing::IsEmpty());
  for (const nlohmann::json& e : h.sim().events().Since(start)) {
    EXPECT_NE(e["event"], "plugin_lost") << e.dump();
    EXPECT_NE(e["event"], "replaced_client_ended") << e.dump();
    if (e["event"] == "devices") {
      EXPECT_EQ(e["allocatable"], 4) << e.dump();
    }
  }
  EXPECT_FALSE(h.proxy()
                   .events()
                   .WaitForEvent("kubelet_stream_dropped", {}, absl::ZeroDuration())
                   .has_value());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), pods.admitted());

  // Stopped for good, the last dpproxy registers once more first, so that
  // its end still tells the kubelet the devices are gone.
  const size_t before_stop = h.sim().events().Size();
  h.StopProxy();
  ASSERT_TRUE(h.sim()
                  .events()
                  .WaitForEvent("plugin_lost", {{"resource", kGpu}}, kWait, before_stop)
                  .has_value());
}

// After a takeover the new dpproxy's client is "unlisted" on a 1.25-1.36
// kubelet; stopped for good, it still has the kubelet hear the devices go.
// It never registers again at its own socket while the kubelet streams
// from it: a 1.37 kubelet refuses that ("device plugin already connected")
// and then keeps that socket's endpoint for good, refusing every later
// registration there (the next takeover's) and making a dead endpoint the
// resource's once another disconnects. Seen on a real 1.37.2 node. Then a
// dpproxy started again, and another takeover: every registration is
// accepted and every pod admitted.
class HandoffThenStopTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HandoffThenStopTest, AStopAfterATakeoverLeavesTheKubeletNothingStale) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, Kubelet(GetParam()));
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  const size_t start = h.sim().events().Size();
  ASSERT_TRUE(h.TakeOver().ok());
  const size_t stop = h.sim().events().Size();
  h.StopProxy();
  EXPECT_TRUE(h.sim()
                  .events()
                  .WaitForEvent("plugin_lost", {{"resource", kGpu}}, kWait, stop)
                  .has_value())
      << "the kubelet kept counting the devices of a dpproxy that stopped";
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("after-restart", {{"main", 1}}, kGpu)).ok());
  absl::Status took = h.TakeOver();
  ASSERT_TRUE(took.ok()) << took;
  absl::StatusOr<sim::AllocateResponse> a =
      h.sim().Allocate(testing::PodRequest("after-takeover", {{"main", 1}}, kGpu));
  EXPECT_TRUE(a.ok()) << a.status();
  ExpectNothingStaleThenStop(h, start);
}

INSTANTIATE_TEST_SUITE_P(Kubelets, HandoffThenStopTest, ::testing::Values("1.31", "1.37"),
                         [](const auto& info) {
                           return std::string(info.param) == "1.31" ? "by_name" : "per_socket";
                         });

// A new dpproxy that takes the state over and then never serves (it died):
// the old one, which can write nothing any more, gives up and stops, and
// a dpproxy started again on the directory serves with every allocation.
TEST(HandoffAbandonedTest, AReleasedDpproxyWhoseSuccessorNeverServesStops) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.handoff_timeout = absl::Milliseconds(300); });
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("before", {{"main", 1}}, kGpu)).ok());
  // The successor's first step, and nothing after it.
  HandoffClient successor(h.dir("state/handoff.0.sock"));
  absl::StatusOr<HandoffClient::Released> released = successor.Release(kWait);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->socket_generation, 0);
  // An Allocate meanwhile is held: nothing may journal it.
  absl::Notification answered;
  absl::Status held;
  std::thread pod([&] {
    held = h.sim().Allocate(testing::PodRequest("during", {{"main", 1}}, kGpu)).status();
    answered.Notify();
  });
  ASSERT_TRUE(h.proxy()
                  .events()
                  .WaitForEvent("handoff_abandoned", {}, kWait)
                  .has_value());
  EXPECT_TRUE(h.proxy().handoff_failed());
  EXPECT_FALSE(answered.HasBeenNotified()) << held;
  h.StopProxy();  // as its main does: the held call ends, refused
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(kWait));
  pod.join();
  EXPECT_FALSE(held.ok());
  // Started again, dpproxy has the state and serves.
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> after =
      h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 2);
}

// A new dpproxy that cannot finish (here: its kubelet never comes, and it
// is stopped) hands the state back: the old one reads what the new one
// journaled meanwhile, registers again and serves on, and a later upgrade
// goes through.
TEST(HandoffTakenBackTest, ANewDpproxyStoppedBeforeItIsRegisteredHandsTheStateBack) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("before", {{"main", 1}}, kGpu)).ok());
  ProxyConfig c = h.config();
  c.takeover = true;
  c.kubelet.kubelet_root = h.dir("no-kubelet");  // it never registers
  auto next = std::make_unique<ProxyServer>(c);
  ASSERT_TRUE(next->Start().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("handoff_forward", {}, kWait).has_value());
  // Forwarded: the new one answers and journals this one.
  absl::StatusOr<sim::AllocateResponse> during =
      h.sim().Allocate(testing::PodRequest("during", {{"main", 1}}, kGpu));
  ASSERT_TRUE(during.ok()) << during.status();
  next->Shutdown();
  EXPECT_TRUE(next->events().WaitForEvent("takeover_handed_back", {}, kWait).has_value());
  auto back =
      h.proxy().events().WaitForEvent("handoff_taken_back", {}, kWait);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->value("allocations", 0), 2) << back->dump();
  next.reset();
  EXPECT_FALSE(h.proxy().handed_over());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 2);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> after =
      h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 3);
  absl::Status took = h.TakeOver();
  ASSERT_TRUE(took.ok()) << took.message();
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 3);
}

// Release on the running dpproxy's handoff socket naming `pid`, as a new
// dpproxy's first step would.
grpc::Status ReleaseTo(ProxyHarness& h, pid_t pid) {
  auto stub = handoff::v1::Handoff::NewStub(MakeUnixChannel(h.dir("state/handoff.0.sock")));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  handoff::v1::ReleaseRequest release;
  release.set_pid(pid);
  handoff::v1::ReleaseReply released;
  return stub->Release(&ctx, release, &released);
}

// Releases the state to a child process that only pauses (a successor
// that will never take over), in `*child`.
void ReleaseToAPausedChild(ProxyHarness& h, pid_t* child) {
  *child = ::fork();
  ASSERT_GE(*child, 0);
  if (*child == 0) {
    for (;;) ::pause();  // until killed
  }
  grpc::Status s = ReleaseTo(h, *child);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// A new dpproxy killed right after the release (a real process, SIGKILL):
// the old one sees it gone, takes the state back, and answers the Allocate
// it held meanwhile.
TEST(HandoffTakenBackTest, ANewDpproxyKilledAfterTheReleaseLeavesTheOldOneServing) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("before", {{"main", 1}}, kGpu)).ok());
  pid_t successor = -1;
  ASSERT_NO_FATAL_FAILURE(ReleaseToAPausedChild(h, &successor));
  absl::Notification answered;
  absl::Status held;
  const size_t from = h.sim().events().Size();
  std::thread pod([&] {
    held = h.sim().Allocate(testing::PodRequest("during", {{"main", 1}}, kGpu)).status();
    answered.Notify();
  });
  // The kubelet has asked for a preferred allocation; its Allocate follows
  // and is held.
  ASSERT_TRUE(h.sim().events().WaitForEvent("preferred_allocation", {}, kWait, from));
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "an Allocate was answered while the state was released: " << held;
  ::kill(successor, SIGKILL);
  ::waitpid(successor, nullptr, 0);
  auto back =
      h.proxy().events().WaitForEvent("handoff_taken_back", {}, kWait);
  ASSERT_TRUE(back.has_value());
  EXPECT_THAT(back->value("reason", ""), ::testing::HasSubstr("exited before it finished"));
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(kWait));
  pod.join();
  EXPECT_TRUE(held.ok()) << held;
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 2);
  EXPECT_FALSE(h.proxy().handoff_failed());
  absl::Status took = h.TakeOver();
  ASSERT_TRUE(took.ok()) << took.message();
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 2);
}

// The same on a 1.37 kubelet, which keeps each socket's client: taking the
// state back, dpproxy registers nothing again at a socket the kubelet
// still streams from (refused there, "device plugin already connected",
// and that socket then never disconnected). The kubelet kept its devices
// all along; a takeover after it is accepted, and a stop still takes the
// devices off the node.
TEST(HandoffTakenBackTest, ATakeBackOnAKubeletOfPerSocketClientsRegistersNothingTwice) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, Kubelet("1.37"));
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  const size_t start = h.sim().events().Size();
  pid_t successor = -1;
  ASSERT_NO_FATAL_FAILURE(ReleaseToAPausedChild(h, &successor));
  ::kill(successor, SIGKILL);
  ::waitpid(successor, nullptr, 0);
  ASSERT_TRUE(h.proxy().events().WaitForEvent("handoff_taken_back", {}, kWait).has_value());
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu)).ok());
  absl::Status took = h.TakeOver();
  ASSERT_TRUE(took.ok()) << took.message();
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("after-takeover", {{"main", 1}}, kGpu)).ok());
  ExpectNothingStaleThenStop(h, start);
}

// A Release naming a live process of dpproxy's user that never takes the
// state directory's lock (no takeover follows: a stray or hostile call):
// the running dpproxy takes the state back once the lock grace has passed,
// and answers the Allocate it held meanwhile, rather than holding every
// Allocate for the handoff timeout (a minute) and then stopping.
TEST(HandoffTakenBackTest, AReleaseToAProcessThatNeverLocksIsTakenBackAtOnce) {
  // Forked before dpproxy starts: a child forked later would inherit its
  // lock's open file and hold the lock.
  const pid_t named = ::fork();
  ASSERT_GE(named, 0);
  if (named == 0) {
    for (;;) ::pause();  // alive, and never a dpproxy
  }
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  grpc::Status s = ReleaseTo(h, named);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const absl::Time at = absl::Now();
  absl::StatusOr<sim::AllocateResponse> during =
      h.sim().Allocate(testing::PodRequest("during", {{"main", 1}}, kGpu));
  EXPECT_TRUE(during.ok()) << during.status();
  std::optional<Json> back = h.proxy().events().WaitForEvent(
      "handoff_taken_back", {}, Handover::kLockGrace + absl::Seconds(10));
  ASSERT_TRUE(back.has_value());
  EXPECT_THAT(back->value("reason", ""), ::testing::HasSubstr("never took the state directory"));
  EXPECT_LT(absl::Now() - at, Handover::kLockGrace + absl::Seconds(10));
  EXPECT_FALSE(h.proxy().handoff_failed());
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  ::kill(named, SIGKILL);
  ::waitpid(named, nullptr, 0);
  absl::Status took = h.TakeOver();
  ASSERT_TRUE(took.ok()) << took.message();
}

// The handoff socket serves dpproxy's own user only: a connection from
// another user is closed as it is accepted (here with the socket's mode
// opened up, as a careless chmod would), and a Release may not name
// another user's process.
TEST(HandoffProtocolTest, AnotherUsersProcessIsRefused) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root, as dpproxy does, to act as another user";
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  const std::string socket = h.dir("state/handoff.0.sock");
  ASSERT_EQ(::chmod(h.dir("").c_str(), 0711), 0);
  ASSERT_EQ(::chmod(h.dir("state").c_str(), 0711), 0);
  ASSERT_EQ(::chmod(socket.c_str(), 0666), 0);
  const pid_t other = ::fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    // Only async-signal-safe calls here. Exit 0: the server closed the
    // connection; 1: it could not connect; 2: it was kept open.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, socket.data(), socket.size());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(1);
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) ::_exit(2);
    char c;
    ::_exit(::read(fd, &c, 1) == 0 ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(other, &status, 0), other);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no connection; 2: the connection was kept";

  const pid_t nobody = ::fork();
  ASSERT_GE(nobody, 0);
  if (nobody == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    for (;;) ::pause();
  }
  // Until the child has dropped to its user, it is still root's.
  ASSERT_TRUE(h.WaitFor([&] {
    std::ifstream st(absl::StrCat("/proc/", nobody, "/status"));
    std::string line;
    while (std::getline(st, line)) {
      if (absl::StartsWith(line, "Uid:")) return absl::StrContains(line, "65534");
    }
    return false;
  }));
  grpc::Status s = ReleaseTo(h, nobody);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("runs as uid 65534"));
  ::kill(nobody, SIGKILL);
  ::waitpid(nobody, nullptr, 0);
  EXPECT_FALSE(h.proxy().handed_over());
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu)).ok());
}

// The handoff socket takes a takeover's calls in order, once each, from a
// process that exists, with bounded fields; anything else is refused with
// the reason, and the running dpproxy serves on as if nothing was asked.
TEST(HandoffProtocolTest, OutOfOrderAndMalformedCallsAreRefused) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_NO_FATAL_FAILURE(Serve(h));
  const std::string socket = h.dir("state/handoff.0.sock");
  auto stub = handoff::v1::Handoff::NewStub(MakeUnixChannel(socket));
  auto call = [&](auto method, const auto& req, auto* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    return ((*stub).*method)(&ctx, req, reply);
  };
  handoff::v1::FinishReply finished;
  grpc::Status s = call(&handoff::v1::Handoff::Stub::Finish, handoff::v1::FinishRequest(),
                        &finished);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("nothing has taken over"));
  // Each call's work runs on a thread of its own, and a caller that sends
  // call after call leaves none of them behind: a thread that ended but
  // was never joined keeps its stack (8 MiB of address space) mapped.
  auto vm_kb = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
    }
    return -1L;
  };
  const long before = vm_kb();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 50; ++i) {
    s = call(&handoff::v1::Handoff::Stub::Finish, handoff::v1::FinishRequest(), &finished);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << i;
  }
  EXPECT_LT(vm_kb() - before, 64L * 1024) << "kB of address space after 50 refused calls";
  handoff::v1::ForwardRequest forward;
  (*forward.mutable_sockets())[kGpu] = h.dir("k/device-plugins/x.sock");
  handoff::v1::ForwardReply forwarded;
  s = call(&handoff::v1::Handoff::Stub::Forward, forward, &forwarded);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("Forward before Release"));
  handoff::v1::ReleaseRequest release;
  handoff::v1::ReleaseReply released;
  release.set_pid(-1);
  s = call(&handoff::v1::Handoff::Stub::Release, release, &released);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("pid -1 is not a process ID"));
  release.set_pid(::getpid() == 1 ? 2 : 1);
  release.set_version(std::string(200, 'v'));
  s = call(&handoff::v1::Handoff::Stub::Release, release, &released);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("the version is 200 bytes"));
  release.set_version(std::string(2 << 20, 'v'));  // past the socket's message limit
  s = call(&handoff::v1::Handoff::Stub::Release, release, &released);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  handoff::v1::HandBackRequest hand_back;
  hand_back.set_pid(::getpid());
  handoff::v1::HandBackReply handed_back;
  s = call(&handoff::v1::Handoff::Stub::HandBack, hand_back, &handed_back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("HandBack before Release"));
  hand_back.set_reason(std::string(2000, 'r'));
  s = call(&handoff::v1::Handoff::Stub::HandBack, hand_back, &handed_back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("the reason is 2000 bytes"));
  // Released to this process: a HandBack from any other is refused, and
  // this one's gives the state back.
  release.set_pid(::getpid());
  release.set_version("test");
  s = call(&handoff::v1::Handoff::Stub::Release, release, &released);
  ASSERT_TRUE(s.ok()) << s.error_message();
  hand_back.set_pid(::getpid() == 1 ? 2 : 1);
  hand_back.set_reason("not mine");
  s = call(&handoff::v1::Handoff::Stub::HandBack, hand_back, &handed_back);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("was released to pid"));
  HandoffClient self(socket);
  absl::Status back = self.HandBack("the test gives it back", kWait);
  ASSERT_TRUE(back.ok()) << back;
  // Nothing was handed over: the running dpproxy still serves Allocates.
  EXPECT_FALSE(h.proxy().handed_over());
  absl::StatusOr<sim::AllocateResponse> a =
      h.sim().Allocate(testing::PodRequest("after", {{"main", 1}}, kGpu));
  EXPECT_TRUE(a.ok()) << a.status();
}

INSTANTIATE_TEST_SUITE_P(Kubelets, HandoffTest,
                         ::testing::Values("1.24", "1.31-per-socket"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& c : n) c = (c == '.' || c == '-') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace dpproxy
