// dpproxy as a systemd Type=notify service, against a notify socket of the
// test's own (a real Unix datagram socket, as systemd's): READY=1 once the
// readiness checks pass or the wait is over, WATCHDOG=1 at half the
// interval systemd asked for, STATUS= when it changes, STOPPING=1; and the
// dpproxy binary sends them from its housekeeping thread.
#include "proxy/ops/systemd_notifier.h"

#include <signal.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proxy/util/child_process.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using testing::NotifySocket;

std::vector<HealthCheck> Ready(bool registered) {
  return {{"registered:vendor.com/gpu", registered,
           registered ? "" : "registering with the kubelet"},
          {"state-writable", true, ""}};
}

class SystemdNotifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("NOTIFY_SOCKET", sock_.path().c_str(), 1);
    ::setenv("WATCHDOG_USEC", "200000", 1);
    ::unsetenv("WATCHDOG_PID");
  }
  void TearDown() override {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
  }
  testing::ShortTempDir dir_;
  NotifySocket sock_{dir_.Sub("notify.sock")};
};

TEST_F(SystemdNotifierTest, ReadyOnceRegisteredWithStatusAndKeepAlives) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);  // passes at given times
  SystemdNotifier n(absl::Minutes(5), t0);
  ASSERT_TRUE(n.enabled());
  EXPECT_EQ(n.watchdog(), absl::Milliseconds(200));
  n.OnPass(Ready(false), t0);
  std::optional<std::string> m = sock_.Next(absl::Seconds(10));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::StrContains(*m, "WATCHDOG=1")) << *m;
  EXPECT_FALSE(absl::StrContains(*m, "READY=1")) << *m;
  EXPECT_TRUE(absl::StrContains(*m, "STATUS=1 resource, 0 registered with the kubelet; "
                                    "registered:vendor.com/gpu: registering with the kubelet"))
      << *m;
  n.OnPass(Ready(true), t0 + absl::Milliseconds(50));
  m = sock_.Next(absl::Seconds(10));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::StrContains(*m, "READY=1")) << *m;
  EXPECT_TRUE(absl::StrContains(*m, "STATUS=1 resource, 1 registered with the kubelet")) << *m;
  // Nothing new to say and the keep-alive not due: nothing is sent (the
  // next datagram is the keep-alive below).
  n.OnPass(Ready(true), t0 + absl::Milliseconds(99));
  // Half the interval after the last one, a keep-alive alone.
  n.OnPass(Ready(true), t0 + absl::Milliseconds(100));
  m = sock_.Next(absl::Seconds(10));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(*m, "WATCHDOG=1\n");
  n.Stopping();
  EXPECT_TRUE(sock_.WaitFor("STOPPING=1", absl::Seconds(10)));
}

TEST_F(SystemdNotifierTest, ReadyAfterTheWaitEvenIfNotRegistered) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  SystemdNotifier n(absl::Seconds(30), t0);
  n.OnPass(Ready(false), t0 + absl::Seconds(29));
  std::optional<std::string> early = sock_.Next(absl::Seconds(10));
  ASSERT_TRUE(early.has_value());
  EXPECT_FALSE(absl::StrContains(*early, "READY=1")) << *early;
  n.OnPass(Ready(false), t0 + absl::Seconds(30));
  std::optional<std::string> m = sock_.Next(absl::Seconds(10));
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(absl::StrContains(*m, "READY=1")) << *m;
}

TEST(SystemdNotifierOffTest, WithoutSystemdNothingIsSent) {
  ::unsetenv("NOTIFY_SOCKET");
  SystemdNotifier n(absl::ZeroDuration());
  EXPECT_FALSE(n.enabled());
  n.OnPass(Ready(true));  // no socket, no crash
  n.Stopping();
}

// The binary: READY=1 (no resources yet: nothing to wait for), keep-alives
// from its housekeeping thread at half of WATCHDOG_USEC, STOPPING=1 on
// SIGTERM.
TEST(SystemdNotifierBinaryTest, DpproxyNotifiesAndKeepsTheWatchdogFed) {
  testing::ShortTempDir dir;
  NotifySocket sock(dir.Sub("notify.sock"));
  ChildSpec spec;
  spec.argv = {testing::Runfile("proxy/dpproxy"), "--kubelet_root=" + dir.Sub("k"),
               "--plugin_dir=" + dir.Sub("p"), "--state_dir=" + dir.Sub("s"),
               "--status_file=", "--metrics_address=", "--minloglevel=1"};
  spec.env = {{"NOTIFY_SOCKET", sock.path()}, {"WATCHDOG_USEC", "2000000"}};
  auto child = ChildProcess::Start(spec);
  ASSERT_TRUE(child.ok()) << child.status();
  std::vector<std::string> seen;
  EXPECT_TRUE(sock.WaitFor("READY=1", absl::Seconds(30), &seen));
  EXPECT_TRUE(absl::StrContains(seen.back(), "STATUS=no resources yet")) << seen.back();
  int keepalives = 0;
  for (const std::string& m : seen) keepalives += absl::StrContains(m, "WATCHDOG=1") ? 1 : 0;
  while (keepalives < 3 && sock.WaitFor("WATCHDOG=1", absl::Seconds(10))) ++keepalives;
  EXPECT_GE(keepalives, 3);
  (*child)->Signal(SIGTERM);
  EXPECT_TRUE(sock.WaitFor("STOPPING=1", absl::Seconds(30)));
  ASSERT_TRUE((*child)->Wait(absl::Seconds(30)).has_value());
}

}  // namespace
}  // namespace dpproxy
