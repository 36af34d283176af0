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

#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/util/waitable_count.h"

namespace dpproxy::testing {

class Changes {
 public:
  Changes() : count_(std::make_shared<WaitableCount>()) {}

  // From now on, every event `log` records wakes the waits. The log may
  // die first; watching it again after a restart is the caller's part.
  void Watch(EventLog& log) { log.AddListener(Notifier()); }

  // A function that wakes the waits, for a source that says something
  // happened by a callback (a loop's end of pass); harmless once this is
  // gone.
  std::function<void()> Notifier() {
    return [weak = std::weak_ptr<WaitableCount>(count_)] {
      if (std::shared_ptr<WaitableCount> c = weak.lock()) c->Add();
    };
  }

  // True once `pred` holds; false if it still does not at `timeout`.
  bool WaitUntil(const std::function<bool()>& pred, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      const int64_t seen = count_->Get();
      if (pred()) return true;
      if (!count_->WaitFor(seen + 1, deadline - absl::Now())) {
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
  std::shared_ptr<WaitableCount> count_;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_CHANGES_H_
