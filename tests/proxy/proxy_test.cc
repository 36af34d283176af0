// dpproxy's own behaviours beyond the matrix: bad input at both edges,
// deadlines toward backends, version negotiation, renames, static backends,
// loss policies, backend swaps, proxy restarts and configuration errors.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include <grpcpp/client_context.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "backends/registration_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/metrics.h"
#include "tests/proxy/proxy_harness.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/raw_clients.h"
#include "tests/testing/sim_helpers.h"

namespace dpproxy {
namespace {

using ::dpproxy::ApiVersion;
using sample::SamplePlugin;
using sim::Personality;
using testing::kWait;
using testing::ProxyHarness;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kGpu[] = "vendor.com/gpu";

sim::AllocateRequest Pod(const std::string& name, int count) {
  return testing::PodRequest(name, {{"main", count}}, kGpu);
}

class ProxyTest : public ::testing::Test {
 protected:
  void Start(ProxyHarness& h) {
    ASSERT_TRUE(h.sim().Start().ok());
    ASSERT_TRUE(h.proxy().Start().ok());
  }
  // Starts dpproxy and a plugin, waits for the kubelet to see its devices,
  // then stops the plugin and waits for dpproxy to see it gone.
  // `preferred`: the plugin offers GetPreferredAllocation.
  void ServeThenLoseThePlugin(ProxyHarness& h, bool preferred = false) {
    ASSERT_NO_FATAL_FAILURE(Start(h));
    sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
    o.preferred = preferred;
    ASSERT_NE(h.StartPlugin(o), nullptr);
    ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
    const size_t mark = h.proxy().events().Size();
    h.StopPlugins();
    ASSERT_TRUE(
        h.proxy().events().WaitForEvent("backend_down", {{"resource", kGpu}}, kWait, mark));
  }
};

TEST_F(ProxyTest, BackendRegistrationIsValidatedLikeAKubelet) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.dial_timeout = absl::Milliseconds(300); });
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string sock = h.proxy().backend_registration_socket();

  grpc::Status s = testing::RegisterV1Beta1(sock, "v1alpha2", "other.com/x", "x.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(s.error_message(),
            "requested API version \"v1alpha2\" is not supported by kubelet. Supported "
            "version is [\"v1beta1\"]");
  s = testing::RegisterV1Beta1(sock, "v1beta1", "kubernetes.io/gpu", "x.sock");
  EXPECT_EQ(s.error_message(), "the ResourceName \"kubernetes.io/gpu\" is invalid");
  s = testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", "../../etc/evil.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("escapes the plugin directory"));
  s = testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", "/abs.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", "nobody-listens.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_THAT(s.error_message(), HasSubstr("failed to dial device plugin"));

  // Issue 25: an endpoint that can never be dialled gets the same answer at
  // once from both versions, without a dial (counted as refused endpoints
  // below, not as failed dials): a directory that does not exist, something
  // other than a socket.
  ASSERT_TRUE(WriteFileAtomic(h.dir("p/not-a-socket"), "x").ok());
  for (const char* endpoint : {"sub/dir.sock", "not-a-socket"}) {
    grpc::Status beta = testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", endpoint);
    grpc::Status alpha = testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", endpoint);
    EXPECT_EQ(beta.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << endpoint;
    EXPECT_EQ(alpha.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << endpoint;
    EXPECT_EQ(beta.error_message(), alpha.error_message()) << endpoint;
  }
  EXPECT_THAT(testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", "sub/dir.sock")
                  .error_message(),
              HasSubstr("does not exist (a plugin serves its socket before it registers)"));
  EXPECT_THAT(testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", "not-a-socket")
                  .error_message(),
              HasSubstr("names a regular file, not a socket"));

  s = testing::RegisterV1Alpha(sock, "0.1", "other.com/x", "x.sock");
  EXPECT_EQ(s.error_message(),
            "requested API version \"0.1\" is not supported by kubelet. Supported version is "
            "\"v1alpha2\"");

  // Issue 7.12: dpproxy's own registration socket is no backend; a NUL in
  // an endpoint is refused; a huge version string is not echoed whole.
  s = testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", "kubelet.sock");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("registration socket itself"));
  s = testing::RegisterV1Beta1(sock, "v1beta1", "other.com/x", std::string("x\0.sock", 7));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = testing::RegisterV1Beta1(sock, std::string(100 * 1024, 'v'), "other.com/x", "x.sock");
  EXPECT_LT(s.error_message().size(), 600u);
  // Issue 7.18: refused names never become metric labels; rejections are
  // counted by reason.
  s = testing::RegisterV1Beta1(sock, "v1beta1", "bad name with spaces", "x.sock");
  const std::string metrics = h.MetricsText();
  EXPECT_THAT(metrics, Not(HasSubstr("bad name with spaces")));
  EXPECT_THAT(metrics, Not(HasSubstr("kubernetes.io/gpu")));
  EXPECT_THAT(metrics, HasSubstr(
      "dpproxy_backend_registrations_rejected_total{reason=\"resource_name\"} 2"));
  EXPECT_THAT(metrics, HasSubstr(
      "dpproxy_backend_registrations_rejected_total{reason=\"endpoint\"} 10"));

  // Nothing else was disturbed.
  EXPECT_EQ(h.proxy().Status().resources.size(), 1u);
  EXPECT_TRUE(h.sim().Allocate(Pod("still-fine", 1)).ok());
}

// Two dpproxy processes on one state directory would interleave their
// journals: the second start fails, naming the first, and leaves the
// first's state alone.
// A lock file that cannot be opened (here a directory in its place; a
// read-only file system fails the same way) is named as what it is, not
// taken for another dpproxy.
TEST_F(ProxyTest, AnUnusableLockFileIsNamedNotTakenForAnotherProxy) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(MakeDirs(h.dir("state/lock")).ok());
  absl::Status s = h.proxy().Start();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot open " + h.dir("state/lock")));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Is a directory"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("another dpproxy")));
}

TEST_F(ProxyTest, ASecondProxyOnTheSameStateDirectoryIsRefused) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("kept", 1)).ok());
  ProxyConfig second = h.config();
  second.plugin_dir = h.dir("p2");
  second.state_lock_wait = absl::Milliseconds(200);
  ProxyServer other(second);
  absl::Status s = other.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("another dpproxy is using this state directory"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("(pid ", ::getpid(), ")")));
  // The first still serves, with its allocation.
  EXPECT_TRUE(h.sim().Allocate(Pod("still", 1)).ok());
  ASSERT_TRUE(h.proxy().Status().state.has_value());
  EXPECT_EQ(h.proxy().Status().state->allocations, 2);
}

// What /readyz and /livez report: a resource is ready once registered with
// the kubelet listening now; a kubelet gone (or replaced, until dpproxy has
// registered again) makes it unready, naming why; the state directory's
// writability is a check of its own; liveness is the housekeeping thread's.
TEST_F(ProxyTest, ReadinessFollowsRegistrationWithTheKubeletListeningNow) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  auto check = [&h](const std::string& name) -> std::optional<HealthCheck> {
    for (const HealthCheck& c : h.proxy().Readiness()) {
      if (c.name == name) return c;
    }
    return std::nullopt;
  };
  EXPECT_TRUE(h.WaitFor([&] { return h.proxy().Liveness().at(0).ok; }));
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.WaitFor([&] {
    auto c = check("registered:vendor.com/gpu");
    return c.has_value() && c->ok;
  }));
  ASSERT_TRUE(check("state-writable").has_value());
  EXPECT_TRUE(check("state-writable")->ok);

  h.sim().Stop();
  auto gone = check("registered:vendor.com/gpu");
  ASSERT_TRUE(gone.has_value());
  EXPECT_FALSE(gone->ok);
  EXPECT_THAT(gone->reason, HasSubstr("no kubelet socket at"));

  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(h.WaitFor([&] {
    auto c = check("registered:vendor.com/gpu");
    return c.has_value() && c->ok;
  }));
  const std::vector<HealthCheck> live = h.proxy().Liveness();
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].name, "housekeeping");
  EXPECT_TRUE(live[0].ok) << live[0].reason;
}

// Virtual memory of this process in kB (VmSize in /proc/self/status).
int64_t VmSizeKb() {
  absl::StatusOr<std::string> status = ReadFile("/proc/self/status");
  if (!status.ok()) return -1;
  const size_t at = status->find("VmSize:");
  return at == std::string::npos ? -1 : std::atoll(status->c_str() + at + 7);
}

// Issue 7.14: every v1alpha registration used to leave its dialer thread
// (and its stack mapping) until shutdown. Dialers are reaped, bounded, and
// one per socket.
TEST_F(ProxyTest, V1AlphaRegistrationStormsLeaveNoThreadsBehind) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.dial_timeout = absl::Milliseconds(50); });
  Start(h);
  const std::string sock = h.proxy().backend_registration_socket();
  // Warm up once, then measure.
  ASSERT_TRUE(testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", "warm.sock").ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_dial_failed", {}, kWait));
  const int64_t before = VmSizeKb();
  constexpr int kRegistrations = 200;
  int failed_dials = 1, busy = 0;
  size_t from = 0;
  for (int i = 0; i < kRegistrations; ++i) {
    grpc::Status s = testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x",
                                              absl::StrCat("gone-", i, ".sock"));
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ++busy;
      EXPECT_THAT(s.error_message(), HasSubstr("being dialled already"));
      // Wait for one dial to finish, then try the same one again.
      std::optional<Json> e = h.proxy().events().WaitForEvent("backend_dial_failed", {}, kWait,
                                                              from);
      ASSERT_TRUE(e.has_value());
      from = h.proxy().events().Size();
      --i;
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Every dial ends.
  ASSERT_TRUE(h.WaitFor([&] {
    return h.proxy().RegistrationRejections()["dial"] == kRegistrations + failed_dials;
  }));
  // One more registration reaps the finished dialers.
  ASSERT_TRUE(testing::RegisterV1Alpha(sock, "v1alpha2", "other.com/x", "last.sock").ok());
  const int64_t after = VmSizeKb();
  // 200 leaked 8 MiB stacks would be 1.6 GB; a handful of live threads is
  // well under 200 MB.
  EXPECT_LT(after - before, 200 * 1024) << "VmSize grew from " << before << " to " << after
                                        << " kB (" << busy << " busy answers)";
}

