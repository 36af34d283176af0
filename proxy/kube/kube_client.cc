#include "proxy/kube/kube_client.h"

#include <curl/curl.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proxy/kube/json_shape.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

// libcurl's global state, once per process, before any thread uses it.
struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

// The answer, up to `max` bytes: a longer one ends the transfer.
struct Body {
  std::string text;
  size_t max = 0;
  bool over = false;
};

size_t Collect(char* data, size_t size, size_t n, void* out) {
  Body* b = static_cast<Body*>(out);
  if (b->text.size() + size * n > b->max) {
    b->over = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  b->text.append(data, size * n);
  return size * n;
}

absl::StatusCode CodeFor(long http) {
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

// Sets a PEM blob option (libcurl copies it).
void SetBlob(CURL* c, CURLoption option, const std::string& pem) {
  struct curl_blob blob;
  blob.data = const_cast<char*>(pem.data());
  blob.len = pem.size();
  blob.flags = CURL_BLOB_COPY;
  curl_easy_setopt(c, option, &blob);
}

}  // namespace

KubeClient::KubeClient(KubeConfig config, absl::Duration timeout)
    : config_(std::move(config)), timeout_(timeout) {}

absl::StatusOr<std::unique_ptr<KubeClient>> KubeClient::Create(KubeConfig config,
                                                               absl::Duration timeout) {
  static CurlGlobal global;
  if (config.server.empty()) return absl::InvalidArgumentError("no API server address");
  if (!absl::StartsWith(config.server, "https://") && !absl::StartsWith(config.server, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("API server \"", config.server, "\" is not an http(s) URL"));
  }
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
  std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
  if (c == nullptr) return absl::InternalError(absl::StrCat(what, ": curl_easy_init failed"));
  CURL* h = c.get();
  const std::string url = config_.server + path;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (config_.insecure) {
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  } else if (!config_.ca_data.empty()) {
    SetBlob(h, CURLOPT_CAINFO_BLOB, config_.ca_data);
  } else if (!config_.ca_file.empty()) {
    curl_easy_setopt(h, CURLOPT_CAINFO, config_.ca_file.c_str());
  }
  if (!config_.client_cert_data.empty()) {
    SetBlob(h, CURLOPT_SSLCERT_BLOB, config_.client_cert_data);
    SetBlob(h, CURLOPT_SSLKEY_BLOB, config_.client_key_data);
  } else if (!config_.client_cert_file.empty()) {
    curl_easy_setopt(h, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
    curl_easy_setopt(h, CURLOPT_SSLKEY, config_.client_key_file.c_str());
  }
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  std::string payload;
  if (body != nullptr) {
    payload = body->dump();
    headers = curl_slist_append(headers, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  }
  const std::string auth = absl::StrCat("Authorization: Bearer ", token);
  if (!token.empty()) headers = curl_slist_append(headers, auth.c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> header_list(headers, curl_slist_free_all);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  Body body_in;
  body_in.max = max_body_bytes_;
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body_in);
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
  const CURLcode rc = curl_easy_perform(h);
  if (body_in.over) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the API server's answer is over ", max_body_bytes_ >> 20,
        " MiB (limits.api_body_mib); not read"));
  }
  const std::string& response = body_in.text;
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(what, " at ", config_.server, ": ",
                                               error[0] != '\0' ? error : curl_easy_strerror(rc)));
  }
  long http = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
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
