// File: backend_watchdog.h
//
// Catches a plugin that holds its ListAndWatch stream open but answers no
// call (a deadlock, a driver call that never returns, a stopped process):
// the kubelet would keep admitting pods to it, and each would fail. The
// watchdog asks the backend something cheap (Backend::ProbeAsync) every
// `interval`, each ask with a deadline of `timeout` (BackendProbe, in
// proxy_config.h, says why the defaults). After `misses` asks in a row went
// unanswered the backend is silent (on_silent); the first answer after
// that ends the silence (on_answering). An ask withdrawn because the
// backend stopped (kCancelled) is no miss.
//
// One watchdog per resource, driven by the resource's Tick (about once a
// second, so intervals are whole seconds in effect). Thread-safe. The
// listener is called with no lock of the watchdog held, on gRPC's callback
// threads.
#ifndef DPPROXY_PROXY_CORE_BACKEND_WATCHDOG_H_
#define DPPROXY_PROXY_CORE_BACKEND_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/backend.h"

namespace dpproxy {

class BackendWatchdog {
 public:
  struct Listener {
    // The backend of `generation` missed `misses` asks in a row; the first
    // of them was sent `silent_for` ago.
    std::function<void(uint64_t generation, absl::Duration silent_for)> on_silent;
    // The backend of `generation`, silent for `silent_for`, answered.
    std::function<void(uint64_t generation, absl::Duration silent_for)> on_answering;
  };

  explicit BackendWatchdog(Listener listener);
  // Waits for an ask in flight (its backend's Stop() cancels it).
  ~BackendWatchdog();
  BackendWatchdog(const BackendWatchdog&) = delete;
  BackendWatchdog& operator=(const BackendWatchdog&) = delete;

  // From now on (the next ask). Turning it off forgets any silence.
  void SetSettings(const BackendProbe& settings);

  // Once a pass: asks `backend` (attached as `generation`; null: none) if
  // an ask is due and none is in flight. A new generation starts afresh.
  void Tick(absl::Time now, const std::shared_ptr<Backend>& backend, uint64_t generation);

  // Whether the backend of `generation` is silent now.
  bool silent(uint64_t generation);

 private:
  void OnAnswer(uint64_t generation, absl::Time asked_at, const absl::Status& s);

  const Listener listener_;
  absl::Mutex mu_;
  BackendProbe settings_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_ask_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  int missed_ ABSL_GUARDED_BY(mu_) = 0;
  // When the first unanswered ask of the current run was sent.
  absl::Time first_missed_at_ ABSL_GUARDED_BY(mu_);
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_BACKEND_WATCHDOG_H_
