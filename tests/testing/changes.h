// File: changes.h
//
// Waits for a condition over several components at once (the simulated
// kubelet, dpproxy, plugins, the API server): the condition is checked
// now and again each time any watched event log records an event (or a
// watched callback fires), until it holds or the deadline passes. Nothing
// polls; a component says that something happened by emitting an event
// after the change, and the wait looks again then.
//
//   Changes changes;
//   changes.Watch(sim.events());
//   changes.Watch(proxy.events());
//   EXPECT_TRUE(changes.WaitUntil([&] { return Health("gpu-0") == "Unhealthy"; }, kWait));
#ifndef DPPROXY_TESTS_TESTING_CHANGES_H_
#define DPPROXY_TESTS_TESTING_CHANGES_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"

namespace dpproxy::testing {

class Changes {
 public:
  Changes() : count_(std::make_shared<Count>()) {}

  // From now on, every event `log` records wakes the waits. The log may
  // die first; watching it again after a restart is the caller's part.
  void Watch(EventLog& log) { log.AddListener(Notifier()); }

  // A function that wakes the waits, for a source that says something
  // happened by a callback (a loop's end of pass); harmless once this is
  // gone.
  std::function<void()> Notifier() {
    return [weak = std::weak_ptr<Count>(count_)] {
      if (std::shared_ptr<Count> c = weak.lock()) c->Bump();
    };
  }

  // True once `pred` holds; false if it still does not at `timeout`.
  bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const uint64_t seen = count_->Get();
      if (pred()) return true;
      if (!count_->AwaitAfter(seen, deadline)) {
        if (!pred()) return false;
        // Something changed with no event to say so: the wait took its
        // whole timeout. Said, so that it is mended where it happens.
        std::fprintf(stderr, "Changes::WaitUntil: the condition held only at the deadline; "
                             "whatever made it hold emitted no event\n");
        return true;
      }
    }
  }

 private:
  class Count {
   public:
    void Bump() {
      absl::MutexLock lock(&mu_);
      ++n_;
    }
    uint64_t Get() {
      absl::MutexLock lock(&mu_);
      return n_;
    }
    // False if no event came after `seen` by `deadline`.
    bool AwaitAfter(uint64_t seen, absl::Time deadline) {
      absl::MutexLock lock(&mu_);
      auto moved = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ != seen; };
      return mu_.AwaitWithDeadline(absl::Condition(&moved), deadline);
    }

   private:
    absl::Mutex mu_;
    uint64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  };

  std::shared_ptr<Count> count_;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_CHANGES_H_
