// File: systemd_notifier.h
//
// dpproxy as a systemd Type=notify service (libsystemd's sd_notify):
//
//   READY=1     once every resource is registered with the kubelet (the
//               /readyz checks pass), or after `ready_wait` whatever they
//               say, so that a node without a kubelet does not hold boot
//   WATCHDOG=1  from the housekeeping thread, the one that would hang,
//               at half the unit's WatchdogSec
//   STATUS=...  what dpproxy is doing ("4 resources, 4 registered"), when
//               it changes
//   STOPPING=1  at shutdown
//
// Without systemd (no NOTIFY_SOCKET) every call does nothing.
//
//   SystemdNotifier notify(absl::Seconds(30));
//   server.SetHousekeepingHook([&] { notify.OnPass(server.Readiness()); });
#ifndef DPPROXY_PROXY_OPS_SYSTEMD_NOTIFIER_H_
#define DPPROXY_PROXY_OPS_SYSTEMD_NOTIFIER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/util/health_check.h"

namespace dpproxy {

// The STATUS= text for a set of readiness checks.
std::string SystemdStatusLine(const std::vector<HealthCheck>& ready);

class SystemdNotifier {
 public:
  // READY=1 is sent `ready_wait` after `start` at the latest.
  explicit SystemdNotifier(absl::Duration ready_wait, absl::Time start = absl::Now());

  // Whether systemd listens (NOTIFY_SOCKET is set).
  bool enabled() const { return enabled_; }
  // The watchdog interval systemd asked for (WATCHDOG_USEC), or zero.
  absl::Duration watchdog() const { return watchdog_; }

  // One housekeeping pass ended at `now`, with the readiness checks then.
  void OnPass(const std::vector<HealthCheck>& ready, absl::Time now = absl::Now());
  // dpproxy is shutting down.
  void Stopping();

 private:
  void Send(const std::string& state);

  const bool enabled_;
  const absl::Duration watchdog_;
  const absl::Time deadline_;  // READY=1 by then at the latest
  absl::Mutex mu_;
  bool ready_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_status_ ABSL_GUARDED_BY(mu_);
  absl::Time last_keepalive_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_SYSTEMD_NOTIFIER_H_
