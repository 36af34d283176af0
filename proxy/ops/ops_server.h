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
// Served by civetweb (the library prometheus-cpp serves with) on two
// threads; the checks are called on them and must be quick.
#ifndef DPPROXY_PROXY_OPS_OPS_SERVER_H_
#define DPPROXY_PROXY_OPS_OPS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "proxy/server/status_model.h"

class CivetServer;

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
  // Listens on `address` ("127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464";
  // port 0 picks a free one). kUnavailable naming the address if it
  // cannot.
  static absl::StatusOr<std::unique_ptr<OpsServer>> Start(const std::string& address,
                                                          OpsHandlers handlers);
  ~OpsServer();  // stops serving; calls in progress finish first

  OpsServer(const OpsServer&) = delete;
  OpsServer& operator=(const OpsServer&) = delete;

  // The port it listens on.
  int port() const { return port_; }

 private:
  class Handler;
  explicit OpsServer(OpsHandlers handlers);

  const OpsHandlers handlers_;
  std::vector<std::unique_ptr<Handler>> routes_;
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_OPS_OPS_SERVER_H_
