#include "proxy/kube/kube_client.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "proxy/kube/https_loader.h"
#include "proxy/kube/json_shape.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

absl::StatusCode CodeFor(int http) {
  switch (http) {
    case 400:
    case 422: return absl::StatusCode::kInvalidArgument;
    case 401: return absl::StatusCode::kUnauthenticated;
    case 403: return absl::StatusCode::kPermissionDenied;
    case 404: return absl::StatusCode::kNotFound;
    case 409: return absl::StatusCode::kAlreadyExists;  // or a conflict: see below
    case 429: return absl::StatusCode::kResourceExhausted;
    default: return http >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
}

// The API server's URL in parts: https://host:port/prefix.
struct ServerUrl {
  bool https = true;
  std::string host;
  int port = 443;
  std::string prefix;  // "" or "/prefix", put before every path
};

absl::StatusOr<ServerUrl> ParseServer(const std::string& server) {
  ServerUrl u;
  absl::string_view rest = server;
  if (absl::ConsumePrefix(&rest, "https://")) {
    u.https = true;
    u.port = 443;
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    u.https = false;
    u.port = 80;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("API server \"", server, "\" is not an http(s) URL"));
  }
  const size_t slash = rest.find('/');
  absl::string_view host_port = rest.substr(0, slash);
  if (slash != absl::string_view::npos) u.prefix = std::string(rest.substr(slash));
  absl::string_view port;
  if (absl::ConsumePrefix(&host_port, "[")) {  // [IPv6]:port
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("API server \"", server, "\": no ]"));
    }
    u.host = std::string(host_port.substr(0, close));
    host_port.remove_prefix(close + 1);
    if (absl::ConsumePrefix(&host_port, ":")) port = host_port;
  } else {
    const size_t colon = host_port.rfind(':');
    u.host = std::string(host_port.substr(0, colon));
    if (colon != absl::string_view::npos) port = host_port.substr(colon + 1);
  }
  if (!port.empty() && (!absl::SimpleAtoi(port, &u.port) || u.port <= 0 || u.port > 65535)) {
    return absl::InvalidArgumentError(
        absl::StrCat("API server \"", server, "\": the port is not a number from 1 to 65535"));
  }
  if (u.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("API server \"", server, "\" has no host"));
  }
  return u;
}

}  // namespace

KubeClient::KubeClient(KubeConfig config, absl::Duration timeout, const https::Module* https)
    : config_(std::move(config)), timeout_(timeout), https_(https) {
  // What every call's exchange shares, from the configuration Create checked.
  const ServerUrl u = *ParseServer(config_.server);
  base_.https = u.https;
  base_.host = u.host;
  base_.port = u.port;
  base_.path = u.prefix;  // each call's path goes after it
  base_.tls.insecure = config_.insecure;
  base_.tls.ca_data = config_.ca_data;
  base_.tls.ca_file = config_.ca_file;
  base_.tls.cert_data = config_.client_cert_data;
  base_.tls.key_data = config_.client_key_data;
  base_.tls.cert_file = config_.client_cert_file;
  base_.tls.key_file = config_.client_key_file;
  base_.timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout_));
}

absl::StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(KubeConfig config,
                                                               absl::Duration timeout) {
  if (config.server.empty()) return absl::InvalidArgumentError("no API server address");
  if (absl::StatusOr<ServerUrl> u = ParseServer(config.server); !u.ok()) return u.status();
  if (absl::StartsWith(config.server, "https://") && config.ca_file.empty() &&
      config.ca_data.empty() && !config.insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no CA to verify ", config.server, " (", config.source,
        "): give certificate-authority(-data); insecure-skip-tls-verify is never assumed"));
  }
  const bool cert = !config.client_cert_file.empty() || !config.client_cert_data.empty();
  const bool key = !config.client_key_file.empty() || !config.client_key_data.empty();
  if (cert != key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a client certificate needs its key and the other way round (", config.source, ")"));
  }
  config.server = std::string(absl::StripSuffix(config.server, "/"));
  absl::StatusOr<const https::Module*> module = HttpsModule();
  if (!module.ok()) return module.status();
  if (!config.ca_data.empty() && !(*module)->has_certificate(config.ca_data)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificate-authority-data holds no PEM certificate (", config.source, ")"));
  }
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(config), timeout, *module));
}

