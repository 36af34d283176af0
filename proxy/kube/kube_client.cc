#include "proxy/kube/kube_client.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
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

// PEM text as OpenSSL objects (owned by the caller or handed on).
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
std::unique_ptr<BIO, BioFree> PemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate of a PEM bundle in a new store; nullptr if none.
X509_STORE* StoreOf(const std::string& pem) {
  auto bio = PemBio(pem);
  X509_STORE* store = X509_STORE_new();
  int n = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    n += X509_STORE_add_cert(store, cert) == 1 ? 1 : 0;
    X509_free(cert);
  }
  if (n == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

std::string TransportError(httplib::Error e, long verify_result) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::ConnectionTimeout: return "no connection within the call's limit";
    case httplib::Error::Read: return "the connection ended while reading the answer";
    case httplib::Error::Write: return "the connection ended while sending the request";
    case httplib::Error::SSLConnection: return "TLS handshake failed";
    case httplib::Error::SSLLoadingCerts: return "cannot load the CA or client certificate";
    case httplib::Error::SSLServerVerification:
      return absl::StrCat("the server's certificate is not trusted: ",
                          X509_verify_cert_error_string(verify_result));
    default: return absl::StrCat("transport error ", httplib::to_string(e));
  }
}

}  // namespace

KubeClient::KubeClient(KubeConfig config, absl::Duration timeout)
    : config_(std::move(config)), timeout_(timeout) {}

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
  if (!config.ca_data.empty()) {
    X509_STORE* store = StoreOf(config.ca_data);
    if (store == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "certificate-authority-data holds no PEM certificate (", config.source, ")"));
    }
    X509_STORE_free(store);
  }
  return std::unique_ptr<KubeClient>(new KubeClient(std::move(config), timeout));
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

absl::StatusOr<KubeClient::Json> KubeClient::Call(const char* method, const std::string& path,
                                                  const Json* body) {
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
  const ServerUrl u = *ParseServer(config_.server);  // checked by Create
  std::unique_ptr<httplib::ClientImpl> client;
  httplib::SSLClient* tls = nullptr;
  if (u.https) {
    std::unique_ptr<httplib::SSLClient> c;
    if (!config_.client_cert_data.empty()) {
      X509* cert = PEM_read_bio_X509(PemBio(config_.client_cert_data).get(), nullptr, nullptr,
                                     nullptr);
      EVP_PKEY* key = PEM_read_bio_PrivateKey(PemBio(config_.client_key_data).get(), nullptr,
                                              nullptr, nullptr);
      if (cert == nullptr || key == nullptr) {
        X509_free(cert);
        EVP_PKEY_free(key);
        return absl::UnauthenticatedError(absl::StrCat(
            what, ": the client certificate or key is not PEM (", config_.source, ")"));
      }
      c = std::make_unique<httplib::SSLClient>(u.host, u.port, cert, key);
      X509_free(cert);  // the client's SSL context holds its own references
      EVP_PKEY_free(key);
    } else if (!config_.client_cert_file.empty()) {
      c = std::make_unique<httplib::SSLClient>(u.host, u.port, config_.client_cert_file,
                                               config_.client_key_file);
    } else {
      c = std::make_unique<httplib::SSLClient>(u.host, u.port);
    }
    if (!c->is_valid()) {
      return absl::UnauthenticatedError(absl::StrCat(
          what, ": cannot load the client certificate and key (", config_.source, ")"));
    }
    c->enable_server_certificate_verification(!config_.insecure);
    if (!config_.insecure && !config_.ca_data.empty()) {
      c->set_ca_cert_store(StoreOf(config_.ca_data));  // the client owns it
    } else if (!config_.insecure && !config_.ca_file.empty()) {
      c->set_ca_cert_path(config_.ca_file);
    }
    tls = c.get();
    client = std::move(c);
  } else {
    client = std::make_unique<httplib::ClientImpl>(u.host, u.port);
  }
  const absl::Time deadline = absl::Now() + timeout_;
  const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout_));
  client->set_connection_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_read_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_write_timeout(ms / 1000, (ms % 1000) * 1000);
  client->set_keep_alive(false);
  client->set_follow_location(false);
  httplib::Request req;
  req.method = method;
  req.path = u.prefix + path;
  req.headers = {{"Accept", "application/json"}};
  if (!token.empty()) req.headers.emplace("Authorization", absl::StrCat("Bearer ", token));
  if (body != nullptr) {
    req.body = body->dump();
    req.headers.emplace("Content-Type", "application/json");
  }
  // The answer, up to max_body_bytes_, within the call's limit.
  std::string response;
  bool over = false, late = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (response.size() + n > max_body_bytes_) {
      over = true;
      return false;
    }
    if (absl::Now() > deadline) {
      late = true;
      return false;
    }
    response.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client->send(req, res, error);
  if (over) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the API server's answer is over ", max_body_bytes_ >> 20,
        " MiB (limits.api_body_mib); not read"));
  }
  if (late) {
    return absl::DeadlineExceededError(absl::StrCat(what, " at ", config_.server,
                                                    ": no whole answer within ",
                                                    absl::FormatDuration(timeout_)));
  }
  if (!sent) {
    return absl::UnavailableError(
        absl::StrCat(what, " at ", config_.server, ": ",
                     TransportError(error, tls != nullptr ? tls->get_openssl_verify_result() : 0)));
  }
  const int http = res.status;
  Json j = Json::parse(response, nullptr, /*allow_exceptions=*/false);
  if (http >= 200 && http < 300) {
    if (response.empty()) return Json::object();
    if (j.is_discarded()) {
      return absl::InternalError(absl::StrCat(what, ": the API server answered ", http,
                                              " with a body that is not JSON"));
    }
    DropNulls(&j);
    return j;
  }
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

}  // namespace dpproxy
