#include "proxy/util/child_process.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace dpproxy {
namespace {

std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& set,
    const std::vector<std::string>& unset) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(set.begin(), set.end(),
                                      [&](const auto& kv) { return kv.first == name; });
    const bool dropped = std::find(unset.begin(), unset.end(), name) != unset.end();
    if (!replaced && !dropped) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : set) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The state letter of /proc/<path>/stat and, for a process, its group: nullopt
// if it cannot be read (a process may end while it is read).
std::optional<std::pair<char, long>> ReadStat(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return std::nullopt;
  const std::string stat(buf, static_cast<size_t>(n));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  // After the command: state, ppid, pgrp.
  std::istringstream fields(stat.substr(close + 2));
  char state = 0;
  long ppid = 0, pgrp = 0;
  fields >> state >> ppid >> pgrp;
  return std::make_pair(state, pgrp);
}

// The processes of group `pgid` that still run (zombies do not: an init
// that reaps late must not hold a stop up); nullopt without /proc.
std::optional<std::vector<std::string>> GroupMembers(pid_t pgid) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::vector<std::string> members;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::optional<std::pair<char, long>> st = ReadStat(absl::StrCat("/proc/", e->d_name, "/stat"));
    if (st && st->second == pgid && st->first != 'Z' && st->first != 'X') {
      members.emplace_back(e->d_name);
    }
  }
  ::closedir(proc);
  return members;
}

bool GroupRuns(pid_t pgid) {
  std::optional<std::vector<std::string>> members = GroupMembers(pgid);
  if (!members.has_value()) return ::kill(-pgid, 0) == 0;
  return !members->empty();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("no program to start (empty argv)");
  std::vector<std::string> args = spec.argv;
  std::vector<std::string> env = ChildEnvironment(spec.env, spec.unset_env);
  std::vector<char*> argv = CStrings(args);
  std::vector<char*> envp = CStrings(env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (!spec.output_path.empty()) {
    // Opened here first, so a bad path is an error of ours with its name.
    int fd = ::open(spec.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      posix_spawn_file_actions_destroy(&actions);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open ", spec.output_path, ": ", strerror(errno)));
    }
    ::close(fd);
    posix_spawn_file_actions_addopen(&actions, 1, spec.output_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  // Nothing else of ours (gRPC sockets, journal files) lives on in the child.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (spec.own_process_group) {
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
  }
  // The child starts with no signal blocked and default dispositions, even
  // when this process blocks SIGTERM for a signal-waiting thread.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start ", spec.argv[0], ": ", strerror(rc)));
  }
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, pidfd, spec.own_process_group));
}

ChildProcess::~ChildProcess() {
  if (detached_) {
    if (pidfd_ >= 0) ::close(pidfd_);
    return;
  }
  if (!status_.has_value()) {
    KillGroup(SIGKILL);
    Wait(absl::InfiniteDuration());
  }
  KillGroup(SIGKILL);  // whatever the child left in its group
  if (pidfd_ >= 0) ::close(pidfd_);
}

void ChildProcess::KillGroup(int sig) {
  if (group_) {
    ::kill(-pid_, sig);  // ESRCH once the group is empty: nothing to do
  } else if (!status_.has_value()) {
    ::kill(pid_, sig);
  }
}

void ChildProcess::Signal(int sig) { KillGroup(sig); }

std::optional<int> ChildProcess::Wait(absl::Duration timeout) {
  if (status_.has_value()) return status_;
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      status_ = status;
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      status_ = 0;  // reaped by someone else: nothing more to learn
      return status_;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    if (pidfd_ >= 0) {
      // Readable once the child has ended.
      pollfd p{pidfd_, POLLIN, 0};
      const int ms = left == absl::InfiniteDuration()
                         ? -1
                         : static_cast<int>(std::min<int64_t>(
                               absl::ToInt64Milliseconds(left) + 1, 1 << 30));
      ::poll(&p, 1, ms);
    } else {
      absl::SleepFor(std::min(left, absl::Milliseconds(5)));
    }
  }
}