// A v1beta1 plugin is dialled before its Register is answered, on a thread
// of that registration's own: at most kMaxDials at once, more are refused
// at once naming why, the kubelet is served meanwhile, and stopping
// dpproxy (the harness's teardown) waits for the dials in flight.
TEST_F(ProxyTest, V1Beta1RegistrationsBeingDialledAreBounded) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.dial_timeout = absl::Seconds(3); });
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  // A socket that listens and never answers: each dial lasts the whole
  // dial timeout.
  testing::SilentSocket silent(h.dir("p") + "/silent.sock");
  ASSERT_GE(silent.fd(), 0);
  const std::string sock = h.proxy().backend_registration_socket();
  constexpr int kCalls = static_cast<int>(BackendRegistrationServer::kMaxDials) + 4;
  std::vector<grpc::Status> results(kCalls);
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      results[i] = testing::RegisterV1Beta1(sock, "v1beta1",
                                            absl::StrCat("silent", i, ".example.com/x"),
                                            "silent.sock");
    });
  }
  // The refused ones are answered at once, while the others dial.
  ASSERT_TRUE(h.WaitFor([&] { return h.proxy().RegistrationRejections()["busy"] >= 4; }))
      << "refused as busy: " << h.proxy().RegistrationRejections()["busy"];
  // Meanwhile the kubelet is served.
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-0");
  v1beta1::AllocateResponse resp;
  grpc::Status allocated = stub->Allocate(&ctx, req, &resp);
  EXPECT_TRUE(allocated.ok()) << allocated.error_message();
  for (auto& t : calls) t.join();
  int busy = 0, dial_failed = 0;
  for (const grpc::Status& r : results) {
    if (r.error_code() == grpc::StatusCode::UNAVAILABLE) {
      ++busy;
      EXPECT_THAT(r.error_message(), HasSubstr("v1beta1 plugins are being dialled already"));
    } else {
      ++dial_failed;
      EXPECT_EQ(r.error_code(), grpc::StatusCode::UNKNOWN) << r.error_message();
      EXPECT_THAT(r.error_message(), HasSubstr("failed to dial device plugin"));
    }
  }
  EXPECT_EQ(dial_failed, static_cast<int>(BackendRegistrationServer::kMaxDials));
  EXPECT_EQ(busy, kCalls - dial_failed);
  // A dial that ended makes room: a plugin registers again.
  grpc::Status again = testing::RegisterV1Beta1(sock, "v1beta1", kGpu, "sample-gpu.sock");
  EXPECT_TRUE(again.ok()) << again.error_message();
}

// Issue 7.12: a v1alpha registration is probed before it is attached: one
// pointing at a socket that does not serve the v1alpha API never replaces a
// working backend.
TEST_F(ProxyTest, V1AlphaRegistrationOfANonV1AlphaSocketIsRefused) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string sock = h.proxy().backend_registration_socket();
  // The same resource, in v1alpha, pointing at the v1beta1 plugin's socket.
  grpc::Status s = testing::RegisterV1Alpha(sock, "v1alpha2", kGpu, "sample-gpu.sock");
  ASSERT_TRUE(s.ok()) << s.error_message();  // v1alpha: answered at once, dialled after
  std::optional<Json> e =
      h.proxy().events().WaitForEvent("backend_dial_failed", {{"requested_resource", kGpu}}, kWait);
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT((*e)["error"].get<std::string>(),
              HasSubstr("does not serve the v1alpha DevicePlugin API"));
  Json status = StatusToJson(h.proxy().Status());
  EXPECT_EQ(status["resources"][0]["backend_api"], "v1beta1");
  EXPECT_TRUE(status["resources"][0]["backend_connected"].get<bool>());
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-0"), "Healthy");
}

// Issue 7.12: a malformed device list from a backend never reaches the
// kubelet, and the refusal shows in the status, /readyz and a metric; an
// unknown health is reported Unhealthy, as a kubelet reads it.
TEST_F(ProxyTest, MalformedDeviceListsAreRefused) {
  for (const char* fault : {"empty-id"}) {
    SCOPED_TRACE(fault);
    ProxyHarness h(Personality::kV1Beta1Sync, false);
    Start(h);
    sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
    o.device_list_fault = fault;
    ASSERT_NE(h.StartPlugin(o), nullptr);
    ASSERT_TRUE(h.proxy().events().WaitForEvent("device_list_refused", {{"resource", kGpu}},
                                                kWait));
    sim::State st = h.sim().GetState();
    const sim::ResourceState* r = h.Resource(st, kGpu);
    EXPECT_TRUE(r == nullptr || r->devices_size() == 0) << "a malformed list reached the kubelet";
    const std::string why = h.proxy().Status().resources.at(0).device_list_refused;
    EXPECT_THAT(why, HasSubstr("a device ID is empty"));
    bool named = false;
    for (const HealthCheck& c : h.proxy().Readiness()) {
      if (c.name == absl::StrCat("device-list:", kGpu)) named = !c.ok && absl::StrContains(c.reason, why);
    }
    EXPECT_TRUE(named) << "/readyz does not name the refused list";
    EXPECT_THAT(h.MetricsText(),
                HasSubstr(absl::StrCat("dpproxy_device_list_refused{resource=\"", kGpu, "\"} 1")));
  }
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.device_list_fault = "unknown-health";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 3, kWait));
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-0"), "Unhealthy");
  EXPECT_TRUE(h.proxy().events().WaitForEvent("device_health_unknown", {{"devices", 1}}, kWait));
}

// An Allocate answer over the kubelet's 4 MiB would fail the pod at the
// kubelet: dpproxy refuses it with its size and the limit, journals
// nothing of it and holds none of its devices.
TEST_F(ProxyTest, AnAnswerTheKubeletCannotReceiveIsRefusedAndNothingIsHeld) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.allocate_padding = 5 << 20;
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("big", 1));
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()),
              HasSubstr("more than the kubelet receives (4194304 bytes)"));
  EXPECT_EQ(h.proxy().state()->Snapshot().allocations_size(), 0);
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 0);
}

// Plugins in the field list one ID more than once (a quantity trick, or
// thousands of IDs turned into one replacement character). The kubelet
// keeps one device per ID, Healthy if any entry is; so does dpproxy, with
// a warning and an event naming the count, and the resource is ready.
TEST_F(ProxyTest, DuplicateDeviceIdsCollapseAsTheKubeletCollapsesThem) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.device_list_fault = "duplicate-id";  // gpu-0 listed again at the end
  sample::SamplePlugin* plugin = h.StartPlugin(o);
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(h.proxy().events().WaitForEvent(
      "device_ids_collapsed", {{"resource", kGpu}, {"entries", 1}, {"devices", 4}}, kWait));
  sim::State st = h.sim().GetState();
  const sim::ResourceState* r = h.Resource(st, kGpu);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->devices_size(), 4);
  for (const HealthCheck& c : h.proxy().Readiness()) {
    EXPECT_TRUE(c.ok) << c.name << ": " << c.reason;
  }
  EXPECT_TRUE(h.proxy().Status().resources.at(0).device_list_refused.empty());
  // One entry of the two Unhealthy: the device stays Healthy.
  ASSERT_TRUE(plugin->SetHealth("gpu-1", "Unhealthy").ok());
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-1") == "Unhealthy"; }));
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-0"), "Healthy");
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("all", 3));
  EXPECT_TRUE(a.ok()) << a.status();
}

// dpproxy and a v1beta1 plugin of 4 devices named "\x00".."\x03", seen by
// the kubelet; nullptr (the failure reported) if not.
sample::SamplePlugin* StartControlCharacterPlugin(ProxyHarness& h) {
  if (!h.sim().Start().ok() || !h.proxy().Start().ok()) {
    ADD_FAILURE() << "the kubelet or dpproxy did not start";
    return nullptr;
  }
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.id_pattern = "{ctrl}";
  sample::SamplePlugin* plugin = h.StartPlugin(o);
  if (plugin == nullptr || !h.sim().WaitForResource(kGpu, 4, kWait)) {
    ADD_FAILURE() << "the plugin's 4 devices did not reach the kubelet";
    return nullptr;
  }
  return plugin;
}

