// File: child_process.h
//
// A child process in its own process group: started with posix_spawn, only
// stdin (/dev/null), stdout and stderr open in it, its output appended to a
// file, and stopped as a supervisor stops one (SIGTERM to the whole group,
// a grace period, then SIGKILL). Waiting is on a pidfd, so a caller blocks
// until the child ends or the deadline passes, never polls.
//
//   ChildSpec spec;
//   spec.argv = {"/bin/sh", "-c", "my-plugin --socket-dir=/tmp/x"};
//   spec.output_path = "/tmp/x/plugin.log";
//   absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
//   ...
//   int status = (*child)->Stop(absl::Seconds(5));
#ifndef DPPROXY_PROXY_UTIL_CHILD_PROCESS_H_
#define DPPROXY_PROXY_UTIL_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dpproxy {

struct ChildSpec {
  // argv[0] is a path (no PATH search: say /bin/sh -c for a command line).
  std::vector<std::string> argv;
  // Variables set (or replaced) in the child's copy of this environment.
  std::vector<std::pair<std::string, std::string>> env;
  // Variables left out of the child's copy.
  std::vector<std::string> unset_env;
  // stdout and stderr are appended here (created 0644); empty: inherited.
  std::string output_path;
  // The child leads a new process group, so Signal() and Stop() reach
  // everything it starts (a shell's children too).
  bool own_process_group = true;
};

class ChildProcess {
 public:
  // Errors: empty argv, an output file that cannot be opened, a program
  // that cannot be started (its path in the message).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ChildSpec& spec);
  // Kills the group with SIGKILL and reaps the child if it still runs.
  ~ChildProcess();

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Sends `sig` to the process group (or the child alone without one).
  // Nothing once the child has been reaped and its group is empty.
  void Signal(int sig);
  // SIGSTOP to the group, then waits up to `timeout` until every thread of
  // every process in it has stopped (kill() returns before they have);
  // false if some still ran at the deadline. SIGCONT resumes them.
  bool Freeze(absl::Duration timeout);
  // Bytes waiting unread in the sockets of the group's processes: a request
  // has reached a frozen child when they grow. nullopt where another
  // process's sockets cannot be looked into (pidfd_getfd: Linux 5.6 and
  // ptrace rights over the child).
  std::optional<int64_t> UnreadSocketBytes() const;
  // Waits up to `timeout` for the child to end; its wait status if it did.
  std::optional<int> Wait(absl::Duration timeout);
  // True until the child has ended (it is reaped when seen ended).
  bool Running();
  // SIGKILL to the group, no grace (as the OOM killer or a crash ends a
  // process: nothing cleaned up); the child's wait status.
  int Kill();
  // SIGTERM to the group, up to `grace` for the whole group to end (not
  // only the child: a shell that leads it ends at once), then SIGKILL to
  // whatever is left; the child's wait status. Nothing it started
  // outlives it.
  int Stop(absl::Duration grace);

  // Leaves the child to run on: the destructor neither kills nor waits for
  // it (it outlives this process, and whoever inherits it reaps it).
  void Detach() { detached_ = true; }

  // "exited with status 3", "killed by signal 9 (Killed)".
  static std::string DescribeExit(int wait_status);

 private:
  ChildProcess(pid_t pid, int pidfd, bool group) : pid_(pid), pidfd_(pidfd), group_(group) {}
  void KillGroup(int sig);

  const pid_t pid_;
  int pidfd_;  // -1 where pidfd_open is missing (then Wait polls waitpid)
  const bool group_;
  std::optional<int> status_;
  bool detached_ = false;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_CHILD_PROCESS_H_
