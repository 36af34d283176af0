// File: takeover.h
//
// The taking-over side of a handoff between two dpproxy processes
// (--takeover; proxy/handoff/handoff.proto):
//
//   AskToRelease   in Start, before the lock: the running dpproxy (the
//                  predecessor) saves, closes its journal and unlocks;
//   Complete       once this one serves (its own thread): the predecessor
//                  forwards the kubelet's Allocates here; every plugin the
//                  predecessor had is connected here too (or gone); the kubelet is
//                  registered with and streams from this one for every
//                  resource; 1.25-1.36 kubelets' client entries are emptied
//                  (client_name_release.h); the predecessor is told to
//                  finish, and exits;
//   HandBack       stopping or failing before Finish: the predecessor gets
//                  the state back and serves on.
//
// Until Finish the predecessor stays the kubelet's endpoint for whatever is
// not registered here, and forwards what it gets: telling it to finish
// earlier could leave the node with no dpproxy.
#ifndef DPPROXY_PROXY_SERVER_TAKEOVER_H_
#define DPPROXY_PROXY_SERVER_TAKEOVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/handoff/handoff.h"
#include "proxy/kubelet_side/kubelet_side.h"

namespace dpproxy {

class Takeover {
 public:
  // `release_timeout`: how long the predecessor may take to release (its
  // Allocates in progress finish first, each within the backend timeout).
  Takeover(std::string state_dir, absl::Duration release_timeout, EventLog* events);
  ~Takeover();

  Takeover(const Takeover&) = delete;
  Takeover& operator=(const Takeover&) = delete;

  // Asks the running dpproxy to release the state directory; from then on
  // socket_generation() is the other one than its.
  absl::Status AskToRelease();
  bool released() const { return predecessor_ != nullptr; }
  int socket_generation() const { return socket_generation_; }

  // What Complete needs of this dpproxy. Each is called on the takeover's
  // thread.
  struct Parts {
    // The kubelet-facing side, and its sockets.
    KubeletSide* side = nullptr;
    // Shutdown() has begun.
    std::function<bool()> stopping;
    // Just before the predecessor is told to finish (may be empty).
    std::function<void()> before_finish;
    // Waits up to the given time until every plugin the predecessor had
    // connected is connected here too, or found gone (may be empty).
    std::function<bool(absl::Duration)> plugins_back;
  };
  // Runs Complete on a thread of its own.
  void StartCompleting(Parts parts);
  // Waits for that thread (Shutdown, after `stopping` turned true).
  void Join();
  // Whether the predecessor was told to finish, or the takeover failed,
  // within `timeout`.
  bool WaitForDone(absl::Duration timeout) {
    return done_.WaitForNotificationWithTimeout(timeout);
  }
  bool finish_sent() const { return finish_sent_.load(); }

  // The state could not be taken or kept (a start error, stopped before
  // registered): hands it back to the predecessor, which serves on. The
  // caller has closed the journal and released the lock.
  void HandBack(const std::string& why);

 private:
  void Complete(const Parts& parts);
  // Complete's waits: for the predecessor's plugins to be connected here,
  // and to be registered with the kubelet for every resource (false if
  // stopping first).
  void WaitForPluginsBack(const Parts& parts);
  bool WaitUntilRegistered(const Parts& parts);
  // Whether `done` holds for every gate within `timeout`, checked
  // every 10 ms (a takeover's one-off waits: a socket served, a
  // registration, the kubelet's stream, each a few milliseconds); false if
  // stopping or out of time.
  bool WaitForEvery(const Parts& parts, const std::function<bool(KubeletGate*)>& done,
                    absl::Duration timeout);

  const std::string state_dir_;
  const absl::Duration release_timeout_;
  EventLog* const events_;
  std::unique_ptr<HandoffClient> predecessor_;
  int socket_generation_ = 0;
  std::thread thread_;
  absl::Notification done_;
  std::atomic<bool> finish_sent_{false};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_TAKEOVER_H_
