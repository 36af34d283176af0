// File: kube_client.h
//
// A small client of the Kubernetes API over HTTPS: JSON in, JSON out, for
// the few objects DRA mode touches (ResourceSlices, ResourceClaims, API
// discovery). Every answer that is not 2xx becomes a Status with the
// code Kubernetes meant (404 kNotFound, 409 kAlreadyExists or kAborted on a
// conflict, 403 kPermissionDenied, 401 kUnauthenticated, 422 and 400
// kInvalidArgument, 5xx and transport errors kUnavailable) and a message
// naming the method, the path and the API server's own reason.
//
//   auto client = KubeClient::Create(*InClusterConfig());
//   absl::StatusOr<Json> claim = (*client)->Get(
//       "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu");
//
// The exchanges themselves (cpp-httplib with OpenSSL: one server, one
// protocol, none of the libraries libcurl brings) are made by the HTTPS
// module, loaded when the first client is created (https_loader.h), so a
// process that never makes one never loads TLS libraries.
//
// Thread-safe: each call uses a connection of its own.
#ifndef DPPROXY_PROXY_KUBE_KUBE_CLIENT_H_
#define DPPROXY_PROXY_KUBE_KUBE_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proxy/kube/https_module.h"
#include "proxy/kube/kube_config.h"

namespace dpproxy {

class KubeClient {
 public:
  using Json = nlohmann::json;

  // kInvalidArgument if the configuration cannot work (no server, an https
  // server with neither a CA nor insecure, a key without a certificate);
  // kFailedPrecondition if the HTTPS module cannot be loaded (the message
  // says where it was looked for, or why it was refused).
  static absl::StatusOr<std::unique_ptr<KubeClient>> Create(
      KubeConfig config, absl::Duration timeout = absl::Seconds(30));

  absl::StatusOr<Json> Get(const std::string& path);
  absl::StatusOr<Json> Post(const std::string& path, const Json& body);
  absl::StatusOr<Json> Put(const std::string& path, const Json& body);
  absl::StatusOr<Json> Delete(const std::string& path);
  // A GET whose answer is not JSON (a kubelet's /metrics through the API
  // server's node proxy): the body of a 2xx as it came; any other answer
  // is a Status as above.
  absl::StatusOr<std::string> GetText(const std::string& path);

  const KubeConfig& config() const { return config_; }

  // Answers longer than this fail their call (kResourceExhausted) without
  // being read further. 16 MiB unless set.
  void set_max_body_bytes(size_t n) { max_body_bytes_ = n; }

  // Ends every call in flight within a second, and fails every later one
  // at once (kUnavailable, "dpproxy is stopping"): for a dpproxy that
  // stops. Thread-safe; there is no undoing it.
  void Cancel() { cancelled_.store(true); }

 private:
  KubeClient(KubeConfig config, absl::Duration timeout, const https::Module* https);
  absl::StatusOr<Json> Call(const char* method, const std::string& path, const Json* body);
  // One exchange (`what`: the method and path); a Status for an answer
  // that never came whole, else the answer, whatever its HTTP status.
  absl::StatusOr<https::Answer> Exchange(const char* method, const std::string& path,
                                         const Json* body, const char* accept);
  // An answer the API server gave (`what`: the method and path): its JSON
  // for a 2xx, else a Status with the code Kubernetes meant and its reason.
  static absl::StatusOr<Json> FromAnswer(const std::string& what, const https::Answer& answer);

  const KubeConfig config_;
  const absl::Duration timeout_;
  const https::Module* const https_;
  https::Request base_;  // server, TLS and limit: each call adds the rest
  std::atomic<bool> cancelled_{false};
  size_t max_body_bytes_ = 16 << 20;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBE_KUBE_CLIENT_H_