absl::StatusOr<KubeClient::Json> KubeClient::Get(const std::string& path) {
  return Call("GET", path, nullptr);
}
absl::StatusOr<KubeClient::Json> KubeClient::Post(const std::string& path, const Json& body) {
  return Call("POST", path, &body);
}
absl::StatusOr<KubeClient::Json> KubeClient::Put(const std::string& path, const Json& body) {
  return Call("PUT", path, &body);
}
absl::StatusOr<KubeClient::Json> KubeClient::Delete(const std::string& path) {
  return Call("DELETE", path, nullptr);
}

absl::StatusOr<KubeClient::Json> KubeClient::FromAnswer(const std::string& what,
                                                        const https::Answer& answer) {
  const std::string& response = answer.body;
  const int http = answer.status;
  absl::StatusOr<Json> parsed = ParseAnswer(response);
  if (http >= 200 && http < 300) {
    if (response.empty()) return Json::object();
    if (!parsed.ok()) {
      return absl::InternalError(absl::StrCat(what, ": the API server answered ", http,
                                              " with a body that is ",
                                              parsed.status().message()));
    }
    return *std::move(parsed);
  }
  const Json j = parsed.ok() ? *std::move(parsed) : Json();
  // A Kubernetes Status object says why; a conflict (409 with reason
  // Conflict) is a stale resourceVersion, not an existing object.
  std::string reason, message;
  if (j.is_object()) {
    if (j.contains("reason") && j["reason"].is_string()) reason = j["reason"];
    if (j.contains("message") && j["message"].is_string()) message = j["message"];
  }
  absl::StatusCode code = CodeFor(http);
  if (http == 409 && reason == "Conflict") code = absl::StatusCode::kAborted;
  return absl::Status(code, absl::StrCat(what, ": HTTP ", http,
                                         reason.empty() ? "" : absl::StrCat(" ", reason),
                                         message.empty() ? "" : absl::StrCat(": ", message)));
}

absl::StatusOr<https::Answer> KubeClient::Exchange(const char* method, const std::string& path,
                                                   const Json* body, const char* accept) {
  const std::string what = absl::StrCat(method, " ", path);
  std::string token = config_.token;
  if (!config_.token_file.empty()) {
    // Read at every call: projected service-account tokens are rotated.
    absl::StatusOr<std::string> t = ReadFile(config_.token_file);
    if (!t.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat(what, ": cannot read the token: ", t.status().message()));
    }
    token = std::string(absl::StripAsciiWhitespace(*t));
  }
  https::Request req = base_;
  req.method = method;
  req.path += path;
  req.headers = {{"Accept", accept}};
  if (!token.empty()) req.headers.emplace_back("Authorization", absl::StrCat("Bearer ", token));
  if (body != nullptr) {
    req.body = body->dump();
    req.headers.emplace_back("Content-Type", "application/json");
  }
  req.max_body_bytes = max_body_bytes_;
  req.cancelled = &cancelled_;
  https::Answer answer;
  https_->exchange(req, &answer);
  switch (answer.outcome) {
    case https::Answer::Outcome::kAnswered: break;
    case https::Answer::Outcome::kTooLong:
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": the API server's answer is over ", max_body_bytes_ >> 20,
          " MiB (limits.api_body_mib); not read"));
    case https::Answer::Outcome::kLate:
      return absl::DeadlineExceededError(absl::StrCat(what, " at ", config_.server,
                                                      ": no whole answer within ",
                                                      absl::FormatDuration(timeout_)));
    case https::Answer::Outcome::kBadCredentials:
      return absl::UnauthenticatedError(
          absl::StrCat(what, ": ", answer.error, " (", config_.source, ")"));
    case https::Answer::Outcome::kTransport:
      return absl::UnavailableError(absl::StrCat(what, " at ", config_.server, ": ", answer.error));
  }
  return answer;
}

absl::StatusOr<KubeClient::Json> KubeClient::Call(const char* method, const std::string& path,
                                                  const Json* body) {
  absl::StatusOr<https::Answer> answer = Exchange(method, path, body, "application/json");
  if (!answer.ok()) return answer.status();
  return FromAnswer(absl::StrCat(method, " ", path), *answer);
}

absl::StatusOr<std::string> KubeClient::GetText(const std::string& path) {
  absl::StatusOr<https::Answer> answer = Exchange("GET", path, nullptr, "text/plain");
  if (!answer.ok()) return answer.status();
  if (answer->status >= 200 && answer->status < 300) return std::move(answer->body);
  return FromAnswer(absl::StrCat("GET ", path), *answer).status();
}

}  // namespace dpproxy