// A plugin in the field names its devices with one control character each
// ("\x00", "\x01", ...), which a kubelet accepts end to end, and a node may
// run pods under those IDs already (the plugin registered directly before
// dpproxy). dpproxy serves them as they are, so that putting it in front
// renames nothing the kubelet's checkpoint holds; the plugin gets its own
// IDs back, a restart keeps them, and the warning escapes them. Under
// compact_ids they are shown compact instead, and counted.
TEST_F(ProxyTest, ControlCharacterDeviceIdsAreServedAsTheyAre) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  sample::SamplePlugin* plugin = StartControlCharacterPlugin(h);
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(h.KubeletHealth(kGpu, std::string(1, '\0')), "Healthy");
  EXPECT_EQ(h.KubeletHealth(kGpu, "\x03"), "Healthy");
  EXPECT_EQ(h.KubeletHealth(kGpu, CompactDeviceId("\x03")), "");  // never renamed
  EXPECT_TRUE(h.proxy().events().WaitForEvent("device_ids_control_characters",
                                              {{"devices", 4}}, kWait));
  EXPECT_EQ(h.proxy().Status().resources.at(0).device_ids_mapped, 0);
  // The plugin checks the IDs it is asked for against its own.
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("p1", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  const std::string held = testing::DeviceIdsOf(a->allocations(0)).at(0);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_LT(static_cast<unsigned char>(held[0]), 0x20);
  // dpproxy restarts: the same IDs, and the pod from before keeps its device.
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_EQ(h.KubeletHealth(kGpu, held), "Healthy");
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 1);
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("p2", 1));
  ASSERT_TRUE(b.ok()) << b.status();
}

TEST_F(ProxyTest, UnderCompactIdsControlCharacterIdsAreShownCompact) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.compact_ids.insert(kGpu); });
  sample::SamplePlugin* plugin = StartControlCharacterPlugin(h);
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(h.KubeletHealth(kGpu, CompactDeviceId(std::string(1, '\0'))), "Healthy");
  EXPECT_TRUE(h.proxy().events().WaitForEvent("device_ids_mapped", {{"devices", 4}}, kWait));
  EXPECT_EQ(h.proxy().Status().resources.at(0).device_ids_mapped, 4);
  EXPECT_THAT(h.MetricsText(),
              HasSubstr(absl::StrCat("dpproxy_device_ids_mapped{resource=\"", kGpu, "\"} 4")));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("p1", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(plugin->Status().allocate_calls(), 1);
}

// A plugin with no devices (yet): the kubelet is sent the empty list, a
// valid message of no bytes (an empty gRPC buffer would abort the stream).
TEST_F(ProxyTest, AnEmptyDeviceListReachesTheKubelet) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.fault = "no-devices";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().events().WaitForEvent("devices", {{"resource", kGpu}, {"capacity", 0}},
                                            kWait));
  EXPECT_EQ(h.proxy().Status().resources.at(0).devices_total, 0);
  // Still serving: a second resource registers and lists its devices.
  sample::SamplePluginOptions nic = h.PluginOptions(ApiVersion::kV1Beta1);
  nic.resource = "vendor.com/nic";
  ASSERT_NE(h.StartPlugin(nic), nullptr);
  EXPECT_TRUE(h.sim().WaitForResource("vendor.com/nic", 4, kWait));
}

// Issue 7.12: an Allocate naming a device twice or an Unhealthy device is
// refused before it reaches the backend.
TEST_F(ProxyTest, AllocateOfDuplicateOrUnhealthyDevicesIsRefused) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  SamplePlugin* p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(p->SetHealth("gpu-3", "Unhealthy").ok());
  ASSERT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-3") == "Unhealthy"; }));
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  {
    grpc::ClientContext ctx;
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("gpu-1");
    req.mutable_container_requests(0)->add_devices_ids("gpu-1");
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("names device \"gpu-1\" twice"));
  }
  {
    grpc::ClientContext ctx;
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("gpu-3");
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("is Unhealthy"));
  }
  EXPECT_EQ(p->Status().allocate_calls(), 0);
  EXPECT_EQ(h.proxy().state()->AllocationCount(), 0);
}

TEST(MetricsAddressTest, LoopbackIsToldApart) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:9464"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:9464"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:9464"));
  EXPECT_FALSE(IsLoopbackAddress("0.0.0.0:9464"));
  EXPECT_FALSE(IsLoopbackAddress(":9464"));
  EXPECT_FALSE(IsLoopbackAddress("10.1.2.3:9464"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:9464"));
  EXPECT_FALSE(IsLoopbackAddress("node.example.com:9464"));
}

TEST_F(ProxyTest, KubeletSideRejectsUnknownDevicesAndEmptyRequests) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  SamplePlugin* p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  {
    grpc::ClientContext ctx;
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("gpu-99");
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "unknown device ID \"gpu-99\" for resource vendor.com/gpu");
  }
  {
    grpc::ClientContext ctx;
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub->Allocate(&ctx, v1beta1::AllocateRequest(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(p->Status().allocate_calls(), 0);  // never reached the backend
  // An unknown service on the proxy's socket answers like Go.
  auto reg = v1beta1::Registration::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  grpc::ClientContext ctx;
  v1beta1::Empty e;
  grpc::Status s = reg->Register(&ctx, v1beta1::RegisterRequest(), &e);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(s.error_message(), "unknown service v1beta1.Registration");
}

TEST_F(ProxyTest, HangingBackendGivesTheKubeletADeadlineError) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.kubelet.backend_timeout = absl::Milliseconds(300); });
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Alpha);
  o.allocate_delay = absl::Seconds(3);
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  grpc::ClientContext ctx;  // no deadline, like the kubelet
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("gpu-0");
  v1beta1::AllocateResponse resp;
  grpc::Status s = stub->Allocate(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("did not answer Allocate within 300ms"));
  EXPECT_THAT(s.error_message(), HasSubstr(h.dir("p")));  // names the backend
}

TEST_F(ProxyTest, BackendDyingMidCallGivesUnavailable) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.allocate_delay = absl::Seconds(2);
  sample::SamplePlugin* plugin = h.StartPlugin(o);
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  grpc::Status s;
  std::thread caller([&] {
    auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
    grpc::ClientContext ctx;
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("gpu-0");
    v1beta1::AllocateResponse resp;
    s = stub->Allocate(&ctx, req, &resp);
  });
  // The call is in the plugin (which holds it for 2 s) when the plugin dies.
  ASSERT_TRUE(h.WaitFor([&] { return plugin->Status().allocate_calls() == 1; }));
  h.StopPlugins();
  caller.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("is unavailable during Allocate"));
  // The proxy is fine: the kubelet's stream to it is still up.
  sim::State st = h.sim().GetState();
  EXPECT_TRUE(h.Resource(st, kGpu)->connected());
}

TEST_F(ProxyTest, NegotiationFallsBackToV1AlphaAndRecordsWhy) {
  ProxyHarness h(Personality::kV1Alpha, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  std::optional<Json> e =
      h.proxy().events().WaitForEvent("kubelet_registered", {{"kubelet_api", "v1alpha2"}}, kWait);
  ASSERT_TRUE(e.has_value());
  ASSERT_EQ((*e)["refused_first"].size(), 1u);
  EXPECT_THAT((*e)["refused_first"][0].get<std::string>(),
              HasSubstr("UNIMPLEMENTED: unknown service v1beta1.Registration"));
}

TEST_F(ProxyTest, PinnedKubeletApiDoesNotFallBack) {
  ProxyHarness h(Personality::kV1Alpha, false,
                 [](ProxyConfig& c) { c.kubelet.api = ApiVersion::kV1Beta1; });
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  std::optional<Json> e =
      h.proxy().events().WaitForEvent("kubelet_registration_failed", {{"resource", kGpu}}, kWait);
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT((*e)["error"].get<std::string>(), HasSubstr("unknown service v1beta1.Registration"));
  EXPECT_EQ(h.sim().GetState().resources_size(), 0);
}

TEST_F(ProxyTest, RenamesTheResourceTowardTheKubelet) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.renames["legacy.example.com/gpu"] = "vendor.com/gpu";
  });
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Alpha);
  o.resource = "legacy.example.com/gpu";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sim::State st = h.sim().GetState();
  EXPECT_EQ(h.Resource(st, "legacy.example.com/gpu"), nullptr);
  EXPECT_TRUE(h.sim().Allocate(Pod("renamed", 1)).ok());
}

TEST_F(ProxyTest, StaticBackendIsProbedConnectedAndReconnected) {
  testing::ShortTempDir plugin_dir;
  const std::string socket = plugin_dir.Sub("static-gpu.sock");
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    c.static_backends.push_back({kGpu, socket, std::nullopt});
  });
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Alpha);
  o.registration = sample::RegistrationMode::kNone;
  o.kubelet_socket = plugin_dir.Sub("unused.sock");
  o.socket_name = "static-gpu.sock";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  Start(h);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_EQ(h.proxy().Status().resources[0].backend_api, "v1alpha2");  // probed
  EXPECT_EQ(h.proxy().Status().resources[0].static_backend, true);
  h.StopPlugins();
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
  ASSERT_NE(h.StartPlugin(o), nullptr);
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Healthy"; }));
}

