// dpconform given plugin commands that misbehave before any device-plugin
// call: one that does not exist, one that exits at once, one that floods
// its output, one that never registers, one that deletes dpconform's run
// directory. Each gets a verdict naming the
// cause, and the run ends (a deadline, never a hang), with no process of
// the plugin left behind.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proxy/util/files.h"
#include "proxy/util/child_process.h"
#include "tests/conform/conform_testing.h"
#include "tests/testing/file_wait.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {
namespace {

using ::testing::HasSubstr;

// The registers cell of `command` on 1.37, the other scenarios blocked by it.
CellResult Registers(const std::string& command, absl::Duration timeout = absl::Seconds(18)) {
  ConformOptions o;
  o.work_root = testing::ConformWorkRoot();
  o.resources = {"example.com/gpu"};
  o.plugin_command = command;
  o.kubelets = {*sim::ParseKubeletVersion("1.37")};
  o.scenarios = {"registers", "device-list"};
  o.dial_timeout = absl::Seconds(1);
  o.timeout = timeout;
  o.stop_grace = absl::Seconds(2);
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  EXPECT_TRUE(cells.ok()) << cells.status();
  if (!cells.ok() || cells->size() != 2) return {};
  EXPECT_EQ((*cells)[1].outcome, Outcome::kBlocked) << testing::DescribeCell((*cells)[1]);
  EXPECT_EQ((*cells)[1].blocked_by, "registers");
  return (*cells)[0];
}


// The pid of a process whose command line contains `marker` (not this
// test, not `except`), 0 if none.
int ProcessWith(const std::string& marker, int except) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || pid == except ||
        pid == ::getpid()) {
      continue;
    }
    absl::StatusOr<std::string> cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (!cmdline.ok()) continue;  // gone meanwhile
    std::replace(cmdline->begin(), cmdline->end(), '\0', ' ');
    if (cmdline->find(marker) != std::string::npos) return pid;
  }
  return 0;
}

TEST(BadInputTest, ACommandThatDoesNotExistIsNamed) {
  const CellResult c = Registers("/nonexistent/vendor-plugin --socket={kubelet_socket}");
  EXPECT_EQ(c.outcome, Outcome::kFail) << testing::DescribeCell(c);
  EXPECT_THAT(c.plugin_did, HasSubstr("the plugin exited with status 127"));
  EXPECT_THAT(c.plugin_did, HasSubstr("/nonexistent/vendor-plugin"));
  EXPECT_THAT(c.plugin_did, HasSubstr("not found"));
}

TEST(BadInputTest, APluginThatExitsAtOnceIsNamedWithItsLastWords) {
  const CellResult c = Registers("echo 'vendor-plugin: no GPU found'; exit 3");
  EXPECT_EQ(c.outcome, Outcome::kFail) << testing::DescribeCell(c);
  EXPECT_EQ(c.summary, "the plugin exited without registering");
  EXPECT_THAT(c.plugin_did, HasSubstr("the plugin exited with status 3"));
  EXPECT_THAT(c.plugin_did, HasSubstr("vendor-plugin: no GPU found"));
}

// A plugin that writes without end is stopped at dpconform's limit: the
// cell names it, and its log is no larger than the limit.
TEST(BadInputTest, APluginThatFloodsItsOutputIsStoppedAtTheLimit) {
  const CellResult c = Registers("exec yes 'vendor-plugin: retrying'", absl::Seconds(60));
  EXPECT_EQ(c.outcome, Outcome::kFail) << testing::DescribeCell(c);
  EXPECT_THAT(c.plugin_did, HasSubstr(absl::StrCat("killed by signal ", SIGXFSZ)));
  EXPECT_THAT(c.plugin_did, HasSubstr("it wrote 64 MiB, dpconform's limit for its output"));
  EXPECT_THAT(c.plugin_did, HasSubstr("vendor-plugin: retrying"));
  ASSERT_FALSE(c.dir.empty());
  struct stat st;
  ASSERT_EQ(::stat(JoinPath(c.dir, "plugin.log").c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_size), kMaxPluginOutputBytes);
  EXPECT_GT(static_cast<uint64_t>(st.st_size), kMaxPluginOutputBytes / 2);
}

