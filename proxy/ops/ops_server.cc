#include "proxy/ops/ops_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <glog/logging.h>

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "prometheus/text_serializer.h"

namespace dpproxy {

namespace {

bool HasVerbose(absl::string_view query) {
  for (absl::string_view part : absl::StrSplit(query, '&')) {
    if (part == "verbose" || absl::StartsWith(part, "verbose=")) return true;
  }
  return false;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
  }
}

std::string UvError(int code) { return uv_strerror(code); }

// The address `fd` is bound to, as "host:port" and HostPort.
absl::StatusOr<HostPort> BoundAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("getsockname: ", std::strerror(errno)));
  }
  char host[INET6_ADDRSTRLEN] = {0};
  HostPort hp;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    hp.port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    hp.port = ntohs(in6->sin6_port);
  } else {
    return absl::InvalidArgumentError("not a TCP socket");
  }
  hp.host = host;
  return hp;
}

// Whether the address listening socket `fd` is bound to is held in this
// process's network namespace: binding it here fails with EADDRINUSE only
// if so. A socket handed over by a dpproxy in another namespace (another
// pod of the DaemonSet) listens where connections to this pod's address
// never arrive; its address is free here.
bool BoundInThisNetworkNamespace(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  const int probe = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return false;
  const int one = 1;
  ::setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool held = ::bind(probe, reinterpret_cast<const sockaddr*>(&ss), len) != 0 &&
                    errno == EADDRINUSE;
  ::close(probe);
  return held;
}

// Whether two IP literals name the same address ("::1" and "0:0::1").
bool SameHost(const std::string& a, const std::string& b) {
  unsigned char x[16], y[16];
  if (::inet_pton(AF_INET, a.c_str(), x) == 1 && ::inet_pton(AF_INET, b.c_str(), y) == 1) {
    return std::memcmp(x, y, 4) == 0;
  }
  if (::inet_pton(AF_INET6, a.c_str(), x) == 1 && ::inet_pton(AF_INET6, b.c_str(), y) == 1) {
    return std::memcmp(x, y, 16) == 0;
  }
  return false;
}

}  // namespace

ProbeAnswer AnswerProbe(const std::string& probe, const std::vector<HealthCheck>& checks,
                        bool verbose) {
  bool ok = true;
  for (const HealthCheck& c : checks) ok = ok && c.ok;
  ProbeAnswer a;
  a.http_status = ok ? 200 : 500;
  if (ok && !verbose) {
    a.body = "ok";
    return a;
  }
  for (const HealthCheck& c : checks) {
    absl::StrAppend(&a.body, c.ok ? "[+]" : "[-]", c.name,
                    c.ok ? (c.reason.empty() ? std::string(" ok") : absl::StrCat(" ok: ", c.reason))
                         : absl::StrCat(" failed: ", c.reason),
                    "\n");
  }
  absl::StrAppend(&a.body, probe, ok ? " check passed" : " check failed", "\n");
  return a;
}

