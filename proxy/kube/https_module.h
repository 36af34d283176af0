// File: https_module.h
//
// The one HTTP(S) exchange the Kubernetes API client makes, done by a module
// of its own (dpproxy-https.so: Boost.Beast over OpenSSL) that the client
// loads the first time it is made (https_loader.h). A dpproxy that never
// talks to an API server (device-plugin mode, DRA mode without one) never
// loads TLS libraries, and their start-up cost (about 4 MB resident) is
// not paid.
//
// The module and its callers share these types, so both must come from the
// same build: the module exports its ABI mark (a hash of this file, made at
// build time) and the loader refuses a module whose mark differs.
//
//   extern "C" const char* dpproxy_https_abi();
//   extern "C" const dpproxy::https::Module* dpproxy_https_module();
#ifndef DPPROXY_PROXY_KUBE_HTTPS_MODULE_H_
#define DPPROXY_PROXY_KUBE_HTTPS_MODULE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dpproxy {
namespace https {

// How the server is trusted and how this client proves who it is. PEM text
// (`*_data`) or files; `insecure` skips verifying the server.
struct Tls {
  bool insecure = false;
  std::string ca_data, ca_file;
  std::string cert_data, key_data;
  std::string cert_file, key_file;
};

// What one answer's header (status line and fields) may hold: a server
// that sends more is not read further, and the exchange fails. An API
// server sends well under 1 KiB.
inline constexpr size_t kMaxHeaderBytes = 64 << 10;

struct Request {
  bool https = true;
  std::string host;
  int port = 443;
  std::string method;  // "GET", "POST", ...
  std::string path;    // with the server's prefix
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // sent with the headers given (no Content-Type added)
  Tls tls;
  // The whole exchange (connecting, sending, reading the answer) ends by then.
  int64_t timeout_ms = 30000;
  // An answer longer than this is not read further.
  size_t max_body_bytes = 16 << 20;
  // Once this is true the exchange ends within a second, and one started
  // after fails at once ("dpproxy is stopping"). May be null.
  const std::atomic<bool>* cancelled = nullptr;
};

struct Answer {
  enum class Outcome {
    kAnswered,        // `status` and `body` hold the server's answer
    kTooLong,         // the body went over max_body_bytes
    kLate,            // no whole answer within timeout_ms
    kTransport,       // no answer: `error` says why (connect, TLS, ...)
    kBadCredentials,  // the client certificate or key cannot be used: `error`
  };
  Outcome outcome = Outcome::kTransport;
  int status = 0;
  std::string body;
  std::string error;
};

struct Module {
  // Whether `pem` holds at least one certificate.
  bool (*has_certificate)(const std::string& pem);
  // One exchange on a connection of its own; thread-safe. However slowly
  // the server answers, it ends within the request's timeout, or within a
  // second of its `cancelled` turning true.
  void (*exchange)(const Request& request, Answer* answer);
};

}  // namespace https
}  // namespace dpproxy

extern "C" {
const char* dpproxy_https_abi();
const dpproxy::https::Module* dpproxy_https_module();
}

#endif  // DPPROXY_PROXY_KUBE_HTTPS_MODULE_H_
