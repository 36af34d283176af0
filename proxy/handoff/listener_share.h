// File: listener_share.h
//
// The HTTP listener (metrics and probes) handed from a running dpproxy to
// the one taking over from it, so that the same address answers
// throughout and the new one never has to bind a port the old one holds.
//
// The running dpproxy serves <state_dir>/handoff.<G>.http.sock (0600) next
// to its handoff socket. A process of the same user that connects and
// sends "LISTENER\n" gets one byte, 'L', carrying a duplicate of the
// listening socket (SCM_RIGHTS); anything else gets "ERR <why>\n". Both
// processes then accept on the one socket until the old one exits, so no
// connection is refused in between.
//
//   // The running dpproxy:
//   auto share = ListenerShare::Start(HandoffListenerSocket(dir, 0), ops->listener_fd());
//   // The new one, before it asks for the state:
//   absl::StatusOr<int> fd = ReceiveListener(HandoffListenerSocket(dir, 0), absl::Seconds(2));
#ifndef DPPROXY_PROXY_HANDOFF_LISTENER_SHARE_H_
#define DPPROXY_PROXY_HANDOFF_LISTENER_SHARE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dpproxy {

// <state_dir>/handoff.<generation>.sock and .http.sock.
std::string HandoffSocketPath(const std::string& state_dir, int generation);
std::string HandoffListenerSocket(const std::string& state_dir, int generation);

class ListenerShare {
 public:
  // Serves `socket` (a stale file there is replaced). `listener_fd` stays
  // the caller's and must outlive the share.
  static absl::StatusOr<std::unique_ptr<ListenerShare>> Start(const std::string& socket,
                                                              int listener_fd);
  ~ListenerShare();  // stops serving and removes the socket

  ListenerShare(const ListenerShare&) = delete;
  ListenerShare& operator=(const ListenerShare&) = delete;

 private:
  ListenerShare() = default;
  void Serve();
  void Answer(int conn);

  std::string socket_;
  int listener_fd_ = -1;
  int unix_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: written to stop
  std::thread thread_;
};

// Asks the dpproxy serving `socket` for its HTTP listener: the descriptor
// (close-on-exec, the caller's), kNotFound if no socket is there,
// kUnavailable if nothing answers or it refuses (naming why).
absl::StatusOr<int> ReceiveListener(const std::string& socket, absl::Duration timeout);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HANDOFF_LISTENER_SHARE_H_
