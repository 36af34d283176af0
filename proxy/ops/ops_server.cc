#include "proxy/ops/ops_server.h"

#include <CivetServer.h>
#include <civetweb.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/text_serializer.h"

namespace dpproxy {

namespace {

bool HasVerbose(const char* query) {
  if (query == nullptr) return false;
  for (absl::string_view part : absl::StrSplit(query, '&')) {
    if (part == "verbose" || absl::StartsWith(part, "verbose=")) return true;
  }
  return false;
}

void Send(mg_connection* conn, int status, const char* content_type, const std::string& body) {
  const char* reason = status == 200 ? "OK" : status == 405 ? "Method Not Allowed"
                                                            : "Internal Server Error";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            status, reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
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
                    c.ok ? " ok" : absl::StrCat(" failed: ", c.reason), "\n");
  }
  absl::StrAppend(&a.body, probe, ok ? " check passed" : " check failed", "\n");
  return a;
}

// One route: a probe over its checks, or the metrics.
class OpsServer::Handler : public CivetHandler {
 public:
  Handler(std::string probe, std::function<std::vector<HealthCheck>()> checks)
      : probe_(std::move(probe)), checks_(std::move(checks)) {}
  explicit Handler(const std::vector<std::shared_ptr<prometheus::Collectable>>* metrics)
      : metrics_(metrics) {}

  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (metrics_ != nullptr) {
      std::vector<prometheus::MetricFamily> families;
      for (const auto& c : *metrics_) {
        for (auto& f : c->Collect()) families.push_back(std::move(f));
      }
      Send(conn, 200, "text/plain; version=0.0.4; charset=utf-8",
           prometheus::TextSerializer().Serialize(families));
      return true;
    }
    const mg_request_info* info = mg_get_request_info(conn);
    const ProbeAnswer a = AnswerProbe(probe_, checks_ ? checks_() : std::vector<HealthCheck>(),
                                      HasVerbose(info->query_string));
    Send(conn, a.http_status, "text/plain; charset=utf-8", a.body);
    return true;
  }
  bool handlePost(CivetServer*, mg_connection* conn) override {
    Send(conn, 405, "text/plain; charset=utf-8", "GET only\n");
    return true;
  }

 private:
  const std::string probe_;
  const std::function<std::vector<HealthCheck>()> checks_;
  const std::vector<std::shared_ptr<prometheus::Collectable>>* metrics_ = nullptr;
};

OpsServer::OpsServer(OpsHandlers handlers) : handlers_(std::move(handlers)) {}

absl::StatusOr<std::unique_ptr<OpsServer>> OpsServer::Start(const std::string& address,
                                                            OpsHandlers handlers) {
  std::unique_ptr<OpsServer> s(new OpsServer(std::move(handlers)));
  try {
    s->server_ = std::make_unique<CivetServer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "2", "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP at ", address, ": ", e.what()));
  }
  const std::vector<int> ports = s->server_->getListeningPorts();
  s->port_ = ports.empty() ? 0 : ports[0];
  auto route = [&s](const std::string& uri, std::unique_ptr<Handler> h) {
    s->server_->addHandler(uri + "$", h.get());  // exact: /livez, not /livez/x
    s->routes_.push_back(std::move(h));
  };
  route("/metrics", std::make_unique<Handler>(&s->handlers_.metrics));
  route("/livez", std::make_unique<Handler>("livez", s->handlers_.live));
  route("/healthz", std::make_unique<Handler>("healthz", s->handlers_.live));
  route("/readyz", std::make_unique<Handler>("readyz", s->handlers_.ready));
  return s;
}

OpsServer::~OpsServer() {
  if (server_) server_->close();  // joins civetweb's threads
}

}  // namespace dpproxy