// A plugin that deletes dpconform's run directory and leaves a file in its
// place: the cells after it cannot get a directory. Each says so, and a
// cell waiting on its release's registers cell, which never ran, is let
// go (one worker: the gate cells come first, and 1.36's cannot start).
TEST(BadInputTest, APluginThatDeletesTheRunDirectoryEndsTheRunNamingIt) {
  ConformOptions o;
  o.work_root = testing::ConformWorkRoot();
  o.resources = {"example.com/gpu"};
  o.plugin_command =
      "run=\"$(dirname \"$(dirname \"$DPCONFORM_WORK_DIR\")\")\"; rm -rf \"$run\"; : > \"$run\"";
  o.kubelets = {*sim::ParseKubeletVersion("1.37"), *sim::ParseKubeletVersion("1.36")};
  o.scenarios = {"registers", "device-list"};
  o.dial_timeout = absl::Seconds(1);
  o.timeout = absl::Seconds(5);
  o.jobs = 1;
  absl::StatusOr<std::vector<CellResult>> cells = RunConformance(o);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 4u);
  int unmade = 0;
  for (const CellResult& c : *cells) {
    EXPECT_NE(c.outcome, Outcome::kPass) << testing::DescribeCell(c);
    if (c.kubelet == "1.36") {
      EXPECT_EQ(c.outcome, Outcome::kFail) << testing::DescribeCell(c);
      EXPECT_THAT(c.summary, HasSubstr("dpconform could not make the cell's directory: "))
          << testing::DescribeCell(c);
      EXPECT_EQ(c.generation, "1.31-1.36") << testing::DescribeCell(c);
      ++unmade;
    }
  }
  EXPECT_EQ(unmade, 2);
}

// A plugin that runs and never registers: the cell waits its deadline and
// says what it waited for; the plugin is stopped with the run.
TEST(BadInputTest, APluginThatNeverRegistersEndsAtTheDeadline) {
  const std::string marker = absl::StrCat("61", ::getpid() % 1000, ".25");
  const CellResult c = Registers(absl::StrCat("exec sleep ", marker), absl::Seconds(3));
  EXPECT_EQ(c.outcome, Outcome::kFail) << testing::DescribeCell(c);
  EXPECT_THAT(c.summary, HasSubstr("no registration this kubelet understands within 3s"));
  EXPECT_THAT(c.plugin_did, HasSubstr("did not register"));
  EXPECT_EQ(ProcessWith(absl::StrCat("sleep ", marker), 0), 0)
      << "the plugin outlived its cell";
}

// dpconform interrupted (Ctrl-C, a cancelled CI job) while cells run: the
// plugins, each in a process group of its own that the signal does not
// reach, are stopped with it.
TEST(BadInputTest, AnInterruptedRunLeavesNoPluginBehind) {
  testing::ShortTempDir dir;
  const std::string marker = absl::StrCat("62", ::getpid() % 1000, ".5");
  const std::string started = dir.Sub("started");
  ChildSpec spec;
  spec.argv = {testing::Runfile("tools/conform/dpconform"),
               absl::StrCat("--plugin=echo up > ", started, "; exec sleep ", marker),
               "--resource=example.com/gpu", "--kubelets=1.37", "--scenarios=registers",
               "--timeout=60s", "--dial_timeout=1s", "--quiet", "--work_dir=" + dir.path()};
  spec.output_path = dir.Sub("out");
  absl::StatusOr<std::unique_ptr<ChildProcess>> run = ChildProcess::Start(spec);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE(testing::WaitForFile(
      started, [](const std::string& text) { return text == "up\n"; }, absl::Seconds(30)));
  // The plugin's shell (its command line names the marker), which becomes
  // sleep in place once it execs it.
  const int plugin = ProcessWith(absl::StrCat("sleep ", marker), (*run)->pid());
  ASSERT_NE(plugin, 0) << "the plugin is not running";
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, plugin, 0));
  ASSERT_GE(pidfd, 0);

  ::kill((*run)->pid(), SIGINT);  // dpconform alone, as a terminal's Ctrl-C reaches it
  const std::optional<int> status = (*run)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value()) << "dpconform did not end on SIGINT";
  EXPECT_EQ(ChildProcess::DescribeExit(*status), "exited with status 130");
  EXPECT_THAT(*ReadFile(dir.Sub("out")), HasSubstr("stopped 1 plugin process group(s)"));
  pollfd p{pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 30000), 1) << "the plugin outlived dpconform";
  ::close(pidfd);
}

}  // namespace
}  // namespace dpproxy::conform
