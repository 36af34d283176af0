// File: notify_socket.h
//
// systemd's end of a notify socket, for tests of Type=notify services: a
// real Unix datagram socket whose path goes into NOTIFY_SOCKET; datagrams
// are waited for with a deadline.
#ifndef DPPROXY_TESTS_TESTING_NOTIFY_SOCKET_H_
#define DPPROXY_TESTS_TESTING_NOTIFY_SOCKET_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dpproxy::testing {

class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
  }
  ~NotifySocket() { ::close(fd_); }
  const std::string& path() const { return path_; }

  // The next datagram, or nullopt at the deadline.
  std::optional<std::string> Next(absl::Duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(
        absl::ToInt64Milliseconds(std::max(timeout, absl::ZeroDuration())));  // never -1: forever
    if (::poll(&p, 1, ms) != 1) {
      return std::nullopt;
    }
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }
  // Datagrams until one contains `what` (true) or the deadline (false).
  bool WaitFor(const std::string& what, absl::Duration timeout,
               std::vector<std::string>* seen = nullptr) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      std::optional<std::string> m = Next(deadline - absl::Now());
      if (!m.has_value()) return false;
      if (seen != nullptr) seen->push_back(*m);
      if (absl::StrContains(*m, what)) return true;
    }
  }

 private:
  const std::string path_;
  int fd_ = -1;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_NOTIFY_SOCKET_H_