// A reload (SIGHUP) applies static backends and the loss policy at once,
// leaves a registered resource untouched, and reports the rest as taking
// effect at the next start, without applying it.
TEST_F(ProxyTest, ReloadAppliesWhatCanChangeLiveAndReportsTheRest) {
  testing::ShortTempDir plugin_dir;
  const std::string socket = plugin_dir.Sub("static-nic.sock");
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  sample::SamplePluginOptions nic = h.PluginOptions(ApiVersion::kV1Beta1);
  nic.resource = "vendor.com/nic";
  nic.registration = sample::RegistrationMode::kNone;
  nic.socket_name = "static-nic.sock";
  nic.kubelet_socket = plugin_dir.Sub("unused.sock");
  ASSERT_NE(h.StartPlugin(nic), nullptr);
  const size_t sim_mark = h.sim().events().Size();

  ProxyConfig next = h.config();
  next.static_backends.push_back({"vendor.com/nic", socket, std::nullopt});
  next.policy.loss_policy = LossPolicy::kHold;
  next.policy.hold = absl::Minutes(10);
  next.kubelet.backend_timeout = absl::Seconds(7);  // the harness has 5 s
  const ProxyServer::ReloadResult r = h.proxy().Reload(next);
  EXPECT_THAT(r.applied, Contains(HasSubstr("backends[0].endpoint:")));
  EXPECT_THAT(r.applied, Contains("backend_loss.policy: unhealthy -> hold"));
  EXPECT_THAT(r.applied, Contains("timeouts.backend: 5s -> 7s"));
  EXPECT_TRUE(r.needs_restart.empty());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("config_reloaded", {}, kWait));
  // The new static backend is dialled and registered with the kubelet.
  ASSERT_TRUE(h.sim().WaitForResource("vendor.com/nic", 4, kWait));
  // The resource that did not change was not registered again.
  EXPECT_FALSE(h.sim().events().WaitForEvent("register_request", {{"resource", kGpu}},
                                             absl::ZeroDuration(), sim_mark));
  // The new loss policy holds: the GPU plugin's loss keeps its devices Healthy.
  const size_t mark = h.proxy().events().Size();
  h.StopPlugins();
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_down", {{"resource", kGpu}}, kWait, mark));
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-0"), "Healthy");
  // Back to unhealthy: a backend lost and held now is marked at once.
  next.policy.loss_policy = LossPolicy::kUnhealthy;
  h.proxy().Reload(next);
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
  // Nothing changed: nothing applied, nothing reported.
  const ProxyServer::ReloadResult same = h.proxy().Reload(next);
  EXPECT_TRUE(same.applied.empty());
  EXPECT_TRUE(same.needs_restart.empty());
  // What only a start can change is reported, not applied.
  next.status_file = h.dir("elsewhere.json");
  const ProxyServer::ReloadResult later = h.proxy().Reload(next);
  EXPECT_TRUE(later.applied.empty());
  EXPECT_THAT(later.needs_restart, ElementsAre(HasSubstr("status_file:")));
}

// The backend timeout changes live: the next Allocate has the new limit.
TEST_F(ProxyTest, AReloadedBackendTimeoutLimitsTheNextCall) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);  // 5 s
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.allocate_delay = absl::Seconds(1);
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  auto allocate = [&](const std::string& id) {
    auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
    grpc::ClientContext ctx;  // no deadline, like the kubelet
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids(id);
    v1beta1::AllocateResponse resp;
    return stub->Allocate(&ctx, req, &resp);
  };
  EXPECT_TRUE(allocate("gpu-0").ok());  // 1 s within 5 s
  ProxyConfig next = h.config();
  next.kubelet.backend_timeout = absl::Milliseconds(200);
  EXPECT_THAT(h.proxy().Reload(next).applied, ElementsAre("timeouts.backend: 5s -> 200ms"));
  grpc::Status s = allocate("gpu-1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("within 200ms"));
  next.kubelet.backend_timeout = absl::Seconds(5);
  EXPECT_THAT(h.proxy().Reload(next).applied, ElementsAre("timeouts.backend: 200ms -> 5s"));
  EXPECT_TRUE(allocate("gpu-2").ok());
}

// A harness whose resources are held at their health for `hold` when their
// plugin goes.
std::function<void(ProxyConfig&)> HoldFor(absl::Duration hold) {
  return [hold](ProxyConfig& c) {
    c.policy.loss_policy = LossPolicy::kHold;
    c.policy.hold = hold;
  };
}

TEST_F(ProxyTest, HoldPolicyRidesOutAShortBackendRestart) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, HoldFor(absl::Seconds(2)));
  ASSERT_NO_FATAL_FAILURE(ServeThenLoseThePlugin(h));
  EXPECT_EQ(h.KubeletHealth(kGpu, "gpu-0"), "Healthy");  // held
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
}

// An Allocate that finds no backend (the plugin restarting while its
// devices are held Healthy) waits for one to register and is then served;
// one the kubelet gives up on meanwhile ends with the kubelet's deadline,
// and dpproxy goes on serving.
TEST_F(ProxyTest, AnAllocateThatFindsNoBackendWaitsForOneToRegister) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, HoldFor(absl::Seconds(60)));
  ASSERT_NO_FATAL_FAILURE(ServeThenLoseThePlugin(h));
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  auto allocate = [&](const std::string& id, std::optional<absl::Duration> deadline,
                      v1beta1::AllocateResponse* resp) {
    grpc::ClientContext ctx;
    if (deadline) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *deadline));
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids(id);
    return stub->Allocate(&ctx, req, resp);
  };
  v1beta1::AllocateResponse given_up;
  EXPECT_EQ(allocate("gpu-0", absl::Milliseconds(300), &given_up).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // The next one waits (no deadline, as the kubelet) until a plugin is back.
  grpc::Status waited;
  v1beta1::AllocateResponse resp;
  absl::Notification answered;
  std::thread call([&] {
    waited = allocate("gpu-1", std::nullopt, &resp);
    answered.Notify();
  });
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "answered with no backend: " << waited.error_message();
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(kWait));
  call.join();
  EXPECT_TRUE(waited.ok()) << waited.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  std::vector<std::string> values;
  for (const auto& [k, v] : resp.container_responses(0).envs()) values.push_back(v);
  EXPECT_THAT(values, Contains("gpu-1"));  // the plugin's answer for that device
}

// GetPreferredAllocation and PreStartContainer are served on gRPC's callback
// API too: with no backend, each waits for one on a thread of its own, a
// kubelet that gives up ends the wait, and a plugin that registers answers.
TEST_F(ProxyTest, TheRarerCallsThatFindNoBackendWaitForOneToRegister) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, HoldFor(absl::Seconds(60)));
  ASSERT_NO_FATAL_FAILURE(ServeThenLoseThePlugin(h, /*preferred=*/true));
  auto stub = v1beta1::DevicePlugin::NewStub(MakeUnixChannel(h.proxy().KubeletSocketOf(kGpu)));
  auto prefer = [&](std::optional<absl::Duration> deadline,
                    v1beta1::PreferredAllocationResponse* resp) {
    grpc::ClientContext ctx;
    if (deadline) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *deadline));
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (const char* id : {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}) c->add_available_deviceids(id);
    c->set_allocation_size(2);
    return stub->GetPreferredAllocation(&ctx, req, resp);
  };
  auto pre_start = [&](std::optional<absl::Duration> deadline) {
    grpc::ClientContext ctx;
    if (deadline) ctx.set_deadline(absl::ToChronoTime(absl::Now() + *deadline));
    v1beta1::PreStartContainerRequest req;
    req.add_devices_ids("gpu-2");
    v1beta1::PreStartContainerResponse resp;
    return stub->PreStartContainer(&ctx, req, &resp);
  };
  v1beta1::PreferredAllocationResponse given_up;
  EXPECT_EQ(prefer(absl::Milliseconds(300), &given_up).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(pre_start(absl::Milliseconds(300)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // Without a deadline, both wait until a plugin is back.
  grpc::Status preferred, started;
  v1beta1::PreferredAllocationResponse resp;
  absl::Notification preferred_done, started_done;
  std::thread prefer_call([&] {
    preferred = prefer(std::nullopt, &resp);
    preferred_done.Notify();
  });
  std::thread pre_start_call([&] {
    started = pre_start(std::nullopt);
    started_done.Notify();
  });
  EXPECT_FALSE(preferred_done.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "answered with no backend: " << preferred.error_message();
  EXPECT_FALSE(started_done.HasBeenNotified()) << started.error_message();
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.preferred = true;
  o.pre_start_required = true;
  ASSERT_NE(h.StartPlugin(o), nullptr);
  EXPECT_TRUE(preferred_done.WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(started_done.WaitForNotificationWithTimeout(kWait));
  prefer_call.join();
  pre_start_call.join();
  EXPECT_TRUE(preferred.ok()) << preferred.error_message();
  EXPECT_TRUE(started.ok()) << started.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).deviceids_size(), 2);
}

// A kubelet whose Register does not answer until released (as a 1.25+
// kubelet dialling a socket for 10 s).
class StuckKubelet final : public v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest*,
                        v1beta1::Empty*) override {
    ++calls;
    events.Emit("register_called");
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    return reply;
  }
  std::atomic<int> calls{0};
  EventLog events{"stuck_kubelet"};  // the harness's waits look again at each
  absl::Notification release;
  grpc::Status reply = grpc::Status::OK;  // set before release

  // Serves this as the harness's kubelet (its kubelet.sock).
  std::unique_ptr<grpc::Server> Serve(ProxyHarness& h) {
    if (!MakeDirs(h.dir("k/device-plugins")).ok()) return nullptr;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(h.dir("k/device-plugins/kubelet.sock")),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    h.Watch(events);
    return builder.BuildAndStart();
  }
};

