#include "proxy/util/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ChildProcess> Shell(const std::string& script, const std::string& output = "",
                                    std::vector<std::pair<std::string, std::string>> env = {}) {
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", script};
  spec.output_path = output;
  spec.env = std::move(env);
  absl::StatusOr<std::unique_ptr<ChildProcess>> c = ChildProcess::Start(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Reads one line a child writes into the FIFO at `path`, within 10 s.
std::string ReadFifoLine(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd < 0) return "";
  std::string line;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (line.find('\n') == std::string::npos && absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);
    char buf[64];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) line.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return std::string(absl::StripTrailingAsciiWhitespace(line));
}

// `pid` (not our child) ends within 10 s. SIGKILL is sent, not finished:
// the process may still be on its way out when the call returns, so its
// exit is waited for through a pidfd (gone already: ESRCH).
void ExpectEnds(int pid) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    EXPECT_EQ(errno, ESRCH) << "pidfd_open: " << std::strerror(errno);
    return;
  }
  struct pollfd p = {pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 10000), 1) << "process " << pid << " still runs";
  ::close(pidfd);
}

TEST(ChildProcessTest, OutputEnvironmentAndExitStatus) {
  testing::ShortTempDir dir;
  auto c = Shell("echo out-$DPP_TEST_VALUE; echo err >&2; exit 3", dir.Sub("log"),
                 {{"DPP_TEST_VALUE", "42"}});
  ASSERT_NE(c, nullptr);
  std::optional<int> status = c->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(ChildProcess::DescribeExit(*status), "exited with status 3");
  EXPECT_FALSE(c->Running());
  absl::StatusOr<std::string> log = ReadFile(dir.Sub("log"));
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(*log, "out-42\nerr\n");
}

TEST(ChildProcessTest, WaitReturnsNothingWhileTheChildRuns) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  auto c = Shell("echo up > " + dir.Sub("f") + "; exec sleep 1000");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(ReadFifoLine(dir.Sub("f")), "up");
  EXPECT_FALSE(c->Wait(absl::Milliseconds(50)).has_value());
  EXPECT_TRUE(c->Running());
  int status = c->Stop(absl::Seconds(10));
  EXPECT_EQ(ChildProcess::DescribeExit(status), "killed by signal 15 (Terminated)");
}

// Stop reaches what the child started (a shell's background job), and a
// child that ignores SIGTERM is killed after the grace period.
TEST(ChildProcessTest, StopEndsTheWholeGroupAndEscalates) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  auto c = Shell("trap '' TERM; sleep 1000 & echo $! > " + dir.Sub("f") + "; wait");
  ASSERT_NE(c, nullptr);
  int background = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ReadFifoLine(dir.Sub("f")), &background));
  ASSERT_EQ(::kill(background, 0), 0);
  int status = c->Stop(absl::Milliseconds(200));
  EXPECT_EQ(ChildProcess::DescribeExit(status), "killed by signal 9 (Killed)");
  // The background sleep was in the group: it ends.
  ExpectEnds(background);
}

char ProcessState(int pid) {
  absl::StatusOr<std::string> stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return '?';
  const size_t close = stat->rfind(')');
  return close + 2 < stat->size() ? (*stat)[close + 2] : '?';
}

// Freeze returns once the whole group has stopped, a process busy on a CPU
// included (kill() returns before the stop has taken effect); SIGCONT lets
// it run on.
TEST(ChildProcessTest, FreezeStopsTheWholeGroupBeforeItReturns) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  auto c = Shell("while :; do :; done & echo $! > " + dir.Sub("f") + "; wait");
  ASSERT_NE(c, nullptr);
  int busy = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ReadFifoLine(dir.Sub("f")), &busy));
  ASSERT_TRUE(c->Freeze(absl::Seconds(30)));
  EXPECT_EQ(ProcessState(busy), 'T');
  EXPECT_EQ(ProcessState(c->pid()), 'T');
  c->Signal(SIGCONT);
  // The shell (our child) is reported continued; the wait is the kernel's.
  siginfo_t info = {};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(c->pid()), &info, WCONTINUED | WNOWAIT), 0)
      << std::strerror(errno);
  EXPECT_EQ(info.si_code, CLD_CONTINUED);
  EXPECT_EQ(c->Stop(absl::Seconds(10)), SIGTERM);
}

// Kill ends the whole group at once, a frozen one and one that ignores
// SIGTERM included.
TEST(ChildProcessTest, KillEndsTheGroupWithNoGrace) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  auto c = Shell("trap '' TERM; sleep 1000 & echo $! > " + dir.Sub("f") + "; wait");
  ASSERT_NE(c, nullptr);
  int background = 0;
  ASSERT_TRUE(absl::SimpleAtoi(ReadFifoLine(dir.Sub("f")), &background));
  ASSERT_TRUE(c->Freeze(absl::Seconds(30)));
  EXPECT_EQ(ChildProcess::DescribeExit(c->Kill()), "killed by signal 9 (Killed)");
  ExpectEnds(background);  // it was in the group
}

// What waits unread in the group's sockets is counted, in a process the
// child started (python3 sends 10 bytes over a socket pair to itself).
TEST(ChildProcessTest, UnreadSocketBytesCountsTheGroupsWaitingBytes) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  auto c = Shell("python3 -c 'import socket, time; a, b = socket.socketpair(); "
                 "a.send(b\"0123456789\"); open(\"" + dir.Sub("f") + "\", \"w\").write(\"up\\n\"); "
                 "time.sleep(1000)'");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(ReadFifoLine(dir.Sub("f")), "up");
  std::optional<int64_t> unread = c->UnreadSocketBytes();
  ASSERT_TRUE(unread.has_value()) << "pidfd_getfd refused (Linux before 5.6?)";
  EXPECT_EQ(*unread, 10);
  c->Stop(absl::Seconds(10));
}

// The grace is the whole group's: a shell leader ends at once on SIGTERM,
// and what it started still gets the time to shut down cleanly (a plugin
// removing its socket) before anything is killed.
TEST(ChildProcessTest, StopGivesTheWholeGroupItsGrace) {
  testing::ShortTempDir dir;
  ASSERT_EQ(::mkfifo(dir.Sub("f").c_str(), 0600), 0);
  const std::string done = dir.Sub("done");
  auto c = Shell("(trap 'sleep 0.3; echo clean > " + done +
                 "; exit 0' TERM; echo up > " + dir.Sub("f") +
                 "; while :; do sleep 0.05; done) & wait");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(ReadFifoLine(dir.Sub("f")), "up");
  c->Stop(absl::Seconds(10));
  absl::StatusOr<std::string> d = ReadFile(done);
  ASSERT_TRUE(d.ok()) << "the background job was killed during its shutdown";
  EXPECT_EQ(*d, "clean\n");
}

TEST(ChildProcessTest, StartErrorsNameWhatFailed) {
  ChildSpec spec;
  EXPECT_THAT(std::string(ChildProcess::Start(spec).status().message()), HasSubstr("empty argv"));
  spec.argv = {"/nonexistent/program"};
  absl::StatusOr<std::unique_ptr<ChildProcess>> c = ChildProcess::Start(spec);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("/nonexistent/program"));
  spec.argv = {"/bin/true"};
  spec.output_path = "/nonexistent/dir/log";
  c = ChildProcess::Start(spec);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("cannot open /nonexistent/dir/log"));
}

}  // namespace
}  // namespace dpproxy
