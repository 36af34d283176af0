// File: dra_server.h
//
// dpproxy as a DRA driver toward the kubelet (the kubelet's plugin watcher and
// kubernetes/kubelet pkg/apis/dra): a plugin-watcher socket
// <kubelet_root>/plugins_registry/<driver>-reg.sock answering GetInfo with type
// "DRAPlugin", the driver's name, the service socket
// <kubelet_root>/plugins/<driver>/dra.sock and the services served, newest
// first ("v1.DRAPlugin", "v1beta1.DRAPlugin"); and on that socket
// NodePrepareResources and NodeUnprepareResources in both proto packages, one
// core (ClaimPreparer) behind them, and the devices' health stream
// (v1alpha1.DRAResourceHealth, health_hub.h). A claim that fails carries its
// error in its own entry of the answer; the call itself succeeds.
//
// Socket generation g > 0 (a takeover's successor, the other generation than
// its predecessor's) names both sockets apart: <driver>-reg-<g>.sock and
// dra-<g>.sock. A 1.33+ kubelet then keeps both instances and calls the one
// registered last. As a handoff's KubeletGate the server holds the kubelet's
// prepares and unprepares, then forwards them to the successor's service
// socket.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/server_context.h>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/kubelet_side/dra/claim_preparer.h"
#include "proxy/kubelet_side/dra/health_hub.h"
#include "proxy/events/event_log.h"
#include "proxy/kubelet_side/call_gate.h"
#include "proxy/kubelet_side/kubelet_side.h"

namespace dpproxy {

class DraServer : public KubeletGate {
 public:
  struct Options {
    std::string kubelet_root = "/var/lib/kubelet";
    std::string driver;
    // Called when the kubelet registers the driver (after each kubelet
    // start): a kubelet deletes the node's slices when it starts.
    std::function<void()> on_registered;
    // Names the sockets apart from a takeover's predecessor's.
    int socket_generation = 0;
  };
  DraServer(Options options, ClaimPreparer* preparer, EventLog* events);
  ~DraServer() override;

  // Serves both sockets (stale files replaced). Errors name the path.
  absl::Status Start();
  // How this instance's registration goes when it hands over to a
  // successor, whose registration socket has another name. The kubelet's
  // plugin watcher acts on the creation and the deletion of registration
  // sockets, never on a rename.
  enum class Withdrawal {
    // Deleted: a kubelet from 1.33 keeps each instance of a driver by its
    // endpoint and forgets this one only (the successor's serves on). A
    // rename would leave it registered, dead: its health stream retried
    // every 5 s, and an instance to fall back to that answers nothing.
    kDelete,
    // Renamed away (to a name starting with '.'), then deleted: up to
    // 1.32 a deletion deregisters the driver by name, the successor's
    // instance with it, while the successor's registration already
    // replaced this one.
    kRename,
  };
  // Stops serving; `handed_over` to a successor, the registration goes as
  // `how` says, else it is deleted. The first call counts; later ones do
  // nothing.
  void Stop(bool handed_over = false, Withdrawal how = Withdrawal::kRename);

  std::string registration_socket() const;
  std::string service_socket() const;

  // --- KubeletGate (kubelet_side.h), named "dra:<driver>" ---
  std::string gate_name() override { return absl::StrCat("dra:", options_.driver); }
  std::string socket_path() override { return service_socket(); }
  void HoldCalls() override;
  bool WaitForCallsServed(absl::Duration timeout) override;
  size_t ForwardCalls(const std::string& socket) override;
  void ServeCalls() override;
  bool SocketPresent() override;
  bool KubeletUses() override { return registered(); }
  // The kubelet picks the instance for each call: nothing to wait for.
  bool WaitForKubeletGone(absl::Duration) override { return true; }

  // Implementation, for the services: the kubelet's calls go through it
  // (served here, forwarded or refused; each admitted one until Done()).
  CallGate& gate() { return gate_; }
  // Whether the kubelet said it registered us (NotifyRegistrationStatus).
  bool registered() const { return registered_.load(); }
  // The devices' health stream (DRAResourceHealth) served on the service
  // socket: set each pool's devices as they change.
  HealthHub& health() { return health_; }

 private:
  class Services;

  std::string RegistrationSocketOf(int generation) const;
  std::string ServiceSocketOf(int generation) const;
  // Removes the registration sockets of this driver that an earlier
  // dpproxy left and nobody serves (it was killed), so that the kubelet,
  // whose plugin watcher acts on their deletion, forgets those instances:
  // a 1.33+ kubelet keeps each one, retries its health stream every 5 s
  // and falls back to it when this one goes. Event dra_dead_instance_removed.
  void RemoveDeadInstances();

  const Options options_;
  ClaimPreparer* const preparer_;
  EventLog* const events_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> service_server_;
  std::atomic<bool> registered_{false};
  HealthHub health_;

  CallGate gate_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_
