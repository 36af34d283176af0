// The upgrade deploy/dpproxy.service documents, its steps scripted against
// a notify socket of the test's own (this machine has no systemd as PID 1;
// the socket is a real Unix datagram socket, as systemd's): dpproxy started
// as the unit starts it, the new build installed at the same path, SIGUSR2
// to the main process. The new dpproxy runs as the old one's child, takes
// over, tells systemd it is the main process (MAINPID=) before the old one
// exits 0 without STOPPING=1, and keeps the watchdog fed from then on; the
// kubelet keeps the devices and the allocation made before.
#include "proxy/ops/in_place_upgrade.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <poll.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/child_process.h"
#include "proxy/util/files.h"
#include "tests/testing/notify_socket.h"
#include "tests/testing/process.h"
#include "tests/testing/sim_helpers.h"
#include "tests/testing/temp_dir.h"
#include "tools/kubelet_sim/kubelet_sim.h"
#include "tools/sample_plugin/sample_plugin.h"

namespace dpproxy {
namespace {

using ::testing::ElementsAre;
using testing::NotifySocket;

TEST(UpgradeArgvTest, TheSameCommandLineWithTakeover) {
  EXPECT_THAT(UpgradeArgv({"/usr/bin/dpproxy", "--config=/etc/d.yaml"}),
              ElementsAre("/usr/bin/dpproxy", "--takeover", "--config=/etc/d.yaml"));
  EXPECT_THAT(UpgradeArgv({"/usr/bin/dpproxy", "--takeover=false", "-v=1", "--takeover"}),
              ElementsAre("/usr/bin/dpproxy", "--takeover", "-v=1"));
}

TEST(AbsoluteProgramPathTest, RelativeToTheDirectoryAtStartOrFromPath) {
  EXPECT_EQ(AbsoluteProgramPath("/usr/bin/dpproxy"), "/usr/bin/dpproxy");
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(AbsoluteProgramPath("bin/dpproxy"), absl::StrCat(cwd, "/bin/dpproxy"));
  testing::ShortTempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.Sub("prog"), "#!/bin/sh\n", 0755).ok());
  const std::string path = std::getenv("PATH") == nullptr ? "" : std::getenv("PATH");
  ::setenv("PATH", ("/nonexistent:" + dir.Sub(".") + ":" + path).c_str(), 1);
  EXPECT_EQ(AbsoluteProgramPath("prog"), dir.Sub("./prog"));
  ::setenv("PATH", path.c_str(), 1);
}

// The pid in "MAINPID=123\n...".
pid_t MainPidIn(const std::string& message) {
  const size_t at = message.find("MAINPID=");
  if (at == std::string::npos) return 0;
  const std::string rest = message.substr(at + 8);
  int pid = 0;
  (void)absl::SimpleAtoi(rest.substr(0, rest.find('\n')), &pid);
  return pid;
}

// The parent of `pid`, from /proc.
pid_t ParentOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  int ppid = 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string state;
  fields >> state >> ppid;
  return ppid;
}

