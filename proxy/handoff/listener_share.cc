#include "proxy/handoff/listener_share.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

namespace {

constexpr char kRequest[] = "LISTENER\n";
// How long one connection may take to send its request.
constexpr int kRequestTimeoutMs = 1000;

absl::StatusOr<sockaddr_un> UnixSockaddr(const std::string& path) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(path));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// One byte with room for one descriptor beside it (SCM_RIGHTS), for
// sendmsg and recvmsg alike. Not copyable: `msg` points into it.
struct FdMessage {
  explicit FdMessage(char b) : byte(b) {
    iov = {&byte, 1};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;

  char byte;
  iovec iov{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
};

void SendText(int fd, const std::string& text) {
  (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
}

}  // namespace

std::string HandoffSocketPath(const std::string& state_dir, int generation) {
  return JoinPath(state_dir, absl::StrCat("handoff.", generation, ".sock"));
}

std::string HandoffListenerSocket(const std::string& state_dir, int generation) {
  return JoinPath(state_dir, absl::StrCat("handoff.", generation, ".http.sock"));
}

absl::StatusOr<std::unique_ptr<ListenerShare>> ListenerShare::Start(const std::string& socket,
                                                                    int listener_fd) {
  absl::StatusOr<sockaddr_un> addr = UnixSockaddr(socket);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<ListenerShare> s(new ListenerShare());
  s->socket_ = socket;
  s->listener_fd_ = listener_fd;
  s->unix_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  s->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (s->unix_fd_ < 0 || s->wake_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", socket, ": ", ErrnoText(errno)));
  }
  ::unlink(socket.c_str());
  if (::bind(s->unix_fd_, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      ::listen(s->unix_fd_, 4) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve ", socket, ": ", ErrnoText(errno)));
  }
  DPP_RETURN_IF_ERROR(SetMode(socket, 0600));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

ListenerShare::~ListenerShare() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    // An eventfd write fails only if the counter would overflow.
    if (::write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
      LOG(WARNING) << "listener share: cannot wake its thread: " << strerror(errno);
    }
    thread_.join();
  }
  if (unix_fd_ >= 0) {
    ::close(unix_fd_);
    ::unlink(socket_.c_str());
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ListenerShare::Serve() {
  for (;;) {
    pollfd fds[2] = {{unix_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "handoff: " << socket_ << ": poll: " << ErrnoText(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = ::accept4(unix_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Answer(conn);
    ::close(conn);
  }
}

void ListenerShare::Answer(int conn) {
  // Only the user dpproxy runs as (the socket's mode says the same; this
  // holds even if the mode was changed).
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != ::geteuid()) {
    LOG(WARNING) << "handoff: " << socket_ << ": refused a process of uid " << peer.uid;
    SendText(conn, "ERR another user\n");
    return;
  }
  // The request, whole, within kRequestTimeoutMs; nothing longer.
  std::string got;
  const size_t want = sizeof(kRequest) - 1;
  while (got.size() < want) {
    pollfd p = {conn, POLLIN, 0};
    if (::poll(&p, 1, kRequestTimeoutMs) <= 0) break;
    char buf[sizeof(kRequest)];
    const ssize_t n = ::recv(conn, buf, want - got.size(), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  if (got != kRequest) {
    LOG(WARNING) << "handoff: " << socket_ << ": refused a request that is not LISTENER";
    SendText(conn, "ERR the only request is LISTENER\n");
    return;
  }
  FdMessage out('L');
  cmsghdr* cmsg = CMSG_FIRSTHDR(&out.msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &listener_fd_, sizeof(int));
  if (::sendmsg(conn, &out.msg, MSG_NOSIGNAL) != 1) {
    LOG(WARNING) << "handoff: " << socket_ << ": cannot send the listener: " << ErrnoText(errno);
    return;
  }
  LOG(INFO) << "handoff: the HTTP listener was handed to pid " << peer.pid;
}

absl::StatusOr<int> ReceiveListener(const std::string& socket, absl::Duration timeout) {
  absl::StatusOr<sockaddr_un> addr = UnixSockaddr(socket);
  if (!addr.ok()) return addr.status();
  if (!PathExists(socket)) {
    return absl::NotFoundError(absl::StrCat("no listener handoff socket at ", socket));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(ErrnoText(errno));
  auto fail = [fd, &socket](const std::string& why) {
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("the HTTP listener from ", socket, ": ", why));
  };
  timeval tv{};
  tv.tv_sec = absl::ToInt64Seconds(timeout);
  tv.tv_usec = absl::ToInt64Microseconds(timeout - absl::Seconds(tv.tv_sec));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return fail(ErrnoText(errno));
  }
  if (::send(fd, kRequest, sizeof(kRequest) - 1, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(kRequest) - 1)) {
    return fail(ErrnoText(errno));
  }
  FdMessage in(0);
  const ssize_t n = ::recvmsg(fd, &in.msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return fail(n == 0 ? "closed without an answer" : ErrnoText(errno));
  int received = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&in.msg); c != nullptr; c = CMSG_NXTHDR(&in.msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(&received, CMSG_DATA(c), sizeof(int));
    }
  }
  if (in.byte == 'L' && received >= 0) {
    ::close(fd);
    return received;
  }
  if (received >= 0) ::close(received);
  std::string text(1, in.byte);
  char buf[128];
  const ssize_t more = ::recv(fd, buf, sizeof(buf), 0);
  if (more > 0) text.append(buf, static_cast<size_t>(more));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  for (char& ch : text) {
    if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
  }
  return fail(absl::StrCat("refused: ", text));
}

}  // namespace dpproxy
