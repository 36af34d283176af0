// File: ops_server.h
//
// dpproxy's HTTP endpoints for operators, on the metrics address:
//
//   /metrics   the Prometheus text exposition of the registered collectables
//   /livez     the process serves and its housekeeping thread is not stuck
//   /healthz   the same as /livez (the older name probes still use)
//   /readyz    registered with the kubelet for every resource, and the state
//              writable
//
// A probe answers 200 "ok" when every check passes and 500 otherwise. A
// failing probe, or any probe with `?verbose`, lists each check the way
// the Kubernetes API server does:
//
//   [+]housekeeping ok
//   [-]registered:vendor.com/gpu failed: not registered with the kubelet yet
//   readyz check failed
//
// One event-loop thread (libuv) serves every connection, so a client that
// sends its request slowly, or never, costs a buffer and a timer, not a
// thread: the probes answer at once however many such clients are
// connected. Each connection must deliver its request within
// `request_timeout` (else 408 and closed); at most `max_connections` are
// open at once: one more closes the oldest connection whose request has
// not come yet (clients that hold connections idle, re-opening each as it
// times out, never keep a probe out), or, when every other connection is
// being answered, is answered 503 and closed; a request is at most
// `max_request_bytes` of request line and headers (else 431). One request
// per connection (the answer says Connection: close). The checks and the
// collectables are called on the loop thread and must be quick.
//
//   OpsServer::Options o;
//   auto ops = OpsServer::Start("127.0.0.1:9464", handlers, o);
//   // A dpproxy taking over from this one is given the listening socket
//   // (ListenerShare, handoff.h) and serves it with:
//   o.listener_fd = fd_from_predecessor;
//   auto next = OpsServer::Start("127.0.0.1:9464", handlers, o);
#ifndef DPPROXY_PROXY_OPS_OPS_SERVER_H_
#define DPPROXY_PROXY_OPS_OPS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "proxy/util/health_check.h"
#include "proxy/util/host_port.h"

namespace dpproxy {

struct OpsHandlers {
  std::function<std::vector<HealthCheck>()> live;
  std::function<std::vector<HealthCheck>()> ready;
  std::vector<std::shared_ptr<prometheus::Collectable>> metrics;
};

// The text of a probe's answer and whether it passed (exposed for tests).
struct ProbeAnswer {
  int http_status = 200;
  std::string body;
};
ProbeAnswer AnswerProbe(const std::string& probe, const std::vector<HealthCheck>& checks,
                        bool verbose);

class OpsServer {
 public:
  struct Options {
    absl::Duration request_timeout = absl::Seconds(10);
    int max_connections = 256;
    size_t max_request_bytes = 8192;
    // A listening TCP socket bound to the address already (handed over by
    // the dpproxy this one takes over from); -1: bind one. Start takes it
    // over (closes it on failure too).
    int listener_fd = -1;
    // With listener_fd: take no connection until Accept() (the dpproxy
    // that handed it over answers them meanwhile). A dpproxy taking over
    // accepts once it is live and ready, so that a probe never meets one
    // that is still starting.
    bool accept_later = false;
  };

  // Listens on `address` (ParseHostPort), or serves `options.listener_fd`
  // after checking that it listens on that address. kUnavailable naming
  // the address if it cannot, kInvalidArgument for an address that is not
  // one, kFailedPrecondition for a listener_fd of another network
  // namespace (the address is free here: bind it).
  static absl::StatusOr<std::unique_ptr<OpsServer>> Start(const std::string& address,
                                                          OpsHandlers handlers,
                                                          const Options& options);
  static absl::StatusOr<std::unique_ptr<OpsServer>> Start(const std::string& address,
                                                          OpsHandlers handlers) {
    return Start(address, std::move(handlers), Options());
  }
  ~OpsServer();  // stops serving: open connections are closed

  OpsServer(const OpsServer&) = delete;
  OpsServer& operator=(const OpsServer&) = delete;

  // Starts taking connections (accept_later); at once otherwise, where
  // it does nothing. Thread-safe; once is enough.
  void Accept();
  // Whether connections are taken (or will be: Accept() was called).
  bool accepting() const { return !deferred_ || accept_asked_.load(); }

  // The port it listens on.
  int port() const { return port_; }
  // The listening socket (for ListenerShare); owned by the server.
  int listener_fd() const { return listener_fd_; }

 private:
  struct Loop;
  // Start's two ways to a listener: the one a running dpproxy handed over
  // (a listening TCP socket on this address, in this network namespace),
  // or one bound here.
  static absl::Status AdoptListener(Loop* l, const HostPort& hp, const std::string& address,
                                    const Options& options);
  static absl::Status BindListener(Loop* l, const HostPort& hp, const std::string& address);
  static absl::Status Unavailable(const std::string& address, absl::string_view why);
  OpsServer() = default;

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
  int listener_fd_ = -1;
  bool deferred_ = false;  // accept_later with a socket handed over
  std::atomic<bool> accept_asked_{false};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_OPS_SERVER_H_
