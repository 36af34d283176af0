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
#include "tests/testing/process_node.h"
#include "tests/testing/sim_helpers.h"
#include "tools/dpctl/control_commands.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;
using testing::ProcessNode;
using testing::Runfile;
using testing::Spawn;

constexpr absl::Duration kWait = ProcessNode::kWait;
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
    ASSERT_TRUE(sim().Start().ok());
    proxy_ = node_.SpawnProxy({});
    ASSERT_NE(proxy_, nullptr);
    plugin_ = node_.SpawnPlugin(kGpu, {});
    ASSERT_NE(plugin_, nullptr);
    ASSERT_TRUE(sim().WaitForResource(kGpu, 4, kWait));
  }

  sim::KubeletSim& sim() { return node_.sim(); }

  // dpctl's command, run in this process (as root, like the test).
  Outcome Dpctl(const std::string& command, std::vector<std::string> args,
                const std::string& reason = "") {
    std::ostringstream out, err;
    std::streambuf* old_out = std::cout.rdbuf(out.rdbuf());
    std::streambuf* old_err = std::cerr.rdbuf(err.rdbuf());
    Outcome o;
    o.rc = RunControlCommand(command, args, node_.state_dir(), reason, "table");
    std::cout.rdbuf(old_out);
    std::cerr.rdbuf(old_err);
    o.out = out.str();
    o.err = err.str();
    return o;
  }

  // The device a new pod was given.
  std::string AdmitPod(const std::string& name) {
    absl::StatusOr<sim::AllocateResponse> r =
        sim().Allocate(testing::PodRequest(name, {{"main", 1}}, kGpu));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->allocations_size() != 1) return "";
    return r->allocations(0).device_ids(0);
  }
  // Waits for the kubelet to see `device` with `health` after event `from`.
  bool KubeletSees(const std::string& device, const std::string& health, size_t from) {
    return sim()
        .events()
        .WaitFor([&](const Json& e) { return HealthIn(e, device) == health; }, kWait, from)
        .has_value();
  }

  ProcessNode node_;
  const std::string state_ = node_.state_dir();
  std::unique_ptr<ChildProcess> proxy_;
  std::unique_ptr<ChildProcess> plugin_;
};

TEST_F(CordonTest, ACordonHoldsThroughARestartAndATakeoverUntilUncordoned) {
  const std::string held = AdmitPod("holder");
  ASSERT_FALSE(held.empty());
  size_t mark = sim().events().Size();
  Outcome c = Dpctl("cordon", {kGpu, held}, "ECC errors on the card");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_THAT(c.out, HasSubstr("cordoned"));
  EXPECT_TRUE(KubeletSees(held, "Unhealthy", mark));
  // Who asked: this process.
  EXPECT_TRUE(node_.ProxySaid({ProcessNode::Event("device_cordoned"),
                               absl::StrCat("\"by_pid\":", ::getpid()), "\"by_uid\":0",
                               "ECC errors on the card"}));
  // The pod that holds it runs on; a new pod gets another device.
  const sim::State st = sim().GetState();
  ASSERT_EQ(st.pods_size(), 1);
  EXPECT_EQ(st.pods(0).phase(), "Running");
  const std::string other = AdmitPod("newcomer");
  EXPECT_NE(other, held);
  // The status (dpproxy status, metrics) lists it.
  EXPECT_TRUE(testing::WaitForFile(
      node_.status(),
      [&](const std::string& s) { return absl::StrContains(s, "\"cordoned\":[{"); }, kWait));

  // A dpproxy restart: from its first list on, the kubelet sees it Unhealthy.
  testing::Kill(proxy_.get(), SIGTERM);
  mark = sim().events().Size();
  proxy_ = node_.SpawnProxy({});
  ASSERT_NE(proxy_, nullptr);
  ASSERT_TRUE(KubeletSees(held, "Unhealthy", mark));
  ASSERT_TRUE(sim().WaitForResource(kGpu, 2, kWait));  // the plugin is back
  // A takeover by a new dpproxy beside the running one.
  std::unique_ptr<ChildProcess> successor = node_.SpawnProxy({"--takeover"});
  ASSERT_NE(successor, nullptr);
  ASSERT_TRUE(proxy_->Wait(kWait).has_value()) << "the old dpproxy did not hand over";
  proxy_ = std::move(successor);
  ASSERT_TRUE(node_.ProxySaid({ProcessNode::Event("takeover_complete")}));
  for (const Json& e : sim().events().Since(mark)) {
    EXPECT_NE(HealthIn(e, held), "Healthy") << "shown Healthy while cordoned: " << e.dump();
  }
  EXPECT_EQ(testing::KubeletHealth(sim(), kGpu, held), "Unhealthy");
  Outcome list = Dpctl("cordons", {});
  ASSERT_EQ(list.rc, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("ECC errors on the card"));

  mark = sim().events().Size();
  Outcome u = Dpctl("uncordon", {kGpu, held});
  ASSERT_EQ(u.rc, 0) << u.err;
  EXPECT_TRUE(KubeletSees(held, "Healthy", mark));
  EXPECT_TRUE(node_.ProxySaid({ProcessNode::Event("device_uncordoned"),
                               "\"was_reason\":\"ECC errors on the card\""}));
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
  EXPECT_TRUE(sim().WaitForResource(kGpu, 4, absl::ZeroDuration()));
}

// Another user: refused by the socket's mode, and, were the mode opened
// up, by dpproxy itself, which logs who tried.
TEST_F(CordonTest, AnotherUserIsRefused) {
  // dpctl where the other user may run it.
  const std::string bin = node_.Sub("bin");
  ASSERT_TRUE(MakeDirs(bin).ok());
  absl::StatusOr<std::string> dpctl = ReadFile(Runfile("tools/dpctl/dpctl"));
  ASSERT_TRUE(dpctl.ok());
  ASSERT_TRUE(WriteFileAtomic(bin + "/dpctl", *dpctl, 0755).ok());
  for (const std::string& d : {node_.tmp(), bin}) ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
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
  EXPECT_THAT(as_nobody(node_.Sub("denied.txt")), HasSubstr("permission denied on"));

  // The mode opened up: dpproxy closes the connection and logs who.
  ASSERT_EQ(::chmod(state_.c_str(), 0755), 0);
  ASSERT_EQ(::chmod((state_ + "/control.sock").c_str(), 0666), 0);
  EXPECT_THAT(as_nobody(node_.Sub("closed.txt")),
              HasSubstr("closes connections from users other than its own and root"));
  EXPECT_EQ(Dpctl("cordons", {}).out, "no device is cordoned\n");
}

}  // namespace
}  // namespace dpproxy
