// File: in_place_upgrade.h
//
// An upgrade without a gap under a supervisor that tracks one main process
// (systemd): on SIGUSR2 the running dpproxy starts the binary at the path
// it was started from (by then the new build) with its own arguments and
// --takeover, as its child, so inside the same service. The child takes
// the state over (proxy/handoff) and, before it tells the old one to
// finish, tells systemd that it is the service's main process now
// (MAINPID=, READY=1; the unit needs NotifyAccess=all). The old one then
// exits 0, and systemd goes on supervising the new one: no restart, no
// second unit.
//
//   InPlaceUpgrade upgrade(argv_as_started);
//   ... on SIGUSR2:
//   if (absl::Status s = upgrade.Start(); !s.ok()) LOG(ERROR) << s;
#ifndef DPPROXY_PROXY_OPS_IN_PLACE_UPGRADE_H_
#define DPPROXY_PROXY_OPS_IN_PLACE_UPGRADE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proxy/util/child_process.h"

namespace dpproxy {

// The arguments a new dpproxy is started with: `argv` as this one was
// started (argv[0] absolute), with --takeover (and any --takeover=...
// given replaced by it).
std::vector<std::string> UpgradeArgv(const std::vector<std::string>& argv);

// argv[0] made absolute against the working directory at start (a later
// chdir must not change which binary an upgrade starts); a bare name is
// looked up in PATH. The path, not what it points to: after a package
// upgrade it names the new build.
std::string AbsoluteProgramPath(const std::string& argv0);

class InPlaceUpgrade {
 public:
  explicit InPlaceUpgrade(std::vector<std::string> argv) : argv_(std::move(argv)) {}
  // Leaves a new dpproxy that is still running to run on.
  ~InPlaceUpgrade();

  // Starts the new dpproxy (UpgradeArgv) unless one started earlier still
  // runs. Its end is logged if it comes before this process exits (it
  // failed, and this one goes on serving).
  absl::Status Start();

 private:
  void Watch(ChildProcess* child);

  const std::vector<std::string> argv_;
  absl::Mutex mu_;
  std::unique_ptr<ChildProcess> child_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> child_running_{false};
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

// systemd's notify socket: this process is the service's main process from
// now on, and ready (a no-op without NOTIFY_SOCKET). Waits (up to 5 s) until
// systemd has read it, so that the old main process exits only after.
void NotifyMainProcess();

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_IN_PLACE_UPGRADE_H_
