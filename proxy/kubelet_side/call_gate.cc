#include "proxy/kubelet_side/call_gate.h"

#include <utility>

#include "absl/time/clock.h"

namespace dpproxy {

CallGate::Mode CallGate::Admit(const void* key, std::function<void()> resume,
                               std::string* forward_to) {
  absl::MutexLock lock(&mu_);
  switch (mode_) {
    case Mode::kServe:
      ++in_progress_;
      break;
    case Mode::kHold:
      held_.emplace(key, std::move(resume));
      break;
    case Mode::kForward:
      ++in_progress_;
      *forward_to = forward_to_;
      break;
  }
  return mode_;
}

bool CallGate::Unhold(const void* key) {
  absl::MutexLock lock(&mu_);
  return held_.erase(key) > 0;
}

CallGate::Admission CallGate::AdmitWaiting(const std::function<bool()>& cancelled,
                                           absl::Time deadline, std::string* forward_to) {
  absl::MutexLock lock(&mu_);
  ++waiting_;
  // A wait with a deadline, woken by the change; the caller's cancellation
  // has no event to wait on, so it is looked at every 100 ms.
  while (mode_ == Mode::kHold && !stopping_ && !cancelled() && deadline > absl::Now()) {
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](CallGate* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) {
              return g->mode_ != Mode::kHold || g->stopping_;
            },
            this),
        absl::Milliseconds(100));
  }
  --waiting_;
  if (stopping_ || mode_ == Mode::kHold) return Admission::kRefuse;
  ++in_progress_;
  if (mode_ == Mode::kForward) {
    *forward_to = forward_to_;
    return Admission::kForward;
  }
  return Admission::kServe;
}

void CallGate::Done() {
  absl::MutexLock lock(&mu_);
  --in_progress_;
}

void CallGate::Hold() {
  absl::MutexLock lock(&mu_);
  mode_ = Mode::kHold;
}

bool CallGate::WaitForServed(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](int* n) { return *n == 0; }, &in_progress_),
      timeout);
}

std::map<const void*, std::function<void()>> CallGate::TakeHeldLocked() {
  std::map<const void*, std::function<void()>> held;
  held.swap(held_);
  return held;
}

size_t CallGate::Forward(const std::string& socket) {
  std::map<const void*, std::function<void()>> held;
  size_t count = 0;
  {
    absl::MutexLock lock(&mu_);
    mode_ = Mode::kForward;
    forward_to_ = socket;
    held = TakeHeldLocked();
    count = held.size() + static_cast<size_t>(waiting_);
  }
  for (auto& [key, resume] : held) resume();
  return count;
}

void CallGate::Serve() {
  std::map<const void*, std::function<void()>> held;
  {
    absl::MutexLock lock(&mu_);
    mode_ = Mode::kServe;
    forward_to_.clear();
    held = TakeHeldLocked();
  }
  for (auto& [key, resume] : held) resume();
}

bool CallGate::Stop() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  stopping_ = true;
  return true;
}

}  // namespace dpproxy
