// Devices taken out of service by hand, with real processes: dpproxy and a
// sample plugin as processes, the kubelet simulator in the test, dpctl's
// commands against the control socket. A cordoned device is Unhealthy to
// the kubelet while the pod holding it runs on; the cordon holds through a
// dpproxy restart and a takeover with no moment of the device shown
// Healthy, until uncordon. Bad requests and callers of another user are
// refused, each with an error naming the problem.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/dpctl/control_commands.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using testing::Runfile;
using testing::Spawn;

constexpr absl::Duration kWait = absl::Seconds(30);
constexpr char kGpu[] = "vendor.com/gpu";

// The health `device` has in a "devices" event of the simulated kubelet
// for the GPU resource ("" if the event is another or does not list it).
std::string HealthIn(const Json& e, const std::string& device) {
  if (e.value("event", "") != "devices" || e.value("resource", "") != kGpu) return "";
  for (const Json& d : e["devices"]) {
    if (d.value("id", "") == device) return d.value("health", "");
  }
  return "";
}

// What a dpctl command printed and how it ended.
struct Outcome {
  int rc = -1;
  std::string out, err;
};

class CordonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeDirs(tmp_.Sub("p")).ok());
    ASSERT_TRUE(sim_.Start().ok());
    proxy_ = SpawnProxy({});
    ASSERT_NE(proxy_, nullptr);
    plugin_ = Spawn({Runfile("tools/sample_plugin/sample_plugin"), "--resource=vendor.com/gpu",
                     "--devices=4", "--kubelet_socket=" + tmp_.Sub("p") + "/kubelet.sock",
                     "--quiet"});
    ASSERT_NE(plugin_, nullptr);
    ASSERT_TRUE(sim_.WaitForResource(kGpu, 4, kWait));
  }

  std::unique_ptr<ChildProcess> SpawnProxy(std::vector<std::string> more) {
    std::vector<std::string> args = {
        Runfile("proxy/dpproxy"), "--kubelet_root=" + tmp_.Sub("k"),
        "--plugin_dir=" + tmp_.Sub("p"), "--state_dir=" + state_, "--status_file=" + status_,
        "--metrics_address=", "--minloglevel=2", "--events=" + events_};
    args.insert(args.end(), more.begin(), more.end());
    return Spawn(args);
  }

  // dpctl's command, run in this process (as root, like the test).
  Outcome Dpctl(const std::string& command, std::vector<std::string> args,
                const std::string& reason = "") {
    std::ostringstream out, err;
    std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
    std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
    Outcome o;
    o.rc = RunControlCommand(command, args, state_, reason, "table");
    std::cout.rdbuf(old_out);
    std::cerr.rdbuf(old_err);
    o.out = out.str();
    o.err = err.str();
    return o;
  }

  // Whether dpproxy's events file has a line with every one of `parts`.
  bool ProxySaid(const std::vector<std::string>& parts) {
    return testing::WaitForFile(
        events_,
        [&](const std::string& file) {
          for (absl::string_view line : absl::StrSplit(file, '\n')) {
            bool all = true;
            for (const std::string& p : parts) all = all && absl::StrContains(line, p);
            if (all) return true;
          }
          return false;
        },
        kWait);
  }

  // The device a new pod was given.
  std::string AdmitPod(const std::string& name) {
    absl::StatusOr<sim::AllocateResponse> r =
        sim_.Allocate(testing::PodRequest(name, {{"main", 1}}, kGpu));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->allocations_size() != 1) return "";
    return r->allocations(0).device_ids(0);
  }

  testing::ShortTempDir tmp_;
  const std::string state_ = tmp_.Sub("s");
  const std::string events_ = tmp_.Sub("proxy.jsonl");
  const std::string status_ = tmp_.Sub("status.json");
  sim::KubeletSim sim_{[this] {
    sim::KubeletSimOptions o;
    o.root_dir = tmp_.Sub("k");
    o.personality = sim::Personality::kV1Beta1Sync;
    o.container_runtime = false;
    return o;
  }()};
  std::unique_ptr<ChildProcess> proxy_;
  std::unique_ptr<ChildProcess> plugin_;
};

