// File: housekeeping.h
//
// The two threads that keep dpproxy in step with the node:
//
//   housekeeping  wakes on a change (a device list, a backend, a file in
//                 device-plugins/) or once a second, sooner when a
//                 registration is due for a retry, and then runs the
//                 resources' timers, dials static backends that are away,
//                 applies what is withheld, lets the registrar serve and
//                 register, and watches a handoff's progress. It never
//                 waits on the disk: the saver is woken after each pass.
//   checkpoint    reads the kubelet's checkpoint after each pass (with a
//                 reconciler only). Those checks cost O(allocations) and
//                 the kubelet rewrites its checkpoint after every
//                 allocation: on a thread of their own, detecting and
//                 serving a kubelet restart never waits behind one.
//                 Changes during a pass are taken by the next, together.
//
// Wake() may be called before Start() and from any thread.
//
//   Housekeeping hk;
//   hk.Start({&table, &statics, withheld, &registrar, reconciler, handover, &saver});
//   hk.Wake();
#ifndef DPPROXY_PROXY_SERVER_HOUSEKEEPING_H_
#define DPPROXY_PROXY_SERVER_HOUSEKEEPING_H_

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/server/handover.h"
#include "proxy/server/withheld.h"
#include "proxy/holders/reconciler.h"
#include "proxy/server/resource_table.h"
#include "proxy/server/saver.h"
#include "proxy/server/shared_ids.h"
#include "proxy/server/static_backends.h"
#include "proxy/status/status_model.h"
#include "proxy/util/waitable_count.h"

namespace dpproxy {

class Housekeeping {
 public:
  struct Parts {
    ResourceTable* table = nullptr;
    StaticBackends* statics = nullptr;
    Withheld* withheld = nullptr;  // with a state directory
    KubeletSide* side = nullptr;
    Reconciler* reconciler = nullptr;  // with a state directory, not in DRA mode
    Handover* handover = nullptr;      // the same
    Saver* saver = nullptr;
    SharedIds* shared_ids = nullptr;
    // Called at the end of every pass, on the housekeeping thread.
    std::function<void()> after_pass;
  };

  Housekeeping() = default;
  ~Housekeeping() { Stop(); }

  Housekeeping(const Housekeeping&) = delete;
  Housekeeping& operator=(const Housekeeping&) = delete;

  void Start(Parts parts) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

  // Behind /livez: a pass completed in the last 30 s (it runs at least
  // once a second).
  HealthCheck Liveness() const;
  const WaitableCount& passes() const { return passes_; }

 private:
  void Loop();
  void CheckpointLoop();
  // Waits for a wake-up (or `flag`, or Stop) until `timeout`; false once
  // stopping.
  bool Await(bool* flag, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  Parts p_;
  absl::Mutex mu_;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool checkpoint_wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Kubelet restarts seen by housekeeping, for the checkpoint thread.
  std::vector<Reconciler::RestartSeen> restarts_seen_ ABSL_GUARDED_BY(mu_);
  std::thread housekeeping_;
  std::thread checkpoint_;
  // Housekeeping thread only.
  absl::Time next_retry_ = absl::InfiniteFuture();
  WaitableCount passes_;
  // When the last pass ended (absl::ToUnixNanos).
  std::atomic<int64_t> pass_at_ns_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_HOUSEKEEPING_H_