// A registration on its way when the kubelet restarts fails with the old
// kubelet; the new one is registered with at once, not after the
// registrar's backoff (it was 100 ms: a re-registration tail).
TEST_F(ProxyTest, ARegistrationThatFailsWithAReplacedKubeletIsRetriedAtOnce) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  StuckKubelet old_kubelet;
  old_kubelet.reply = grpc::Status(grpc::StatusCode::UNAVAILABLE, "kubelet is stopping");
  std::unique_ptr<grpc::Server> server = old_kubelet.Serve(h);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.WaitFor([&] { return old_kubelet.calls.load() >= 1; }));
  // A new kubelet starts (its own kubelet.sock, our socket wiped) while
  // the Register to the old one is still on its way.
  const size_t mark = h.proxy().events().Size();
  ASSERT_TRUE(h.sim().Start().ok());
  old_kubelet.release.Notify();  // the old kubelet's answer: it is stopping
  std::optional<Json> retry = h.proxy().events().WaitForEvent(
      "kubelet_registration_retry", {{"resource", kGpu}}, kWait, mark);
  ASSERT_TRUE(retry.has_value());
  EXPECT_TRUE((*retry)["kubelet_replaced"].get<bool>()) << retry->dump();
  EXPECT_EQ((*retry)["retry_in_ms"].get<int64_t>(), 0) << retry->dump();
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  h.StopProxy();
  server->Shutdown(std::chrono::system_clock::now());
}

// Issue 7.17: timers (the hold expiry here) ran on the thread that made
// blocking Register calls, so devices stayed Healthy long past the hold.
TEST_F(ProxyTest, HoldExpiresWhileARegisterIsBlocked) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.policy.loss_policy = LossPolicy::kHold;
    c.policy.hold = absl::Milliseconds(300);
  });
  StuckKubelet kubelet;
  std::unique_ptr<grpc::Server> server = kubelet.Serve(h);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  auto healthy = [&] {
    const ProxyStatus st = h.proxy().Status();
    return st.resources.empty() ? int64_t{-1} : st.resources[0].devices_healthy;
  };
  ASSERT_TRUE(h.WaitFor([&] { return healthy() == 4 && kubelet.calls.load() >= 1; }));
  // The backend goes away while the Register is still stuck.
  h.StopPlugins();
  EXPECT_TRUE(h.WaitFor([&] { return healthy() == 0; }))
      << "the hold expiry waited for a blocked Register";
  EXPECT_TRUE(h.proxy().events().WaitForEvent("hold_expired", {{"resource", kGpu}, {"held_ms", 300}},
                                              absl::ZeroDuration()));
  EXPECT_EQ(kubelet.calls.load(), 1);  // still the same, stuck call
  kubelet.release.Notify();
  h.StopProxy();
  server->Shutdown(std::chrono::system_clock::now());
}

TEST_F(ProxyTest, SwappingAV1AlphaBackendForAV1Beta1OneKeepsTheKubeletStream) {
  ProxyHarness h(Personality::kV1Beta1Async, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("before", 1)).ok());
  const size_t mark = h.sim().events().Size();
  h.StopPlugins();
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.pre_start_required = true;
  SamplePlugin* p = h.StartPlugin(o);
  ASSERT_NE(p, nullptr);
  // New options: the proxy registers again so a 1.10-1.24 kubelet learns them.
  EXPECT_TRUE(h.WaitFor([&] {
    sim::State st = h.sim().GetState();  // keep it alive while r points into it
    const auto* r = h.Resource(st, kGpu);
    return r != nullptr && r->pre_start_required() && r->allocatable() == 4;
  }));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("after", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->allocations(0).pre_started());
  EXPECT_EQ(p->Status().pre_start_calls(), 1);
  sim::ReadmitResponse r = h.sim().Readmit();
  for (const auto& res : r.results()) EXPECT_TRUE(res.admitted()) << res.message();
  EXPECT_FALSE(h.sim().events().WaitForEvent("resource_removed", {}, absl::ZeroDuration(), mark));
}

// A backend replaced by one whose options differ (it now asks for
// PreStartContainer) on a kubelet that reads the options when it dials
// (1.25+). A 1.37 kubelet refuses a registration at a socket it is still
// connected to ("device plugin already connected") and then keeps that
// socket's endpoint for good: dpproxy does not register again there, and
// calls the backend's PreStartContainer itself right after each Allocate,
// as the kubelet, told no, never will. The resource never leaves the
// kubelet, and the next pod's container gets its PreStartContainer.
class NewOptionsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(NewOptionsTest, ABackendWithNewOptionsIsServedWithoutRegisteringAgain) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, [](sim::KubeletSimOptions& so) {
    so.kubelet = *sim::ParseKubeletVersion(GetParam());
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("before", 1)).ok());
  const size_t mark = h.sim().events().Size(), proxy_mark = h.proxy().events().Size();
  h.StopPlugins();
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.pre_start_required = true;
  SamplePlugin* p = h.StartPlugin(o);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_up", {{"resource", kGpu}}, kWait,
                                              proxy_mark));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("after", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(p->Status().pre_start_calls(), 1);
  EXPECT_FALSE(h.sim().events().WaitForEvent("registration_rejected", {}, absl::ZeroDuration(),
                                             mark));
  EXPECT_FALSE(h.sim().events().WaitForEvent("plugin_lost", {}, absl::ZeroDuration(), mark));
  // Its end, as dpproxy stops, still tells the kubelet the devices are
  // gone: the kubelet never kept an endpoint that no longer answers.
  const size_t stop_mark = h.sim().events().Size();
  h.StopProxy();
  EXPECT_TRUE(h.sim().events().WaitForEvent("plugin_lost", {{"resource", kGpu}}, kWait,
                                            stop_mark));
}

// A kubelet's start wipes dpproxy's socket while a registration is on its
// way, dpproxy serves it again, and the kubelet's dial-back reaches the new
// server: the kubelet holds the socket as served now. dpproxy keeps that
// registration. Registering again there was refused by a 1.37 kubelet
// ("device plugin already connected") and retried for as long as the
// kubelet ran, the resource's registration check failing all along (seen
// in tools/dev bench storm).
TEST(RegistrationRaceTest, ARegistrationThatReachedTheSocketServedAgainIsKept) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, nullptr, [](sim::KubeletSimOptions& so) {
    so.kubelet = *sim::ParseKubeletVersion("1.37");
  });
  std::atomic<bool> rewired{false};
  h.sim().SetBeforeDialBack([&](const std::string& socket) {
    if (rewired.load() || !absl::StrContains(socket, "dpproxy-")) return;
    // As a kubelet's start removes it; dpproxy serves it again (a new
    // file, though it may reuse the inode).
    if (::unlink(socket.c_str()) != 0) return;
    const absl::Time deadline = absl::Now() + kWait;
    struct stat now;
    while (absl::Now() < deadline) {
      if (::stat(socket.c_str(), &now) == 0) {
        rewired = true;
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  std::optional<nlohmann::json> served_again = h.proxy().events().WaitForEvent(
      "kubelet_registration_served_again", {{"resource", kGpu}}, kWait);
  ASSERT_TRUE(rewired.load());
  ASSERT_TRUE(served_again.has_value());
  EXPECT_EQ(served_again->value("kubelet_holds_it", false), true) << served_again->dump();
  // The next kubelet start registers the resource anew; until then nothing
  // was refused and nothing failed.
  h.sim().SetBeforeDialBack(nullptr);
  const size_t mark = h.proxy().events().Size();
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.proxy().events().WaitForEvent("kubelet_registered", {{"resource", kGpu}}, kWait,
                                              mark));
  EXPECT_FALSE(h.sim().events().WaitForEvent("registration_rejected", {}, absl::ZeroDuration()));
  EXPECT_FALSE(h.proxy().events().WaitForEvent("kubelet_registration_failed", {},
                                               absl::ZeroDuration()));
}

INSTANTIATE_TEST_SUITE_P(Kubelets, NewOptionsTest, ::testing::Values("1.31", "1.37"),
                         [](const auto& info) {
                           return absl::StrReplaceAll(info.param, {{".", "_"}});
                         });

// A vendor plugin's DaemonSet rolled with maxSurge behind dpproxy: the new
// instance registers at dpproxy while the old one runs, then the old one
// exits. A 1.25-1.36 kubelet would tear the new registration down by name
// (kubernetes#121994) if the plugins registered with it directly; dpproxy's
// own registration never changes, and the old backend's end is ignored.
TEST_F(ProxyTest, ARollingUpdateOfThePluginKeepsTheKubeletRegistration) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions first = h.PluginOptions(ApiVersion::kV1Beta1);
  first.socket_name = "gpu-1.sock";
  SamplePlugin* old_instance = h.StartPlugin(first);
  ASSERT_NE(old_instance, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const size_t sim_mark = h.sim().events().Size(), mark = h.proxy().events().Size();
  sample::SamplePluginOptions second = first;
  second.socket_name = "gpu-2.sock";
  SamplePlugin* new_instance = h.StartPlugin(second);
  ASSERT_NE(new_instance, nullptr);
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_up", {{"resource", kGpu},
                                                             {"replaced", true}},
                                              kWait, mark));
  old_instance->Stop();
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("after", 1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(new_instance->Status().allocate_calls(), 1);
  EXPECT_EQ(old_instance->Status().allocate_calls(), 0);
  // The kubelet never lost dpproxy's registration, and dpproxy never
  // reported the resource down.
  EXPECT_FALSE(h.sim().events().WaitForEvent("plugin_lost", {{"resource", kGpu}},
                                             absl::ZeroDuration(), sim_mark));
  EXPECT_FALSE(h.proxy().events().WaitForEvent("backend_down", {{"resource", kGpu}},
                                               absl::ZeroDuration(), mark));
  sim::State st = h.sim().GetState();
  const auto* r = h.Resource(st, kGpu);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->connected());
  EXPECT_EQ(r->allocatable(), 4);  // every device still Healthy
}

