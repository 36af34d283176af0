// File: call_gate.h
//
// The one gate every kubelet-facing server puts the kubelet's calls through
// during a handoff (KubeletGate): a call is served here, held while a new
// dpproxy takes the state over, or forwarded to that dpproxy's socket of
// the same name once it serves. Both kinds of server use it: the device
// plugin's callback reactors, which must not block a gRPC thread and so
// leave a resume callback when held (Admit), and the DRA driver's
// synchronous handlers, which wait with the kubelet's deadline
// (AdmitWaiting).
//
//   CallGate gate;
//   gate.Hold();                     // a takeover begins
//   gate.WaitForServed(timeout);     // calls in progress finish
//   gate.Forward("/…/new.sock");     // held calls resume, forwarded
//
// Thread-safe. Resume callbacks run on the thread that opens the gate, with
// no lock held.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_CALL_GATE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_CALL_GATE_H_

#include <stddef.h>

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dpproxy {

class CallGate {
 public:
  enum class Mode { kServe, kHold, kForward };

  // A call that must not block. kServe and kForward (with the successor's
  // socket in `forward_to`) count it in progress until Done(). kHold keeps
  // `resume`, under `key`, to be run once the gate opens (the call is then
  // admitted again), unless Unhold(key) comes first.
  Mode Admit(const void* key, std::function<void()> resume, std::string* forward_to);
  // Forgets a held call (its caller went away); false if it was not held.
  bool Unhold(const void* key);

  // A call that may wait: while held, until the gate opens, `cancelled`
  // says so (checked every 100 ms), `deadline` passes or the gate stops.
  // kServe counts it in progress until Done(); kForward names the
  // successor's socket; kRefuse: still held, or stopping.
  enum class Admission { kServe, kForward, kRefuse };
  Admission AdmitWaiting(const std::function<bool()>& cancelled, absl::Time deadline,
                         std::string* forward_to);

  // A call admitted to be served or forwarded has ended.
  void Done();

  // Calls that arrive from now on are held; those in progress go on.
  void Hold();
  // True once no admitted call is in progress (held ones do not count).
  bool WaitForServed(absl::Duration timeout);
  // The held calls and every later one go on to `socket`. Returns how many
  // were held.
  size_t Forward(const std::string& socket);
  // Back to serving here; the held calls are admitted again.
  void Serve();
  // Refuses waiting calls from now on (the server stops). True the first
  // time.
  bool Stop();

 private:
  // Takes the held resume callbacks (to be run without the lock).
  std::map<const void*, std::function<void()>> TakeHeldLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kServe;
  std::string forward_to_ ABSL_GUARDED_BY(mu_);
  int in_progress_ ABSL_GUARDED_BY(mu_) = 0;
  // Held calls: those that left a resume callback, and those waiting.
  std::map<const void*, std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_CALL_GATE_H_
