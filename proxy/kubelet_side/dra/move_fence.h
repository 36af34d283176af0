// File: move_fence.h
//
// Keeps the scheduler off the node while a resource leaves the kubelet's
// device manager for DRA, so that no pod is failed in between.
//
// The scheduler routes a pod of an extended resource by the node's status:
// through the device plugin while the status shows the resource
// allocatable, else through DRA (KEP-5004). The kubelet's device manager
// loses the devices the moment dpproxy withdraws them, but the status shows
// it only at the kubelet's next node status update (every 10 s by default;
// 1.3-9.2 s later on a real 1.36 node). A pod the scheduler routes to the
// device plugin in between is refused by the kubelet ("no healthy devices
// present") and fails for good.
//
// A move therefore goes in steps, on the DRA side's thread (Step()):
//   1. the node gets a NoSchedule taint, kMoveTaintKey: no new pod is
//      bound to it;
//   2. kSettle later (a pod bound just before is admitted by then: the
//      kubelet admits a bound pod within half a second), the devices are
//      withdrawn from the device manager (`withdraw`);
//   3. once the node's status shows the resource at 0 (or absent), or
//      kStatusLimit has passed, the taint goes: pods come again and the
//      scheduler routes them through DRA.
// Pods already on the node run on; pods that were pending for the ~10 s
// are scheduled once the taint goes. Without the right to update the node
// (a 403), or with the fence switched off, the devices are withdrawn at
// once, as before, and a warning names why.
//
//   MoveFence fence(client, "node-1", events);
//   fence.Fence("vendor.com/gpu", [&] { device_plugins->Withdraw(a); });
//   ... fence.Step(absl::Now()) at every pass ...
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_MOVE_FENCE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_MOVE_FENCE_H_

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/kube/kube_client.h"

namespace dpproxy {

// The taint's key; its value is "device-plugin-to-dra", its effect
// NoSchedule.
inline constexpr char kMoveTaintKey[] = "dpproxy/moving";

class MoveFence {
 public:
  // From the taint to the withdrawal.
  static constexpr absl::Duration kSettle = absl::Seconds(2);
  // The longest the taint waits for the node's status after the
  // withdrawal (the kubelet writes it every 10 s by default).
  static constexpr absl::Duration kStatusLimit = absl::Seconds(60);

  // `client` may be null until the API server is known (set_client); the
  // node is `node`. `events` outlives this.
  MoveFence(std::string node, EventLog* events) : node_(std::move(node)), events_(events) {}

  MoveFence(const MoveFence&) = delete;
  MoveFence& operator=(const MoveFence&) = delete;

  void set_client(KubeClient* client) ABSL_LOCKS_EXCLUDED(mu_);

  // `resource` leaves the device manager: `withdraw` runs (on the thread
  // of Step()) once the node is fenced and settled, or at the next Step()
  // if it cannot be fenced. A second Fence of the same resource replaces
  // the first.
  void Fence(const std::string& resource, std::function<void()> withdraw)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `resource` goes back to the device manager: its withdrawal, if not
  // run yet, never runs. True if one was pending.
  bool Cancel(const std::string& resource) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a move is under way (something to Step()).
  bool busy() ABSL_LOCKS_EXCLUDED(mu_);

  // One pass: raises the taint for new moves, withdraws what has settled,
  // reads the node's status for withdrawn ones, and lowers the taint when
  // nothing is under way. A taint found at the first pass that no move of
  // this process put there (an earlier dpproxy stopped in the middle of a
  // move) is lowered. Never blocks longer than the API calls it makes.
  void Step(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // dpproxy stops: withdrawals not run yet are dropped (the device-plugin
  // side stops anyway), and a raised taint is lowered through `client`
  // (the side's own may be cancelled by then; nullptr: left for the next
  // start, which lowers it).
  void Stop(KubeClient* client) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Move {
    enum Stage { kNew, kSettling, kWithdrawn } stage = kNew;
    absl::Time since;
    std::function<void()> withdraw;
  };
  // Adds or removes the taint with a read and an update at the node's
  // resourceVersion, read again after a conflict. True if it changed.
  absl::StatusOr<bool> SetTaint(KubeClient* client, bool on);
  // Step's parts, in order. A taint an earlier dpproxy left (raised_ then).
  void CheckStaleTaint(KubeClient* client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Taints the node for the `fresh` moves; if it cannot, withdraws them at
  // once, unfenced, and empties `fresh`.
  void Raise(KubeClient* client, std::vector<std::string>* fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // Fresh moves settle; settled ones are withdrawn from the device manager.
  void Advance(absl::Time now, const std::vector<std::string>& fresh,
               const std::vector<std::string>& settled);
  // Withdrawn moves end once the node's status shows them (or after
  // kStatusLimit).
  void FinishWithdrawn(KubeClient* client, absl::Time now,
                       const std::vector<std::string>& withdrawn);
  // With no move under way, the taint goes.
  void LowerWhenIdle(KubeClient* client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // The resource's allocatable in the node's status (0 when absent).
  absl::StatusOr<int64_t> StatusAllocatable(KubeClient* client, const std::string& resource);

  const std::string node_;
  EventLog* const events_;

  absl::Mutex mu_;
  KubeClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, Move> moves_ ABSL_GUARDED_BY(mu_);
  // Only Step() and Stop() change these (one thread at a time: mu_ is not
  // held across API calls, step_mu_ is).
  absl::Mutex step_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool raised_ ABSL_GUARDED_BY(step_mu_) = false;
  bool checked_stale_ ABSL_GUARDED_BY(step_mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(step_mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_MOVE_FENCE_H_