TEST_F(ProxyTest, ProxyRestartMakesPluginsRegisterAgain) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  SamplePlugin* p = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Alpha));
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  // The proxy cleaned its plugin directory like a kubelet: the plugin saw
  // its socket go and registered again. (At least once more: it may see
  // the new kubelet.sock and its own socket's removal one after the other
  // and answer both, which the old "exactly twice" failed on 1 run in 10.)
  EXPECT_TRUE(h.WaitFor([&] { return p->Status().registrations() >= 2; }));
  EXPECT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  EXPECT_TRUE(h.sim().Allocate(Pod("after-proxy-restart", 2)).ok());
}

TEST_F(ProxyTest, ManyResourcesInOneProxy) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  for (int i = 0; i < 5; ++i) {
    sample::SamplePluginOptions o = h.PluginOptions(i % 2 ? ApiVersion::kV1Alpha
                                                          : ApiVersion::kV1Beta1);
    o.resource = absl::StrCat("vendor.com/dev", i);
    o.devices = i + 1;
    ASSERT_NE(h.StartPlugin(o), nullptr);
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(h.sim().WaitForResource(absl::StrCat("vendor.com/dev", i), i + 1, kWait)) << i;
  }
  EXPECT_EQ(h.proxy().Status().resources.size(), 5u);
}

// The metric families docs/metrics.md describes, configuration.md and the
// Grafana dashboard name are exactly the ones dpproxy serves once it has
// answered a call and seen a kubelet restart.
TEST_F(ProxyTest, MetricsDocsAndDashboardNameTheFamiliesServed) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("m", 1)).ok());
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string text = h.MetricsText();
  std::set<std::string> served;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) served.insert(std::string(line.substr(0, line.find(' '))));
  }
  ASSERT_GT(served.size(), 20u) << text;
  auto named = [](const std::string& file) {
    absl::StatusOr<std::string> doc = ReadFile(testing::Runfile(file));
    EXPECT_TRUE(doc.ok()) << file;
    std::set<std::string> names;
    const std::string& d = doc.ok() ? *doc : std::string();
    // A family name: a prefix at a word's start, lower case and '_' on.
    auto name_at = [&d](size_t at) {
      size_t end = at;
      while (end < d.size() && (std::islower(static_cast<unsigned char>(d[end])) || d[end] == '_')) {
        ++end;
      }
      std::string name = d.substr(at, end - at);
      for (const char* suffix : {"_bucket", "_count", "_sum"}) {
        if (absl::EndsWith(name, suffix) && name.size() > strlen(suffix)) {
          name.resize(name.size() - strlen(suffix));
        }
      }
      return name;
    };
    for (const std::string prefix : {"dpproxy_", "process_"}) {
      for (size_t at = d.find(prefix); at != std::string::npos; at = d.find(prefix, at + 1)) {
        if (at > 0 && (std::isalnum(static_cast<unsigned char>(d[at - 1])) || d[at - 1] == '_')) {
          continue;
        }
        const std::string name = name_at(at);
        if (name != prefix) names.insert(name);
      }
    }
    return names;
  };
  const std::set<std::string> documented = named("docs/metrics.md");
  for (const std::string& f : served) {
    EXPECT_EQ(documented.count(f), 1u) << f << " is served but docs/metrics.md does not list it";
  }
  for (const char* file : {"docs/metrics.md", "docs/configuration.md",
                                  "deploy/grafana-dashboard.json"}) {
    for (const std::string& n : named(file)) {
      // DRA mode's own gauges are served in DRA mode only (dra_mode_test).
      if (absl::StartsWith(n, "dpproxy_dra_") && absl::EndsWith(n, "_ok")) continue;
      if (n == "dpproxy_dra_registered" || n == "dpproxy_dra_claims_prepared") continue;
      EXPECT_EQ(served.count(n), 1u) << file << " names " << n << ", which dpproxy does not serve";
    }
  }
}

TEST_F(ProxyTest, MetricsDescribeResourcesCallsAndLosses) {
  ProxyHarness h(Personality::kV1Alpha, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.sim().Allocate(Pod("m", 2)).ok());
  const std::string text = h.MetricsText();
  // The kubelet's call and dpproxy's call to the plugin, each timed.
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"v1beta1\","
                              "code=\"OK\",kubelet_api=\"v1alpha2\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_count{backend_api=\"v1beta1\","
                              "code=\"OK\",kubelet_api=\"v1alpha2\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"backend\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_rpc_duration_seconds_bucket{backend_api=\"v1beta1\","
                              "code=\"OK\",kubelet_api=\"v1alpha2\",method=\"Allocate\","
                              "resource=\"vendor.com/gpu\",side=\"kubelet\",le=\"5e-05\"}"));
  EXPECT_THAT(text, HasSubstr("dpproxy_journal_fsync_duration_seconds_count 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_kubelet_registrations_total{resource=\"vendor.com/gpu\","
                              "result=\"ok\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_backend_connects_total{resource=\"vendor.com/gpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_build_info{version=\""));
  EXPECT_THAT(text, Not(HasSubstr("dpproxy_events_total")));
  EXPECT_THAT(text, HasSubstr("dpproxy_devices{resource=\"vendor.com/gpu\",health=\"healthy\"} 4"));
  EXPECT_THAT(text, HasSubstr("dpproxy_backend_connected{resource=\"vendor.com/gpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_kubelet_registered{resource=\"vendor.com/gpu\"} 1"));
  // The versions in an info metric of their own: a version change is not a
  // new series of the gauges above.
  EXPECT_THAT(text, HasSubstr("dpproxy_resource_info{resource=\"vendor.com/gpu\","
                              "kubelet_api=\"v1alpha2\",backend_api=\"v1beta1\"} 1"));
  EXPECT_THAT(text, HasSubstr("process_resident_memory_bytes "));
  EXPECT_THAT(text, HasSubstr("process_open_fds "));
  EXPECT_THAT(text, HasSubstr("process_start_time_seconds "));
  // A v1beta1 plugin's CDI devices cannot reach a 1.9 kubelet: counted.
  EXPECT_THAT(text, HasSubstr("dpproxy_lossy_translations_total{resource=\"vendor.com/gpu\",kind=\"cdi_devices\"} 2"));
  EXPECT_THAT(text, HasSubstr("dpproxy_journal_allocations 1"));
  EXPECT_THAT(text, HasSubstr("dpproxy_state_bytes{file=\"journal\"} "));
  EXPECT_THAT(text, Not(HasSubstr("dpproxy_state_bytes{file=\"journal\"} 0\n")));
  EXPECT_THAT(text, HasSubstr("dpproxy_state_save_failures_total 0"));
}

// The kubelet goes away: the metric, the status and /readyz say so within
// one detection, and come back with it.
TEST_F(ProxyTest, MetricsAndStatusFollowTheKubeletAway) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const std::string registered = "dpproxy_kubelet_registered{resource=\"vendor.com/gpu\"} ";
  ASSERT_TRUE(h.WaitFor([&] { return absl::StrContains(h.MetricsText(), registered + "1"); }));
  h.sim().Stop();
  ASSERT_TRUE(h.WaitFor([&] { return absl::StrContains(h.MetricsText(), registered + "0"); }));
  const ProxyStatus away = h.proxy().Status();
  ASSERT_EQ(away.resources.size(), 1u);
  EXPECT_FALSE(away.resources[0].kubelet_registered);
  EXPECT_EQ(away.resources[0].kubelet_api, "v1beta1");  // the last one, kept
  EXPECT_THAT(StatusTable(away), HasSubstr("(away; was v1beta1)"));
  ASSERT_FALSE(away.not_ready.empty());
  EXPECT_EQ(away.not_ready[0].name, "registered:vendor.com/gpu");
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.WaitFor([&] { return absl::StrContains(h.MetricsText(), registered + "1"); }));
  EXPECT_TRUE(h.proxy().Status().not_ready.empty());
}

TEST_F(ProxyTest, CdiDevicesCanAlsoTravelAsAnAnnotation) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.kubelet.cdi_annotations = true; });
  Start(h);
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("cdi", 2));
  ASSERT_TRUE(a.ok()) << a.status();
  const auto& r = a->allocations(0).response();
  ASSERT_EQ(r.cdi_devices_size(), 2);  // the field is still there
  std::string expected;
  for (const auto& id : a->allocations(0).device_ids()) {
    expected += (expected.empty() ? "" : ",") + std::string("vendor.com/gpu=") + id;
  }
  EXPECT_EQ(r.annotations().at("cdi.k8s.io/dpproxy_vendor.com_gpu"), expected);
}

// A plugin that restarts itself within backend_loss.grace (1 s by
// default: one that saw kubelet.sock created, say) is no flap to the
// kubelet: its devices stay Healthy in the kubelet's view throughout. One
// that stays away longer has them reported Unhealthy once the grace ends.
TEST_F(ProxyTest, APluginRestartingItselfWithinTheGraceIsNoFlap) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  const sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  const size_t from = h.sim().events().Size();
  const size_t proxy_from = h.proxy().events().Size();
  h.StopPlugins();
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_up", {{"resource", kGpu}}, kWait,
                                              proxy_from));
  ASSERT_TRUE(h.proxy().events().WaitForEvent("backend_down", {{"resource", kGpu}},
                                              absl::ZeroDuration(), proxy_from))
      << "the plugin's restart was never seen";
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  for (const Json& e : h.sim().events().Since(from)) {
    if (e["event"] == "devices" && e["resource"] == kGpu) {
      EXPECT_EQ(e["allocatable"], 4) << e.dump();
    }
  }
  // Gone for good: Unhealthy once the grace has passed.
  const absl::Time gone = absl::Now();
  h.StopPlugins();
  EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, "gpu-0") == "Unhealthy"; }));
  EXPECT_GE(absl::Now() - gone, ResourcePolicy().grace);
}

