#include "proxy/rpc/owner_only_socket.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <glog/logging.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

absl::StatusOr<std::unique_ptr<OwnerOnlySocket>> OwnerOnlySocket::Listen(const std::string& path,
                                                                         grpc::Server* server,
                                                                         std::string what,
                                                                         std::string purpose) {
  std::unique_ptr<OwnerOnlySocket> s(
      new OwnerOnlySocket(path, server, std::move(what), std::move(purpose)));
  if (absl::Status st = s->Open(); !st.ok()) return st;
  s->thread_ = std::thread([raw = s.get()] { raw->Loop(); });
  return s;
}

OwnerOnlySocket::~OwnerOnlySocket() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_ >= 0) {
    ::close(listen_);
    // Only the socket this one bound: another process (a dpproxy taking
    // over) may have bound the path anew since.
    struct stat st;
    if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == bound_dev_ && st.st_ino == bound_ino_) {
      ::unlink(path_.c_str());
    }
  }
  if (wake_ >= 0) ::close(wake_);
}

std::optional<OwnerOnlySocket::Peer> OwnerOnlySocket::PeerOf(absl::string_view peer) {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

absl::Status OwnerOnlySocket::Open() {
  wake_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", ErrnoText(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path_));
  }
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  // A stale socket of a process that died is replaced; anything else is not.
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, " exists and is not a socket; it is left alone"));
    }
    ::unlink(path_.c_str());
  }
  listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_ < 0) return absl::InternalError(absl::StrCat("socket: ", ErrnoText(errno)));
  if (::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_, 16) != 0) {
    const int err = errno;
    ::close(listen_);
    listen_ = -1;
    return absl::UnavailableError(
        absl::StrCat("cannot serve the ", what_, " ", path_, ": ", ErrnoText(err)));
  }
  struct stat bound;
  if (::lstat(path_.c_str(), &bound) == 0) {
    bound_dev_ = bound.st_dev;
    bound_ino_ = bound.st_ino;
  }
  return SetMode(path_, 0600);
}

void OwnerOnlySocket::Loop() {
  NameThisThread("dpp-owner-acc");
  for (;;) {
    pollfd fds[2] = {{listen_, POLLIN, 0}, {wake_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << what_ << " " << path_ << ": poll: " << ErrnoText(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EAGAIN, a connection that went away, EMFILE (logged by none)
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      LOG(WARNING) << what_ << " " << path_ << ": a connection whose credentials "
                   << "cannot be read (" << ErrnoText(errno) << ") is refused";
      ::close(fd);
      continue;
    }
    if (cred.uid != ::geteuid() && cred.uid != 0) {
      LOG(WARNING) << what_ << " " << path_ << ": refused a connection from pid " << cred.pid
                   << " (uid " << cred.uid << "): only this dpproxy's user (uid " << ::geteuid()
                   << ") or root may " << purpose_;
      ::close(fd);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      by_fd_[fd] = Peer{cred.pid, cred.uid};
    }
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns it from here
  }
}

}  // namespace dpproxy
