// File: control_server.h
//
// Serves dpproxy's control socket (control.proto) on an owner-only socket
// (proxy/rpc/owner_only_socket.h): checks what callers send, names who
// asked, and hands each request to its Host, which owns the policy.
#ifndef DPPROXY_PROXY_CONTROL_CONTROL_SERVER_H_
#define DPPROXY_PROXY_CONTROL_CONTROL_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "proxy/control/control.grpc.pb.h"
#include "proxy/rpc/owner_only_socket.h"
#include "proxy/state/cordon_book.h"

namespace dpproxy {

// The largest cordon reason, and the longest resource or device name.
inline constexpr size_t kMaxCordonReasonBytes = 1024;
inline constexpr size_t kMaxCordonNameBytes = 1024;

// The control socket's name in the state directory.
inline constexpr char kControlSocketName[] = "control.sock";

class ControlServer {
 public:
  class Host {
   public:
    virtual ~Host() = default;
    // `c` names the resource, device and reason (checked), the caller and
    // the time: cordons it, or says why not.
    virtual absl::StatusOr<Cordon> CordonDevice(Cordon c) = 0;
    virtual absl::StatusOr<Cordon> UncordonDevice(const std::string& resource,
                                                  const std::string& device,
                                                  const OwnerOnlySocket::Peer& by) = 0;
    virtual std::vector<Cordon> Cordons() = 0;
  };

  // Serves `socket_path` until destroyed.
  static absl::StatusOr<std::unique_ptr<ControlServer>> Start(const std::string& socket_path,
                                                              Host* host);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

 private:
  class Service;
  ControlServer() = default;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<OwnerOnlySocket> socket_;
};

// Why `reason` is not a cordon reason (over 1 KiB, not UTF-8, or with a
// control character), naming where; OK if it is one.
absl::Status CheckCordonReason(const std::string& reason);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CONTROL_CONTROL_SERVER_H_