TEST_F(CordonTest, ACordonHoldsThroughARestartAndATakeoverUntilUncordoned) {
  const std::string held = AdmitPod("holder");
  ASSERT_FALSE(held.empty());
  size_t mark = sim_.events().Size();
  Outcome c = Dpctl("cordon", {kGpu, held}, "ECC errors on the card");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_THAT(c.out, HasSubstr("cordoned"));
  EXPECT_TRUE(sim_.events()
                  .WaitFor([&](const Json& e) { return HealthIn(e, held) == "Unhealthy"; }, kWait,
                           mark)
                  .has_value());
  // Who asked: this process.
  EXPECT_TRUE(ProxySaid({"\"device_cordoned\"", absl::StrCat("\"by_pid\":", ::getpid()),
                         "\"by_uid\":0", "ECC errors on the card"}));
  // The pod that holds it runs on; a new pod gets another device.
  const sim::State st = sim_.GetState();
  ASSERT_EQ(st.pods_size(), 1);
  EXPECT_EQ(st.pods(0).phase(), "Running");
  const std::string other = AdmitPod("newcomer");
  EXPECT_NE(other, held);
  // The status (dpproxy status, metrics) lists it.
  EXPECT_TRUE(testing::WaitForFile(
      status_, [&](const std::string& s) { return absl::StrContains(s, "\"cordoned\":[{"); },
      kWait));

  // A dpproxy restart: from its first list on, the kubelet sees it Unhealthy.
  testing::Kill(proxy_.get(), SIGTERM);
  mark = sim_.events().Size();
  proxy_ = SpawnProxy({});
  ASSERT_NE(proxy_, nullptr);
  ASSERT_TRUE(sim_.events()
                  .WaitFor([&](const Json& e) { return HealthIn(e, held) == "Unhealthy"; }, kWait,
                           mark)
                  .has_value());
  ASSERT_TRUE(sim_.WaitForResource(kGpu, 2, kWait));  // the plugin is back
  // A takeover by a new dpproxy beside the running one.
  std::unique_ptr<ChildProcess> successor = SpawnProxy({"--takeover"});
  ASSERT_NE(successor, nullptr);
  ASSERT_TRUE(proxy_->Wait(kWait).has_value()) << "the old dpproxy did not hand over";
  proxy_ = std::move(successor);
  ASSERT_TRUE(ProxySaid({"\"takeover_complete\""}));
  for (const Json& e : sim_.events().Since(mark)) {
    EXPECT_NE(HealthIn(e, held), "Healthy") << "shown Healthy while cordoned: " << e.dump();
  }
  EXPECT_EQ(testing::KubeletHealth(sim_, kGpu, held), "Unhealthy");
  Outcome list = Dpctl("cordons", {});
  ASSERT_EQ(list.rc, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("ECC errors on the card"));

  mark = sim_.events().Size();
  Outcome u = Dpctl("uncordon", {kGpu, held});
  ASSERT_EQ(u.rc, 0) << u.err;
  EXPECT_TRUE(sim_.events()
                  .WaitFor([&](const Json& e) { return HealthIn(e, held) == "Healthy"; }, kWait,
                           mark)
                  .has_value());
  EXPECT_TRUE(ProxySaid({"\"device_uncordoned\"", "\"was_reason\":\"ECC errors on the card\""}));
  EXPECT_EQ(Dpctl("cordons", {}).out, "no device is cordoned\n");
}

TEST_F(CordonTest, BadRequestsAreRefusedNamingTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string reason;
    int rc;
    const char* error;
  };
  const Case cases[] = {
      {{"vendor.com/nic", "dev-0"}, "x", 1, "resource vendor.com/nic is not served"},
      {{kGpu, "dev-9"}, "x", 1, "resource vendor.com/gpu has no device dev-9 (it lists 4"},
      {{kGpu, "dev-0"}, std::string(1025, 'r'), 2, "the reason is 1025 bytes, more than 1024"},
      {{kGpu, "dev-0"}, "line one\nline two", 2, "the reason has a control character (U+000A"},
      {{kGpu, "dev-0"}, "\x1b[31mred", 2, "the reason has a control character (U+001B"},
      {{kGpu, "dev-0"}, "", 2, "give a --reason"},
      {{kGpu}, "x", 2, "needs a RESOURCE and a DEVICE"},
  };
  for (const Case& c : cases) {
    Outcome o = Dpctl("cordon", c.args, c.reason);
    EXPECT_EQ(o.rc, c.rc) << c.error;
    EXPECT_THAT(o.err, HasSubstr(c.error));
  }
  Outcome u = Dpctl("uncordon", {kGpu, "dev-0"});
  EXPECT_EQ(u.rc, 1);
  EXPECT_THAT(u.err, HasSubstr("device dev-0 of vendor.com/gpu is not cordoned"));
  // Nothing was cordoned, and dpproxy serves on.
  EXPECT_EQ(Dpctl("cordons", {}).out, "no device is cordoned\n");
  EXPECT_TRUE(sim_.WaitForResource(kGpu, 4, absl::ZeroDuration()));
}

// Another user: refused by the socket's mode, and, were the mode opened
// up, by dpproxy itself, which logs who tried.
TEST_F(CordonTest, AnotherUserIsRefused) {
  // dpctl where the other user may run it.
  const std::string bin = tmp_.Sub("bin");
  ASSERT_TRUE(MakeDirs(bin).ok());
  absl::StatusOr<std::string> dpctl = ReadFile(Runfile("tools/dpctl/dpctl"));
  ASSERT_TRUE(dpctl.ok());
  ASSERT_TRUE(WriteFileAtomic(bin + "/dpctl", *dpctl, 0755).ok());
  for (const std::string& d : {tmp_.path(), bin}) ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  auto as_nobody = [&](const std::string& out) {
    std::unique_ptr<ChildProcess> p = Spawn(
        {"/bin/sh", "-c",
         absl::StrCat("exec setpriv --reuid=65534 --regid=65534 --clear-groups ", bin,
                      "/dpctl cordon vendor.com/gpu dev-0 --reason=x --state_dir=", state_,
                      " >", out, " 2>&1")});
    std::optional<int> status = p != nullptr ? p->Wait(kWait) : std::nullopt;
    EXPECT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 1);
    absl::StatusOr<std::string> text = ReadFile(out);
    return text.ok() ? *text : std::string();
  };
  EXPECT_THAT(as_nobody(tmp_.Sub("denied.txt")), HasSubstr("permission denied on"));

  // The mode opened up: dpproxy closes the connection and logs who.
  ASSERT_EQ(::chmod(state_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((state_ + "/control.sock").c_str(), 0666), 0);
  EXPECT_THAT(as_nobody(tmp_.Sub("closed.txt")),
              HasSubstr("closes connections from users other than its own and root"));
  EXPECT_EQ(Dpctl("cordons", {}).out, "no device is cordoned\n");
}

}  // namespace
}  // namespace dpproxy