TEST_F(ProxyTest, OneStreamPerBackendSoSingleStreamPluginsLoseNoUpdate) {
  // This plugin hands each update to only one ListAndWatch stream, as the
  // kubelet's stub plugin does: a proxy with two streams would lose some.
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.single_stream_updates = true;
  SamplePlugin* p = h.StartPlugin(o);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("gpu-", i);
    ASSERT_TRUE(p->SetHealth(id, "Unhealthy").ok());
    EXPECT_TRUE(h.WaitFor([&] { return h.KubeletHealth(kGpu, id) == "Unhealthy"; })) << id;
  }
  EXPECT_EQ(p->Status().list_and_watch_streams(), 1);
}

// A plugin's list over the kubelet's 4 MiB (100,000 long IDs), from a
// plugin of either version, that no pod holds: compact IDs go on by
// themselves and the kubelet gets every device. (A list pods hold under
// its long IDs stays as it is and is reported:
// ResourceTest.AListTooLargeForTheKubeletIsReported.)
TEST_F(ProxyTest, DeviceListsOver4MiBGetCompactIdsByThemselves) {
  for (ApiVersion api : {ApiVersion::kV1Beta1, ApiVersion::kV1Alpha}) {
    SCOPED_TRACE(api == ApiVersion::kV1Beta1 ? "v1beta1 plugin" : "v1alpha plugin");
    ProxyHarness h(Personality::kV1Beta1Sync, false);
    Start(h);
    sample::SamplePluginOptions o = h.PluginOptions(api);
    o.devices = 100000;
    o.id_pattern = "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-{i}";
    ASSERT_NE(h.StartPlugin(o), nullptr);
    std::optional<Json> e = h.proxy().events().WaitForEvent(
        "compact_ids_on", {{"resource", kGpu}, {"devices", 100000}}, kWait);
    ASSERT_TRUE(e.has_value());
    EXPECT_GT((*e)["bytes"].get<size_t>(), 4u << 20);
    ASSERT_TRUE(h.sim().WaitForResource(kGpu, 100000, absl::Seconds(30)));
    const Json st = StatusToJson(h.proxy().Status());
    ASSERT_EQ(st["resources"].size(), 1u);
    EXPECT_EQ(st["resources"][0]["devices_total"], 100000);
    EXPECT_EQ(st["resources"][0]["device_list_too_large"], false);
    EXPECT_LT(st["resources"][0]["device_list_bytes"].get<size_t>(), 4u << 20);
    EXPECT_FALSE(h.proxy().events().WaitForEvent("device_list_too_large", {},
                                                 absl::ZeroDuration()));
    // The backend's stream stayed up: nothing was lost or refused.
    EXPECT_FALSE(h.proxy().events().WaitForEvent("backend_down", {}, absl::ZeroDuration()));
  }
}

// Compact IDs that went on by themselves are part of the state: after a
// restart the kubelet is shown the same IDs from the start, a pod's devices
// are never taken for devices "held under another name or ID", and the IDs
// stay compact even once the plugin's list fits the kubelet's limit again
// (the kubelet's checkpoint holds the compact ones).
TEST_F(ProxyTest, CompactIdsThatWentOnByThemselvesOutliveARestart) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = 100000;
  o.id_pattern = "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-{i}";
  ASSERT_NE(h.StartPlugin(o), nullptr);
  ASSERT_TRUE(h.proxy().events().WaitForEvent("compact_ids_on", {{"resource", kGpu}}, kWait));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 100000, absl::Seconds(30)));
  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("trainer", 2));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::string> held = testing::DeviceIdsOf(a->allocations(0));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_EQ(held[0].size(), 14u) << held[0];  // compact
  ASSERT_TRUE(h.proxy().WaitForSavePasses(h.proxy().save_passes() + 2, kWait));

  // The plugin now lists 1,000 devices, well under the limit, and dpproxy
  // restarts before it is back.
  h.StopPlugins();
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  o.devices = 1000;
  const size_t from = h.sim().events().Size();
  ASSERT_NE(h.StartPlugin(o), nullptr);
  // The plugin's list, not the 100,000 remembered ones dpproxy registers
  // first (those are as many and more).
  ASSERT_TRUE(h.sim().events().WaitFor(
      [](const Json& e) {
        return e.value("event", "") == "devices" && e.value("resource", "") == kGpu &&
               e.value("capacity", 0) < 100000;
      },
      absl::Seconds(30), from));
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 1000, absl::Seconds(30)));
  ASSERT_TRUE(h.proxy().WaitForSavePasses(h.proxy().save_passes() + 2, kWait));
  EXPECT_FALSE(h.proxy().events().WaitForEvent("devices_held_elsewhere", {},
                                               absl::ZeroDuration()));
  const sim::State st = h.sim().GetState();
  const auto* r = h.Resource(st, kGpu);
  ASSERT_NE(r, nullptr);
  std::set<std::string> shown;
  for (const auto& d : r->devices()) {
    if (d.health() == "Healthy") shown.insert(d.id());
  }
  EXPECT_EQ(shown.count(CompactDeviceId("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-7")), 1u);
  EXPECT_EQ(shown.count("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-7"), 0u);
  const Json status = StatusToJson(h.proxy().Status());
  EXPECT_EQ(status["resources"][0]["compact_ids"], "on by itself") << status.dump(1);
  // The next pod gets free devices, none of the trainer's.
  absl::StatusOr<sim::AllocateResponse> b = h.sim().Allocate(Pod("next", 2));
  ASSERT_TRUE(b.ok()) << b.status();
  for (const std::string& id : testing::DeviceIdsOf(b->allocations(0))) {
    EXPECT_TRUE(std::find(held.begin(), held.end(), id) == held.end()) << id;
  }
}

// The same 100,000 long IDs with compact IDs on: the kubelet sees every
// device, an allocation reaches the plugin with the plugin's own IDs, and
// dpproxy and kubelet restarts keep the IDs the kubelet knows.
TEST_F(ProxyTest, CompactIdsLetALargeListReachTheKubelet) {
  ProxyHarness h(Personality::kV1Beta1Sync, false,
                 [](ProxyConfig& c) { c.compact_ids = {kGpu}; });
  Start(h);
  sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
  o.devices = 100000;
  o.id_pattern = "MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-{i}";
  sample::SamplePlugin* plugin = h.StartPlugin(o);
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 100000, absl::Seconds(30)));
  EXPECT_FALSE(h.proxy().events().WaitForEvent("device_list_too_large", {},
                                               absl::ZeroDuration()));
  auto kubelet_ids = [&] {
    std::set<std::string> ids;
    const sim::State st = h.sim().GetState();
    if (const auto* r = h.Resource(st, kGpu)) {
      for (const auto& d : r->devices()) ids.insert(d.id());
    }
    return ids;
  };
  const std::set<std::string> before = kubelet_ids();
  ASSERT_EQ(before.size(), 100000u);
  EXPECT_EQ(before.count(CompactDeviceId("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-42")),
            1u);

  absl::StatusOr<sim::AllocateResponse> a = h.sim().Allocate(Pod("trainer", 2));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::string> given = testing::DeviceIdsOf(a->allocations(0));
  std::optional<Json> call = plugin->events().WaitForEvent("allocate", {}, kWait);
  ASSERT_TRUE(call.has_value());
  std::set<std::string> reached;
  for (const auto& id : (*call)["container_requests"][0]) reached.insert(id.get<std::string>());
  std::set<std::string> expected;
  for (const std::string& id : given) {
    ASSERT_EQ(id.size(), 14u) << id;  // the kubelet holds compact IDs
    for (int i = 0; i < 100000; i += 1) {
      const std::string backend = absl::StrCat("MIG-5a8c8e1c-2f06-4b9d-9d6c-1f2e3d4c5b6a-slice-", i);
      if (CompactDeviceId(backend) == id) {
        expected.insert(backend);
        break;
      }
    }
  }
  EXPECT_EQ(reached, expected);  // the plugin got its own IDs
  ASSERT_EQ(expected.size(), 2u);

  // dpproxy restarts (the list is restored from its state), then the
  // kubelet: the IDs the kubelet knows stay the same.
  h.RestartProxy();
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 100000, absl::Seconds(30)));
  EXPECT_EQ(kubelet_ids(), before);
  ASSERT_TRUE(h.sim().Restart().ok());
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 100000, absl::Seconds(30)));
  EXPECT_EQ(kubelet_ids(), before);
  sim::ReadmitResponse r = h.sim().Readmit();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_TRUE(r.results(0).admitted()) << r.results(0).message();
}