TEST(InPlaceUpgradeTest, TheUnitsUpgradeHandsTheServiceToTheNewBuild) {
  testing::ShortTempDir dir;
  // The kubelet and a plugin with four devices.
  sim::KubeletSimOptions so;
  so.root_dir = dir.Sub("k");
  // 1.24: a takeover leaves the kubelet no gap (docs/upgrade.md lists the
  // releases).
  so.kubelet = *sim::ParseKubeletVersion("1.24");
  sim::KubeletSim kubelet(so);
  ASSERT_TRUE(kubelet.Start().ok());
  // dpproxy installed at a path of its own, as a package installs it.
  ASSERT_TRUE(MakeDirs(dir.Sub("bin")).ok());
  const std::string installed = dir.Sub("bin/dpproxy");
  auto install = [&] {
    // A new file at the path (a package manager renames it into place):
    // the running process keeps the old one.
    absl::StatusOr<std::string> bytes = ReadFile(testing::Runfile("proxy/dpproxy"));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(WriteFileAtomic(installed, *bytes).ok());
    ASSERT_EQ(::chmod(installed.c_str(), 0755), 0);
  };
  ASSERT_NO_FATAL_FAILURE(install());
  NotifySocket systemd(dir.Sub("notify.sock"));
  ChildSpec unit;
  unit.argv = {installed, "--kubelet_root=" + dir.Sub("k"), "--plugin_dir=" + dir.Sub("p"),
               "--state_dir=" + dir.Sub("s"), "--metrics_address=127.0.0.1:0",
               "--minloglevel=1"};
  unit.env = {{"NOTIFY_SOCKET", systemd.path()}, {"WATCHDOG_USEC", "2000000"}};
  unit.output_path = dir.Sub("dpproxy.log");
  auto old = ChildProcess::Start(unit);
  ASSERT_TRUE(old.ok()) << old.status();
  const pid_t old_pid = (*old)->pid();
  sample::SamplePluginOptions po;
  po.resource = "vendor.com/gpu";
  po.devices = 4;
  po.kubelet_socket = dir.Sub("p/kubelet.sock");
  sample::SamplePlugin plugin(po);
  ASSERT_TRUE(plugin.Start().ok());
  ASSERT_TRUE(kubelet.WaitForResource("vendor.com/gpu", 4, absl::Seconds(30)));
  ASSERT_TRUE(systemd.WaitFor("READY=1", absl::Seconds(30)));
  ASSERT_TRUE(
      kubelet.Allocate(testing::PodRequest("before", {{"main", 1}}, "vendor.com/gpu")).ok());

  // The new build goes in; `systemctl kill --signal=SIGUSR2 --kill-whom=main`.
  ASSERT_NO_FATAL_FAILURE(install());
  ASSERT_EQ(::kill(old_pid, SIGUSR2), 0);
  std::vector<std::string> seen;
  ASSERT_TRUE(systemd.WaitFor("MAINPID=", absl::Seconds(60), &seen))
      << ReadFile(dir.Sub("dpproxy.log")).value_or("");
  const pid_t new_pid = MainPidIn(seen.back());
  ASSERT_GT(new_pid, 0) << seen.back();
  EXPECT_NE(new_pid, old_pid);
  EXPECT_TRUE(absl::StrContains(seen.back(), "READY=1")) << seen.back();
  // systemd had the new main process before the old one ended.
  const pid_t parent = ParentOf(new_pid);
  // It waits until systemd has read that (a barrier) before the old one is
  // told to finish.
  std::optional<std::string> barrier = systemd.Next(absl::Seconds(30));
  ASSERT_TRUE(barrier.has_value());
  EXPECT_TRUE(absl::StrContains(*barrier, "BARRIER=1")) << *barrier;
  std::optional<int> old_status = (*old)->Wait(absl::Seconds(60));
  ASSERT_TRUE(old_status.has_value());
  EXPECT_EQ(parent, old_pid) << "the new dpproxy runs in the service, as the old one's child";
  EXPECT_TRUE(WIFEXITED(*old_status) && WEXITSTATUS(*old_status) == 0)
      << ChildProcess::DescribeExit(*old_status) << "\n"
      << ReadFile(dir.Sub("dpproxy.log")).value_or("");
  // The old one's end is not the service's: no STOPPING=1, and the new
  // one's keep-alives go on.
  std::vector<std::string> after;
  EXPECT_TRUE(systemd.WaitFor("WATCHDOG=1", absl::Seconds(30), &after));
  for (const std::string& m : after) {
    EXPECT_FALSE(absl::StrContains(m, "STOPPING=1")) << "a handed-over dpproxy said STOPPING";
  }
  // The service serves on: the kubelet has the devices, the allocation from
  // before holds, and a new pod is admitted.
  ASSERT_TRUE(kubelet.WaitForResource("vendor.com/gpu", 4, absl::Seconds(30)));
  EXPECT_TRUE(
      kubelet.Allocate(testing::PodRequest("after", {{"main", 1}}, "vendor.com/gpu")).ok());
  bool lost = false;
  for (const auto& e : kubelet.events().Since(0)) lost = lost || e.value("event", "") == "plugin_lost";
  EXPECT_FALSE(lost) << "the kubelet lost the resource during the upgrade";

  // systemctl stop: SIGTERM to the main process, now the new one.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, new_pid, 0));
  ASSERT_GE(pidfd, 0);
  ASSERT_EQ(::kill(new_pid, SIGTERM), 0);
  EXPECT_TRUE(systemd.WaitFor("STOPPING=1", absl::Seconds(30)));
  pollfd p = {pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 30000), 1) << "the new dpproxy did not exit on SIGTERM";
  ::close(pidfd);
}

}  // namespace
}  // namespace dpproxy
