// File: owner_only_socket.h
//
// A gRPC server's Unix socket that only this process's user and root may
// use: the socket is mode 0600, and its connections are accepted here, not
// by gRPC, so that each caller's credentials are known (SO_PEERCRED, which
// gRPC does not expose). A connection from another user is refused, logged
// and closed; an accepted one is handed to the server, which can then ask
// who is calling (PeerOf). One thread, woken by an eventfd to stop.
//
//   auto server = builder.BuildAndStart();  // with no listening port
//   auto socket = OwnerOnlySocket::Listen(path, server.get(), "handoff socket",
//                                         "take over");
//   ... in a call: socket->PeerOf(ctx->peer())->pid
#ifndef DPPROXY_PROXY_RPC_OWNER_ONLY_SOCKET_H_
#define DPPROXY_PROXY_RPC_OWNER_ONLY_SOCKET_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dpproxy {

class OwnerOnlySocket {
 public:
  // Who is calling, as the kernel said when the connection was accepted:
  // the pid in this process's PID namespace (0 for a process this
  // namespace cannot see) and the uid.
  struct Peer {
    int64_t pid = 0;
    uid_t uid = 0;
  };

  // Listens at `path` (a stale socket there is replaced; any other file is
  // not) and hands accepted connections to `server`. `what` names the
  // socket in logs ("handoff socket"); `purpose` says what a refused
  // caller could not do ("take over").
  static absl::StatusOr<std::unique_ptr<OwnerOnlySocket>> Listen(const std::string& path,
                                                                 grpc::Server* server,
                                                                 std::string what,
                                                                 std::string purpose);
  // Stops accepting and removes the socket (unless another process bound
  // the path since); connections handed over stay the server's.
  ~OwnerOnlySocket();
  OwnerOnlySocket(const OwnerOnlySocket&) = delete;
  OwnerOnlySocket& operator=(const OwnerOnlySocket&) = delete;

  // The caller of a connection, by the name gRPC gives it
  // (ServerContext::peer(): "fd:N"); nullopt if unknown.
  std::optional<Peer> PeerOf(absl::string_view peer);

 private:
  OwnerOnlySocket(std::string path, grpc::Server* server, std::string what, std::string purpose)
      : path_(std::move(path)),
        server_(server),
        what_(std::move(what)),
        purpose_(std::move(purpose)) {}
  absl::Status Open();
  void Loop();

  const std::string path_;
  grpc::Server* const server_;
  const std::string what_;
  const std::string purpose_;
  int listen_ = -1;
  dev_t bound_dev_ = 0;
  ino_t bound_ino_ = 0;
  int wake_ = -1;
  std::thread thread_;
  absl::Mutex mu_;
  std::map<int, Peer> by_fd_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_RPC_OWNER_ONLY_SOCKET_H_
