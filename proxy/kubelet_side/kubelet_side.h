// File: kubelet_side.h
//
// dpproxy toward the kubelet. Two peers implement KubeletSide:
//
//   device_plugin/  a device plugin per resource (v1alpha, v1beta1), each on
//                   a socket of its own, registered at kubelet.sock or found
//                   by the plugin watcher (device_plugin_side.h)
//   dra/            one DRA driver for every resource: ResourceSlices in the
//                   API server, claims prepared through the resources'
//                   allocators (dra_side.h)
//
// Both serve every allocation through the resource's Allocator (core/), so
// the journal and the held-device rules are the same whichever side the
// kubelet speaks. The server (proxy/server) builds one side, tells it of
// each resource, and hands its KubeletGates to a handoff.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_KUBELET_SIDE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_KUBELET_SIDE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proxy/core/allocator.h"
#include "proxy/util/files.h"
#include "proxy/util/health_check.h"

namespace dpproxy {

// One socket the kubelet calls dpproxy on, as a handoff between two dpproxy
// processes (proxy/handoff/handoff.proto) sees it: the running one holds
// the kubelet's calls, then forwards them to its successor's socket of the
// same name, which serves them through its own journal.
class KubeletGate {
 public:
  virtual ~KubeletGate() = default;

  // The name both processes know the socket by: the resource's name for a
  // device plugin, "dra:<driver>" for a DRA driver.
  virtual std::string gate_name() = 0;
  virtual std::string socket_path() = 0;
  // Calls that arrive from now on wait; those in progress go on.
  virtual void HoldCalls() = 0;
  // True once no call is in progress (held ones do not count).
  virtual bool WaitForCallsServed(absl::Duration timeout) = 0;
  // The held calls and every later one go on to `socket`, the successor's
  // socket of this name. Returns how many were held.
  virtual size_t ForwardCalls(const std::string& socket) = 0;
  // Back to serving here (a handoff given up, or taken back).
  virtual void ServeCalls() = 0;
  // The successor's side: the socket is served by this process.
  virtual bool SocketPresent() = 0;
  // The kubelet uses this socket now: it streams from it (a device plugin)
  // or registered it (a DRA driver).
  virtual bool KubeletUses() = 0;
  // The running side, handed over: waits up to `timeout` until the kubelet
  // stopped using this socket; true if it did.
  virtual bool WaitForKubeletGone(absl::Duration timeout) = 0;
};

// What the kubelet sees of one resource through a side.
struct KubeletView {
  // The API the kubelet speaks to it: "v1beta1", "v1alpha2 (plugin-watcher)",
  // "dra (driver)"; "" while not registered.
  std::string api;
  // Its kubelet-facing socket; "" where it has none of its own (DRA).
  std::string socket;
  // Steering away from devices of containers the kubelet forgot: preferred
  // answers that left such devices out, and ones that had to name some.
  int64_t forgotten_avoided = 0;
  int64_t forgotten_named = 0;
};

class KubeletSide {
 public:
  // How a side stops (Stop()).
  enum class Ending {
    kForGood,     // dpproxy stops: the kubelet must see its devices go
    kHandedOver,  // a successor serves: calls sent here just before are answered
    kGivenBack,   // a takeover given up: the predecessor serves on
  };
  // One housekeeping pass (Pass()).
  struct PassResult {
    // A kubelet other than the one seen at the last pass (its socket's id).
    std::optional<FileId> kubelet_restarted;
    // When Pass() must run again for a retry (InfiniteFuture: none due).
    absl::Time next_retry = absl::InfiniteFuture();
  };

  virtual ~KubeletSide() = default;

  // Starts serving the kubelet. Errors name the path or the server.
  virtual absl::Status Start() = 0;
  // Stops serving, removing its sockets. Call once; the resources outlive it.
  virtual void Stop(Ending ending) = 0;

  // Serves `allocator`'s resource from now on (any thread; it outlives the
  // side).
  virtual void AddResource(Allocator* allocator) = 0;
  // Serves the resource no more (its path changed, ProxyConfig::paths); a
  // later AddResource serves it again. Pods that hold its devices keep
  // them.
  virtual void RemoveResource(const std::string& resource) = 0;
  // Serves `allocator`'s resource with none of its devices usable: its
  // endpoint is (or stays) registered, every device shown Unhealthy, so
  // that a kubelet that holds devices of it for running pods keeps finding
  // it, while nothing new is admitted onto it. AddResource serves it fully
  // again, RemoveResource ends it. A side without endpoints does nothing.
  virtual void Withdraw(Allocator* allocator) {}
  // The resources served withdrawn now.
  virtual std::vector<std::string> Withdrawn() { return {}; }
  // Something about a resource changed (devices, health, a backend).
  virtual void Wake() = 0;
  // On the housekeeping thread, at least once a second: serves what a
  // kubelet removed, notices a kubelet restart, registers what is due.
  // Never blocks on the kubelet.
  virtual PassResult Pass(absl::Time now) = 0;
  // The settings a SIGHUP changes while running: the limit of each call to
  // a plugin, and whether CDI names go into annotations.
  virtual void SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) = 0;

  virtual KubeletView ViewOf(const std::string& resource) = 0;
  // Behind /readyz: registered with the kubelet, per resource or driver.
  virtual std::vector<HealthCheck> Readiness() = 0;

  // --- Handoff between two dpproxy processes ---
  // Every socket the kubelet calls this process on.
  virtual std::vector<KubeletGate*> Gates() = 0;
  // The running side, released: registers and publishes nothing more (the
  // successor does). Resume(): it serves on after all;
  // `successor_registered`: the successor had registered with the kubelet
  // before it failed (its marker in the state directory said so).
  virtual void Hold() = 0;
  virtual void Resume(bool successor_registered) = 0;
  // The successor, registered: the predecessor is about to exit; whatever
  // the kubelet would do at that exit to this side's registration is
  // undone or expected.
  virtual void BeforePredecessorExits() = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_KUBELET_SIDE_H_