// An idle proxy does no work proportional to devices: its once-a-second
// pass compares change counters, and status (file and metrics) is built
// again only when something in it changed.
TEST_F(ProxyTest, IdlePassesBuildNoStatus) {
  testing::ShortTempDir status_dir;
  ProxyHarness h(Personality::kV1Beta1Sync, false, [&](ProxyConfig& c) {
    c.status_file = status_dir.Sub("status.json");
  });
  Start(h);
  sample::SamplePlugin* plugin = h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1));
  ASSERT_NE(plugin, nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  auto passes = [&](int n) {
    return h.proxy().WaitForSavePasses(h.proxy().save_passes() + n, kWait);
  };
  ASSERT_TRUE(passes(2));  // settled
  const int64_t builds = h.proxy().status_builds();
  ASSERT_TRUE(passes(3));
  EXPECT_EQ(h.proxy().status_builds(), builds);
  (void)h.MetricsText();  // a scrape never lists devices
  EXPECT_EQ(h.proxy().status_builds(), builds);
  // A change is seen at the next pass: the status file shows it.
  ASSERT_TRUE(plugin->SetHealth("gpu-1", "Unhealthy").ok());
  EXPECT_TRUE(testing::WaitForFile(
      h.config().status_file,
      [](const std::string& text) {
        const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        return !j.is_discarded() && j["resources"][0]["devices_healthy"] == 3;
      },
      kWait))
      << *ReadFile(h.config().status_file);
  EXPECT_GT(h.proxy().status_builds(), builds);
}

TEST(ProxyConfigTest, PluginDirIsComparedByIdentity) {
  testing::ShortTempDir dir;
  ASSERT_TRUE(MakeDirs(dir.Sub("k/device-plugins")).ok());
  ASSERT_TRUE(MakeDirs(dir.Sub("k/plugins_registry")).ok());
  ASSERT_EQ(::symlink(dir.Sub("k/device-plugins").c_str(), dir.Sub("alias").c_str()), 0);
  ProxyConfig c;
  c.kubelet.kubelet_root = dir.Sub("k");
  c.state_dir = dir.Sub("state");
  for (const std::string& bad :
       {dir.Sub("k"), dir.Sub("k/"), dir.Sub("k/plugins_registry"),
        dir.Sub("k/device-plugins/../device-plugins"), dir.Sub("alias"), dir.Sub("k/sub/new"),
        dir.path()}) {
    c.plugin_dir = bad;
    absl::Status s = ValidateConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("kubelet root")) << bad;
  }
  c.plugin_dir = dir.Sub("p");
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.state_dir = dir.Sub("p");
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("plugin directory"));
  c.state_dir = dir.Sub("p/state");
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("plugin directory"));
  c.state_dir = dir.Sub("k/dpproxy");
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("inside the kubelet root"));
}

TEST(ProxyConfigTest, StartRemovesOnlyStaleSocketsFromThePluginDir) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  ASSERT_TRUE(MakeDirs(h.dir("p/nested")).ok());
  ASSERT_TRUE(WriteFileAtomic(h.dir("p/notes.txt"), "mine").ok());
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  EXPECT_EQ(*ReadFile(h.dir("p/notes.txt")), "mine");
  EXPECT_TRUE(PathExists(h.dir("p/nested")));
}

// Issue 7.10: a state or plugin directory other users may write is refused.
TEST(ProxyConfigTest, DirectoriesOthersCanWriteAreRefused) {
  for (const char* which : {"state", "p"}) {
    ProxyHarness h(Personality::kV1Beta1Sync, false);
    ASSERT_TRUE(MakeDirs(h.dir(which)).ok());
    ASSERT_EQ(::chmod(h.dir(which).c_str(), 0777), 0);
    ASSERT_TRUE(h.sim().Start().ok());
    absl::Status s = h.proxy().Start();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << which;
    EXPECT_THAT(std::string(s.message()), HasSubstr("writable by every user")) << which;
  }
}

// Issue 7.11: sockets and files get deliberate modes whatever the umask.
TEST(ProxyConfigTest, SocketsAndFilesHaveDeliberateModesUnderUmask000) {
  const mode_t old = ::umask(0);
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  h.RestartProxy([&](ProxyConfig& c) { c.status_file = h.dir("state/status.json"); });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  // Both are written by the saver's pass, in either order.
  ASSERT_TRUE(h.WaitFor([&] {
    return PathExists(h.dir("state/status.json")) && PathExists(h.dir("state/state.pb"));
  }));
  ::umask(old);
  auto mode = [](const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  EXPECT_EQ(mode(h.dir("p/kubelet.sock")), 0700);
  EXPECT_EQ(mode(h.proxy().KubeletSocketOf(kGpu)), 0700);
  EXPECT_EQ(mode(h.dir("state/state.pb")), 0600);
  EXPECT_EQ(mode(h.dir("state/journal.wal")), 0600);
  EXPECT_EQ(mode(h.dir("state/status.json")), 0640);
}

// A status file that cannot be written (its directory is missing) is said
// once and tried again once a minute, not rebuilt and warned about at
// every housekeeping pass; dpproxy serves on.
TEST(ProxyConfigTest, AStatusFileThatCannotBeWrittenIsReportedOnce) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  h.RestartProxy([&](ProxyConfig& c) { c.status_file = h.dir("missing/dir/status.json"); });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  ASSERT_NE(h.StartPlugin(h.PluginOptions(ApiVersion::kV1Beta1)), nullptr);
  ASSERT_TRUE(h.sim().WaitForResource(kGpu, 4, kWait));
  ASSERT_TRUE(h.proxy().events().WaitForEvent("status_write_failed", {}, kWait).has_value());
  // The status changes (an allocation) and housekeeping passes go on.
  ASSERT_TRUE(h.sim().Allocate(testing::PodRequest("p", {{"main", 1}}, kGpu)).ok());
  const int64_t passes = h.proxy().housekeeping_passes();
  ASSERT_TRUE(h.proxy().WaitForHousekeepingPasses(passes + 3, kWait));
  int failures = 0;
  for (const Json& e : h.proxy().events().Since(0)) {
    failures += e.value("event", "") == "status_write_failed";
  }
  EXPECT_EQ(failures, 1);
}

TEST(ProxyConfigTest, SocketGroupMakesTheRegistrationSocket0660) {
  ProxyHarness h(Personality::kV1Beta1Sync, false, [](ProxyConfig& c) {
    c.socket_group = "0";
  });
  ASSERT_TRUE(h.sim().Start().ok());
  ASSERT_TRUE(h.proxy().Start().ok());
  struct stat st;
  ASSERT_EQ(::stat(h.dir("p/kubelet.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, 0u);
  ProxyConfig bad = h.config();
  bad.socket_group = "no-such-group-dpp";
  EXPECT_THAT(std::string(ValidateConfig(bad).message()), HasSubstr("unknown group"));
}

TEST(ProxyConfigTest, BadConfigurationsAreNamed) {
  ProxyConfig c;
  c.kubelet.kubelet_root = "/tmp/k";
  c.plugin_dir = "/tmp/k/device-plugins";
  EXPECT_THAT(std::string(ValidateConfig(c).message()),
              HasSubstr("lies inside the kubelet root /tmp/k"));
  c.plugin_dir = "relative/dir";
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("must be an absolute path"));
  c.plugin_dir = "/tmp/" + std::string(110, 'p');
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("at most 107 bytes"));
  c.plugin_dir = "/tmp/p";
  c.renames["a.com/x"] = "badname";
  EXPECT_THAT(std::string(ValidateConfig(c).message()), HasSubstr("rename a.com/x -> badname"));
  c.renames.clear();
  c.static_backends.push_back({"vendor.com/gpu", "/run/x.sock", std::nullopt});
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.backend_max_list_bytes = 1 << 20;
  EXPECT_THAT(std::string(ValidateConfig(c).message()),
              HasSubstr("must be 4 to 2047 MiB (gRPC's limit); got 1 MiB"));
}

// Two plugins that both number their devices dev-0..dev-3: a kubelet
// before 1.37 would put one resource's device health on the other's pods.
// dpproxy says so once per pair, and says nothing of resources whose IDs
// differ.
TEST_F(ProxyTest, ResourcesShowingTheSameDeviceIdsAreNamedOnce) {
  ProxyHarness h(Personality::kV1Beta1Sync, false);
  Start(h);
  for (const char* resource : {"vendor.com/gpu", "vendor.com/nic", "vendor.com/fpga"}) {
    sample::SamplePluginOptions o = h.PluginOptions(ApiVersion::kV1Beta1);
    o.resource = resource;
    o.socket_name = absl::StrCat(absl::StripPrefix(resource, "vendor.com/"), ".sock");
    o.id_pattern = std::string(resource) == "vendor.com/fpga" ? "fpga-{i}" : "dev-{i}";
    ASSERT_NE(h.StartPlugin(o), nullptr);
    ASSERT_TRUE(h.sim().WaitForResource(resource, 4, kWait)) << resource;
  }
  std::optional<Json> told = h.proxy().events().WaitForEvent(
      "device_ids_shared", {{"resources", {"vendor.com/gpu", "vendor.com/nic"}}}, kWait);
  ASSERT_TRUE(told.has_value());
  EXPECT_EQ((*told)["count"], 4);
  EXPECT_EQ((*told)["first"][0], "dev-0");
  // Two more passes, each after every list above was taken: told once,
  // and fpga shares nothing.
  const int64_t passes = h.proxy().housekeeping_passes();
  ASSERT_TRUE(h.proxy().WaitForHousekeepingPasses(passes + 2, kWait));
  int shared = 0;
  for (const Json& e : h.proxy().events().Snapshot()) {
    if (e.value("event", "") == "device_ids_shared") {
      ++shared;
      EXPECT_EQ(e["resources"], Json({"vendor.com/gpu", "vendor.com/nic"}));
    }
  }
  EXPECT_EQ(shared, 1);
}

}  // namespace
}  // namespace dpproxy
