// File: dra_server.h
//
// dpproxy as a DRA driver toward the kubelet (dra-facts.md §2, §3): a
// plugin-watcher socket <kubelet_root>/plugins_registry/<driver>-reg.sock
// answering GetInfo with type "DRAPlugin", the driver's name, the service
// socket <kubelet_root>/plugins/<driver>/dra.sock and the services served,
// newest first ("v1.DRAPlugin", "v1beta1.DRAPlugin"); and on that socket
// NodePrepareResources and NodeUnprepareResources in both proto packages,
// one core (ClaimPreparer) behind them, and the devices' health stream
// (v1alpha1.DRAResourceHealth, health_hub.h). A claim that fails carries its
// error in its own entry of the answer; the call itself succeeds.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "proxy/kubelet_side/dra/claim_preparer.h"
#include "proxy/kubelet_side/dra/health_hub.h"
#include "proxy/events/event_log.h"

namespace dpproxy {

class DraServer {
 public:
  struct Options {
    std::string kubelet_root = "/var/lib/kubelet";
    std::string driver;
    // Called when the kubelet registers the driver (after each kubelet
    // start): a kubelet deletes the node's slices when it starts.
    std::function<void()> on_registered;
  };
  DraServer(Options options, ClaimPreparer* preparer, EventLog* events);
  ~DraServer();

  // Serves both sockets (stale files replaced). Errors name the path.
  absl::Status Start();
  void Stop();

  std::string registration_socket() const;
  std::string service_socket() const;
  // Whether the kubelet said it registered us (NotifyRegistrationStatus).
  bool registered() const { return registered_.load(); }
  // The devices' health stream (DRAResourceHealth) served on the service
  // socket: set each pool's devices as they change.
  HealthHub& health() { return health_; }

 private:
  class Services;

  const Options options_;
  ClaimPreparer* const preparer_;
  EventLog* const events_;
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> service_server_;
  std::atomic<bool> registered_{false};
  HealthHub health_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_DRA_SERVER_H_