// Everything the loop thread owns. Connections are created and destroyed
// on it; Start and the destructor touch it only before the thread runs and
// after it ended (the stop is an async handle).
struct OpsServer::Loop {
  struct Conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    Loop* loop = nullptr;
    std::string in;
    char buf[4096];
    bool answered = false;
    bool closing = false;
    int open_handles = 0;
    uint64_t seq = 0;  // accept order
  };
  struct Write {
    uv_write_t req;
    uv_shutdown_t shutdown;
    std::string data;
    Conn* conn = nullptr;
  };

  Loop(OpsHandlers h, const Options& o) : handlers(std::move(h)), options(o) {}

  OpsHandlers handlers;
  const Options options;
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop;
  uv_async_t accept;  // Accept(): start taking connections
  // Stopping: the connections already accepted are answered first (their
  // request may still be on its way), for at most kDrain.
  uv_timer_t drain;
  bool stopping = false;
  bool finished = false;
  static constexpr uint64_t kDrainMs = 1000;
  bool listening = false;
  std::set<Conn*> conns;
  // The connections whose request has not come yet, oldest first: past
  // max_connections the oldest of them makes room for the new one, so
  // that clients holding connections open can never keep a probe out.
  std::map<uint64_t, Conn*> waiting;
  uint64_t accepted = 0;

  static void OnConnection(uv_stream_t* server, int status) {
    Loop* self = static_cast<Loop*>(server->data);
    if (status < 0) return;
    auto* c = new Conn();
    c->loop = self;
    uv_tcp_init(&self->loop, &c->tcp);
    uv_timer_init(&self->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    self->conns.insert(c);
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0) {
      self->Close(c);
      return;
    }
    if (static_cast<int>(self->conns.size()) > self->options.max_connections) {
      if (self->waiting.empty()) {
        // Every other connection is being answered: it is gone soon.
        self->Respond(c, 503, "too many connections\n", false);
        return;
      }
      self->Close(self->waiting.begin()->second);
    }
    c->seq = ++self->accepted;
    self->waiting.emplace(c->seq, c);
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), &Loop::OnAlloc, &Loop::OnRead);
    uv_timer_start(&c->timer, &Loop::OnTimeout,
                   static_cast<uint64_t>(absl::ToInt64Milliseconds(self->options.request_timeout)),
                   0);
  }

  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    Conn* c = static_cast<Conn*>(h->data);
    *buf = uv_buf_init(c->buf, sizeof(c->buf));
  }

  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    Conn* c = static_cast<Conn*>(s->data);
    Loop* self = c->loop;
    if (n < 0) {
      self->Close(c);
      return;
    }
    if (c->answered) return;
    c->in.append(buf->base, static_cast<size_t>(n));
    size_t end = c->in.find("\r\n\r\n");
    if (end == std::string::npos) end = c->in.find("\n\n");
    if (end == std::string::npos) {
      if (c->in.size() > self->options.max_request_bytes) {
        self->Respond(c, 431, absl::StrCat("the request is longer than ",
                                           self->options.max_request_bytes, " bytes\n"),
                      false);
      }
      return;
    }
    if (end > self->options.max_request_bytes) {
      self->Respond(c, 431, absl::StrCat("the request is longer than ",
                                         self->options.max_request_bytes, " bytes\n"),
                    false);
      return;
    }
    self->Handle(c);
  }

  static void OnTimeout(uv_timer_t* t) {
    Conn* c = static_cast<Conn*>(t->data);
    c->loop->Respond(c, 408, "the request did not arrive in time\n", false);
  }

  void Handle(Conn* c) {
    absl::string_view head(c->in);
    head = head.substr(0, head.find('\n'));
    if (absl::EndsWith(head, "\r")) head.remove_suffix(1);
    std::vector<absl::string_view> parts = absl::StrSplit(head, ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
      Respond(c, 400, "not an HTTP/1 request line\n", false);
      return;
    }
    const bool head_only = parts[0] == "HEAD";
    if (parts[0] != "GET" && !head_only) {
      Respond(c, 405, "GET or HEAD only\n", false);
      return;
    }
    absl::string_view target = parts[1];
    absl::string_view query;
    if (size_t q = target.find('?'); q != absl::string_view::npos) {
      query = target.substr(q + 1);
      target = target.substr(0, q);
    }
    if (target == "/metrics") {
      std::vector<prometheus::MetricFamily> families;
      for (const auto& m : handlers.metrics) {
        for (auto& f : m->Collect()) families.push_back(std::move(f));
      }
      Respond(c, 200, prometheus::TextSerializer().Serialize(families), head_only,
              "text/plain; version=0.0.4; charset=utf-8");
      return;
    }
    std::string probe;
    const std::function<std::vector<HealthCheck>()>* checks = nullptr;
    if (target == "/livez" || target == "/healthz") {
      probe = std::string(target.substr(1));
      checks = &handlers.live;
    } else if (target == "/readyz") {
      probe = "readyz";
      checks = &handlers.ready;
    } else {
      Respond(c, 404, "not found: /metrics, /livez, /healthz and /readyz are served\n",
              head_only);
      return;
    }
    const ProbeAnswer a =
        AnswerProbe(probe, *checks ? (*checks)() : std::vector<HealthCheck>(), HasVerbose(query));
    Respond(c, a.http_status, a.body, head_only);
  }

  void Respond(Conn* c, int status, const std::string& body, bool head_only,
               const char* content_type = "text/plain; charset=utf-8") {
    if (c->answered || c->closing) return;
    c->answered = true;
    waiting.erase(c->seq);
    uv_timer_stop(&c->timer);
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->tcp));
    auto* w = new Write();
    w->conn = c;
    w->data = absl::StrCat("HTTP/1.1 ", status, " ", Reason(status),
                           "\r\nContent-Type: ", content_type,
                           "\r\nContent-Length: ", body.size(),
                           "\r\nCache-Control: no-store\r\nConnection: close\r\n",
                           status == 405 ? "Allow: GET, HEAD\r\n" : "", "\r\n");
    if (!head_only) w->data += body;
    w->req.data = w;
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned int>(w->data.size()));
    if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&c->tcp), &buf, 1, &Loop::OnWritten) !=
        0) {
      delete w;
      Close(c);
    }
  }

  static void OnWritten(uv_write_t* req, int status) {
    auto* w = static_cast<Write*>(req->data);
    Conn* c = w->conn;
    if (status < 0 || c->closing) {
      delete w;
      c->loop->Close(c);
      return;
    }
    // Half-close, so the client reads the whole answer, then close.
    w->shutdown.data = w;
    if (uv_shutdown(&w->shutdown, reinterpret_cast<uv_stream_t*>(&c->tcp), &Loop::OnShutdown) !=
        0) {
      delete w;
      c->loop->Close(c);
    }
  }

  static void OnShutdown(uv_shutdown_t* req, int) {
    auto* w = static_cast<Write*>(req->data);
    Conn* c = w->conn;
    delete w;
    c->loop->Close(c);
  }

  void Close(Conn* c) {
    if (c->closing) return;
    c->closing = true;
    conns.erase(c);
    waiting.erase(c->seq);
    auto closed = [](uv_handle_t* h) {
      Conn* conn = static_cast<Conn*>(h->data);
      if (--conn->open_handles == 0) delete conn;
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->timer), closed);
    if (stopping && conns.empty()) Finish();
  }

  // No new connection from here on; those accepted are answered (a probe
  // this process took just before a handover stopped it gets its answer,
  // and the successor, which shares the listener, takes the next ones).
  // Whatever has not sent its request within kDrainMs is closed.
  static void OnStop(uv_async_t* a) {
    Loop* self = static_cast<Loop*>(a->data);
    if (self->stopping) return;
    self->stopping = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&self->listener), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&self->accept), nullptr);
    if (self->conns.empty()) {
      self->Finish();
      return;
    }
    uv_timer_start(&self->drain, &Loop::OnDrained, kDrainMs, 0);
  }

  static void OnDrained(uv_timer_t* t) {
    Loop* self = static_cast<Loop*>(t->data);
    const std::set<Conn*> open = self->conns;
    for (Conn* c : open) self->Close(c);  // the last one finishes
  }

  // The loop's own handles go: uv_run returns once every connection has.
  void Finish() {
    if (finished) return;
    finished = true;
    uv_timer_stop(&drain);
    uv_close(reinterpret_cast<uv_handle_t*>(&drain), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&stop), nullptr);
  }

  static void OnAccept(uv_async_t* a) {
    Loop* self = static_cast<Loop*>(a->data);
    if (self->listening) return;
    if (int rc = self->Listen(); rc != 0) {
      LOG(ERROR) << "the HTTP listener handed over cannot be served: " << UvError(rc);
    }
  }

  int Listen() {
    const int rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener), SOMAXCONN,
                             &Loop::OnConnection);
    listening = rc == 0;
    return rc;
  }

  // Closes what Start opened and runs the loop until it is (on failure,
  // before the thread).
  void Abandon() {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
};