bool ChildProcess::Running() { return !Wait(absl::ZeroDuration()).has_value(); }

bool ChildProcess::Freeze(absl::Duration timeout) {
  KillGroup(SIGSTOP);
  // kill() returns before the stop has taken effect: one thread of each
  // process is woken to stop the others, and until it has run another
  // thread may still wake (to a request on its socket) and serve it. The
  // group is frozen once every thread of every member is stopped; there is
  // nothing to wait on for that, so it is looked at every millisecond.
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    bool stopped = true;
    std::optional<std::vector<std::string>> members =
        group_ ? GroupMembers(pid_) : std::vector<std::string>{std::to_string(pid_)};
    if (!members.has_value()) return false;
    for (const std::string& pid : *members) {
      DIR* tasks = ::opendir(absl::StrCat("/proc/", pid, "/task").c_str());
      if (tasks == nullptr) continue;  // it ended meanwhile
      while (dirent* t = ::readdir(tasks)) {
        if (t->d_name[0] < '0' || t->d_name[0] > '9') continue;
        std::optional<std::pair<char, long>> st =
            ReadStat(absl::StrCat("/proc/", pid, "/task/", t->d_name, "/stat"));
        if (st && st->first != 'T' && st->first != 't' && st->first != 'Z' && st->first != 'X') {
          stopped = false;
        }
      }
      ::closedir(tasks);
    }
    if (stopped) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

std::optional<int64_t> ChildProcess::UnreadSocketBytes() const {
  std::optional<std::vector<std::string>> members =
      group_ ? GroupMembers(pid_) : std::vector<std::string>{std::to_string(pid_)};
  if (!members.has_value()) return std::nullopt;
  int64_t total = 0;
  for (const std::string& pid : *members) {
    int id = 0;
    if (!absl::SimpleAtoi(pid, &id)) continue;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, id, 0));
    if (pidfd < 0) continue;  // it ended meanwhile
    DIR* fds = ::opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
    if (fds == nullptr) {
      ::close(pidfd);
      continue;
    }
    bool refused = false;
    while (dirent* e = ::readdir(fds)) {
      int fd = 0;
      if (!absl::SimpleAtoi(e->d_name, &fd)) continue;
      char link[64] = {};
      const ssize_t n = ::readlink(absl::StrCat("/proc/", pid, "/fd/", fd).c_str(), link,
                                   sizeof(link) - 1);
      if (n <= 0 || std::string(link, static_cast<size_t>(n)).rfind("socket:", 0) != 0) continue;
      const int copy = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
      if (copy < 0) {
        refused = errno == ENOSYS || errno == EPERM;
        if (refused) break;
        continue;
      }
      int unread = 0;
      if (::ioctl(copy, FIONREAD, &unread) == 0 && unread > 0) total += unread;
      ::close(copy);
    }
    ::closedir(fds);
    ::close(pidfd);
    if (refused) return std::nullopt;
  }
  return total;
}

int ChildProcess::Kill() {
  KillGroup(SIGKILL);
  return *Wait(absl::InfiniteDuration());
}

int ChildProcess::Stop(absl::Duration grace) {
  const absl::Time deadline = absl::Now() + grace;
  if (!status_.has_value()) {
    KillGroup(SIGTERM);
    if (!Wait(grace).has_value()) {
      KillGroup(SIGKILL);
      Wait(absl::InfiniteDuration());
    }
  }
  // The grace is the whole group's, as a container runtime gives it: a
  // shell that leads the group ends at once, while what it started shuts
  // down. A group has no handle to wait on, so it is looked at every 10 ms
  // until it is empty or the grace is over.
  while (group_ && absl::Now() < deadline && GroupRuns(pid_)) {
    absl::SleepFor(std::min(absl::Milliseconds(10), deadline - absl::Now()));
  }
  KillGroup(SIGKILL);
  return *status_;
}

std::string ChildProcess::DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

}  // namespace dpproxy
