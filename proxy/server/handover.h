// File: handover.h
//
// The running side of a handoff between two dpproxy processes
// (proxy/handoff/handoff.proto): it serves <state_dir>/handoff.<G>.sock
// (and hands its HTTP listener over, listener_share.h) and answers the
// steps a dpproxy started with --takeover takes:
//
//   Release   hold the kubelet's Allocates, let those in progress reach the
//             journal, stop writing (Host::StopWriting: save, close the
//             journal, unlock), and watch the new process (a pidfd);
//   Forward   the held Allocates and every later one go to the new one's
//             sockets;
//   Finish    done: `on_done` runs and the caller stops this dpproxy;
//   HandBack  the new one gives the state back (it failed): take it back
//             (Host::ResumeWriting) and serve on.
//
// Housekeeping calls CheckProgress: a new process that exits before Finish
// gives the state back here; one that never forwards within the handoff
// timeout makes this one stop (`on_done`, failed()), so that a restart
// serves with the whole state.
#ifndef DPPROXY_PROXY_SERVER_HANDOVER_H_
#define DPPROXY_PROXY_SERVER_HANDOVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/handoff/handoff.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/kubelet_side/kubelet_side.h"

namespace dpproxy {

class Handover {
 public:
  // What a handover does to the dpproxy's other parts.
  class Host {
   public:
    virtual ~Host() = default;
    // Every socket the kubelet calls this dpproxy on.
    virtual std::vector<KubeletGate*> HandoverGates() = 0;
    // How long an Allocate in progress may take (the backend timeout and
    // a margin).
    virtual absl::Duration AllocateWait() = 0;
    // Released: register nothing more, keep the devices' health when a
    // plugin goes, save the resources, stop the plugins' socket, close the
    // journal and unlock the state directory.
    virtual void StopWriting() = 0;
    // Taking the state back: lock, read the journal again (with what the
    // new one wrote), serve the plugins' socket, reconcile, register every
    // resource again. Returns the allocations loaded; an error leaves this
    // one released.
    virtual absl::StatusOr<int> ResumeWriting() = 0;
  };
  struct Options {
    std::string state_dir;
    int socket_generation = 0;
    absl::Duration handoff_timeout = absl::Minutes(1);
    // The HTTP listener to hand over (-1: none).
    int shared_listener_fd = -1;
  };
  // `on_done` runs once this dpproxy handed over, or gave up (failed()):
  // the caller stops it.
  Handover(Options options, Host* host, EventLog* events, std::function<void()> on_done);
  ~Handover();

  Handover(const Handover&) = delete;
  Handover& operator=(const Handover&) = delete;

  // Serves the handoff socket (and shares the listener). A failure is
  // logged: a new dpproxy can then not take over without a gap.
  void Serve();
  // Stops serving (Shutdown).
  void StopServing();
  // Housekeeping, every pass.
  void CheckProgress(absl::Time now);

  // Released to a new dpproxy: nothing more is written here.
  bool released() const { return released_.load(); }
  bool handed_over() const { return handed_over_.load(); }
  // Released to a new dpproxy that never served (handoff_abandoned).
  bool failed() const { return failed_.load(); }

  // How long after a Release the process it named must hold the state
  // directory's lock: one that does not by then is no takeover, and the
  // state comes back (handoff_taken_back).
  static constexpr absl::Duration kLockGrace = absl::Seconds(5);

 private:
  absl::StatusOr<int> Release(int64_t peer_pid);
  // Nobody holds the state directory's lock (a try that takes it and lets
  // it go at once).
  bool StateLockFree();
  absl::StatusOr<int64_t> Forward(const std::map<std::string, std::string>& sockets);
  void Finish();
  absl::Status TakeBack(const std::string& why);
  // CheckProgress's take-back (`why`): the handoff socket serves a new
  // Release again. False, logged, if the state could not be taken back
  // (tried again at the next pass).
  bool TakeBackAndReopen(const std::string& why);
  // CheckProgress's look at the state directory's lock, which the new
  // dpproxy holds while it lives: true if the state was taken back.
  bool WatchLock(absl::Time now, int64_t released_at_ns);

  const Options options_;
  Host* const host_;
  EventLog* const events_;
  const std::function<void()> on_done_;
  std::unique_ptr<HandoffServer> server_;
  std::unique_ptr<ListenerShare> listener_share_;
  // Release and taking the state back, one at a time.
  absl::Mutex mu_;
  // The process the state was released to (pidfd_open), watched by
  // CheckProgress: it exiting before Finish gives the state back here.
  int peer_pidfd_ = -1;
  int64_t peer_pid_ = 0;
  std::atomic<bool> released_{false};
  std::atomic<bool> handed_over_{false};
  std::atomic<int64_t> released_at_ns_{0};
  std::atomic<bool> forwarded_{false};
  std::atomic<bool> failed_{false};
  // The lock was seen held since the Release (CheckProgress's thread only).
  bool lock_seen_ = false;
  // Passes that found it free again since (CheckProgress's thread only).
  int lock_free_passes_ = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_HANDOVER_H_
