#include "proxy/ops/systemd_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace dpproxy {

namespace {

absl::Duration WatchdogInterval() {
  uint64_t usec = 0;
  // > 0: systemd expects keep-alives from this process.
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0) return absl::Microseconds(usec);
  return absl::ZeroDuration();
}

}  // namespace

std::string SystemdStatusLine(const std::vector<HealthCheck>& ready) {
  int resources = 0, registered = 0;
  std::string problems;
  for (const HealthCheck& c : ready) {
    if (c.name.rfind("registered:", 0) == 0) {
      ++resources;
      if (c.ok) ++registered;
    }
    if (!c.ok && problems.empty()) problems = absl::StrCat("; ", c.name, ": ", c.reason);
  }
  if (resources == 0) return absl::StrCat("no resources yet", problems);
  return absl::StrCat(resources, resources == 1 ? " resource, " : " resources, ", registered,
                      " registered with the kubelet", problems);
}

SystemdNotifier::SystemdNotifier(absl::Duration ready_wait, absl::Time start)
    : enabled_(std::getenv("NOTIFY_SOCKET") != nullptr),
      watchdog_(WatchdogInterval()),
      deadline_(start + ready_wait) {}

void SystemdNotifier::Send(const std::string& state) {
  const int r = sd_notify(/*unset_environment=*/0, state.c_str());
  if (r < 0) {
    LOG_EVERY_N(WARNING, 100) << "sd_notify failed: " << r;
  }
}

void SystemdNotifier::OnPass(const std::vector<HealthCheck>& ready, absl::Time now) {
  if (!enabled_) return;
  bool all_ok = true;
  for (const HealthCheck& c : ready) all_ok = all_ok && c.ok;
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    if (watchdog_ > absl::ZeroDuration() && now - last_keepalive_ >= watchdog_ / 2) {
      message += "WATCHDOG=1\n";
      last_keepalive_ = now;
    }
    if (!ready_sent_ && (all_ok || now >= deadline_)) {
      message += "READY=1\n";
      ready_sent_ = true;
      if (!all_ok) {
        LOG(WARNING) << "telling systemd dpproxy is ready although not every resource is "
                        "registered with the kubelet yet: " << SystemdStatusLine(ready);
      }
    }
    std::string status = SystemdStatusLine(ready);
    if (status != last_status_) {
      message += absl::StrCat("STATUS=", status, "\n");
      last_status_ = std::move(status);
    }
  }
  if (!message.empty()) Send(message);
}

void SystemdNotifier::Stopping() {
  if (enabled_) Send("STOPPING=1\nSTATUS=shutting down\n");
}

}  // namespace dpproxy
