// File: handoff.h
//
// Two dpproxy processes hand one state directory over (handoff.proto): the
// running one serves HandoffServer on <state_dir>/handoff.<G>.sock, a new one
// started with --takeover calls it with HandoffClient. What each step does
// to the proxy is the proxy's (ProxyServer's hooks); this is the wire.
//
//   // The running dpproxy:
//   auto server = HandoffServer::Start(JoinPath(state_dir, "handoff.0.sock"),
//                                      {release, forward, finish});
//   // The new one:
//   HandoffClient old(JoinPath(state_dir, "handoff.0.sock"));
//   absl::StatusOr<HandoffClient::Released> r = old.Release(absl::Seconds(40));
//   ... take the lock, load, serve ...
//   old.Forward({{"vendor.com/gpu", "/var/lib/kubelet/device-plugins/dpproxy-vendor.com_gpu.1.sock"}});
//   ... registered ...
//   old.Finish();
//   // ... or, if this one cannot go on, with the journal closed and the
//   // state directory unlocked:
//   old.HandBack("cannot serve the plugins' socket: ...");
#ifndef DPPROXY_PROXY_HANDOFF_HANDOFF_H_
#define DPPROXY_PROXY_HANDOFF_HANDOFF_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "proxy/rpc/owner_only_socket.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proxy/handoff/handoff.grpc.pb.h"

namespace dpproxy {

class HandoffServer {
 public:
  struct Hooks {
    // Hold new Allocates, finish those in progress, save, close the
    // journal, unlock the state directory. Returns the socket generation
    // served to the kubelet. An error keeps (or puts back) everything as
    // it was. `peer_pid`: the new dpproxy's process as this one's PID
    // namespace numbers it (the kernel's word, SO_PEERCRED), or 0 when it
    // runs in a namespace this one cannot see (another pod's).
    std::function<absl::StatusOr<int>(int64_t peer_pid)> release;
    // Send the held and later Allocates on to these sockets (resource ->
    // socket). Returns how many were held.
    std::function<absl::StatusOr<int64_t>(const std::map<std::string, std::string>&)> forward;
    // The new dpproxy is registered: stop. Must return at once (the answer
    // goes out first).
    std::function<void()> finish;
    // The new dpproxy gives the state back (`reason`): take the state
    // directory back and serve on. An error leaves this one released.
    std::function<absl::Status(const std::string& reason)> hand_back;
  };

  // Serves `socket` (mode 0600; a stale file there is replaced). Every
  // connection's credentials are checked as it is accepted (SO_PEERCRED):
  // only a process of this dpproxy's user (or root) is served; another is
  // refused and logged. Release names a process of the same user; the
  // process watched is the connection's (the pid a Release names is
  // numbered in the caller's own PID namespace, which may not be this one's).
  static absl::StatusOr<std::unique_ptr<HandoffServer>> Start(const std::string& socket,
                                                              Hooks hooks);
  ~HandoffServer();
  void Stop();
  // This dpproxy took its state back without a HandBack call (the new one
  // died): a new takeover may begin with Release again.
  void Reopen();

 private:
  class Service;
  HandoffServer() = default;
  std::string socket_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<OwnerOnlySocket> acceptor_;
};

class HandoffClient {
 public:
  explicit HandoffClient(const std::string& socket);

  struct Released {
    int socket_generation = 0;
    int64_t pid = 0;
    std::string version;
  };
  // kUnavailable if no dpproxy answers on the socket.
  absl::StatusOr<Released> Release(absl::Duration timeout);
  absl::StatusOr<int64_t> Forward(const std::map<std::string, std::string>& sockets,
                                  absl::Duration timeout);
  absl::Status Finish(absl::Duration timeout);
  absl::Status HandBack(const std::string& reason, absl::Duration timeout);

 private:
  const std::string socket_;
  std::unique_ptr<handoff::v1::Handoff::Stub> stub_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HANDOFF_HANDOFF_H_