absl::Status OpsServer::AdoptListener(Loop* l, const HostPort& hp, const std::string& address,
                                      const Options& options) {
  // Handed over: it must be a listening TCP socket on this very address.
  int listening = 0;
  socklen_t len = sizeof(listening);
  absl::StatusOr<HostPort> bound = BoundAddress(options.listener_fd);
  std::string why;
  if (::getsockopt(options.listener_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
      !listening) {
    why = "the socket handed over does not listen";
  } else if (!bound.ok()) {
    why = absl::StrCat("the socket handed over: ", bound.status().message());
  } else if (!SameHost(bound->host, hp.host) || (hp.port != 0 && bound->port != hp.port)) {
    why = absl::StrCat("the socket handed over listens on ", bound->host, " port ",
                       bound->port, ", not on this address");
  } else if (!BoundInThisNetworkNamespace(options.listener_fd)) {
    ::close(options.listener_fd);
    l->Abandon();
    return absl::FailedPreconditionError(absl::StrCat(
        "the HTTP listener handed over is in another network namespace (the running "
        "dpproxy is in another pod), where ", address, " of this one is free"));
  } else if (int rc = uv_tcp_open(&l->listener, options.listener_fd); rc != 0) {
    why = UvError(rc);
  }
  if (!why.empty()) {
    ::close(options.listener_fd);
    l->Abandon();
    return Unavailable(address, why);
  }
  return absl::OkStatus();
}

absl::Status OpsServer::BindListener(Loop* l, const HostPort& hp, const std::string& address) {
  sockaddr_storage addr{};
  const bool v6 = hp.host.find(':') != std::string::npos;
  const int rc = v6 ? uv_ip6_addr(hp.host.c_str(), hp.port,
                                  reinterpret_cast<sockaddr_in6*>(&addr))
                    : uv_ip4_addr(hp.host.c_str(), hp.port,
                                  reinterpret_cast<sockaddr_in*>(&addr));
  const int bound = rc != 0 ? rc
                            : uv_tcp_bind(&l->listener, reinterpret_cast<sockaddr*>(&addr),
                                          v6 ? UV_TCP_IPV6ONLY : 0);
  if (bound != 0) {
    l->Abandon();
    return Unavailable(address, UvError(bound));
  }
  return absl::OkStatus();
}

absl::Status OpsServer::Unavailable(const std::string& address, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat("cannot serve HTTP at ", address, ": ", why));
}

