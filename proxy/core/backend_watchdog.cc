#include "proxy/core/backend_watchdog.h"

#include <utility>

#include "absl/time/clock.h"

namespace dpproxy {

BackendWatchdog::BackendWatchdog(Listener listener) : listener_(std::move(listener)) {}

BackendWatchdog::~BackendWatchdog() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* in_flight) { return !*in_flight; }, &in_flight_));
}

void BackendWatchdog::SetSettings(const BackendProbe& settings) {
  absl::MutexLock lock(&mu_);
  settings_ = settings;
  if (settings_.interval <= absl::ZeroDuration()) {
    missed_ = 0;
    silent_ = false;
  }
}

bool BackendWatchdog::silent(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  return silent_ && generation_ == generation;
}

void BackendWatchdog::Tick(absl::Time now, const std::shared_ptr<Backend>& backend,
                           uint64_t generation) {
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    if (backend == nullptr || settings_.interval <= absl::ZeroDuration()) return;
    if (generation != generation_) {
      // Another backend: its first ask one interval after it attached.
      generation_ = generation;
      missed_ = 0;
      silent_ = false;
      next_ask_ = now + settings_.interval;
      return;
    }
    if (in_flight_ || now < next_ask_) return;
    in_flight_ = true;
    next_ask_ = now + settings_.interval;
    timeout = settings_.timeout;
  }
  const absl::Time asked_at = absl::Now();
  backend->ProbeAsync(timeout, [this, generation, asked_at](absl::Status s) {
    OnAnswer(generation, asked_at, s);
  });
}

void BackendWatchdog::OnAnswer(uint64_t generation, absl::Time asked_at, const absl::Status& s) {
  bool became_silent = false, answered_again = false;
  absl::Duration silent_for;
  {
    absl::MutexLock lock(&mu_);
    if (generation != generation_) {
      in_flight_ = false;
      return;
    }
    if (absl::IsCancelled(s)) {
      // Withdrawn (the backend stopped): says nothing of it.
    } else if (s.ok()) {
      answered_again = silent_;
      silent_for = absl::Now() - first_missed_at_;
      missed_ = 0;
      silent_ = false;
    } else {
      if (missed_ == 0) first_missed_at_ = asked_at;
      ++missed_;
      silent_for = absl::Now() - first_missed_at_;
      became_silent = !silent_ && missed_ >= settings_.misses;
      if (became_silent) silent_ = true;
    }
  }
  if (became_silent && listener_.on_silent) listener_.on_silent(generation, silent_for);
  if (answered_again && listener_.on_answering) listener_.on_answering(generation, silent_for);
  // Last: the destructor waits for it.
  absl::MutexLock lock(&mu_);
  in_flight_ = false;
}

}  // namespace dpproxy