absl::StatusOr<std::unique_ptr<OpsServer>> OpsServer::Start(const std::string& address,
                                                            OpsHandlers handlers,
                                                            const Options& options) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) {
    if (options.listener_fd >= 0) ::close(options.listener_fd);
    return hp.status();
  }
  std::unique_ptr<OpsServer> s(new OpsServer());
  s->loop_ = std::make_unique<Loop>(std::move(handlers), options);
  Loop* l = s->loop_.get();
  uv_loop_init(&l->loop);
  uv_tcp_init(&l->loop, &l->listener);
  l->listener.data = l;
  if (absl::Status st = options.listener_fd >= 0 ? AdoptListener(l, *hp, address, options)
                                                 : BindListener(l, *hp, address);
      !st.ok()) {
    return st;
  }
  // A socket handed over listens already (the kernel queues connections
  // for whichever process accepts): with accept_later this one takes none
  // until Accept().
  const bool later = options.accept_later && options.listener_fd >= 0;
  if (int rc = later ? 0 : l->Listen(); rc != 0) {
    l->Abandon();
    return Unavailable(address, UvError(rc));
  }
  uv_os_fd_t fd = -1;
  uv_fileno(reinterpret_cast<uv_handle_t*>(&l->listener), &fd);
  s->listener_fd_ = fd;
  s->deferred_ = later;
  absl::StatusOr<HostPort> bound = BoundAddress(fd);
  s->port_ = bound.ok() ? bound->port : 0;
  uv_async_init(&l->loop, &l->stop, &Loop::OnStop);
  l->stop.data = l;
  uv_async_init(&l->loop, &l->accept, &Loop::OnAccept);
  l->accept.data = l;
  uv_timer_init(&l->loop, &l->drain);
  l->drain.data = l;
  s->thread_ = std::thread([l] {
    // A client that went away makes a write fail with EPIPE; the signal it
    // raises stays pending on this thread instead of ending the process.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    uv_run(&l->loop, UV_RUN_DEFAULT);
  });
  return s;
}

void OpsServer::Accept() {
  if (accept_asked_.exchange(true)) return;
  uv_async_send(&loop_->accept);
}

OpsServer::~OpsServer() {
  if (!thread_.joinable()) return;
  uv_async_send(&loop_->stop);
  thread_.join();
  uv_loop_close(&loop_->loop);
}

}  // namespace dpproxy
