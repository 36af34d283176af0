// File: kube_config.h
//
// Where the Kubernetes API server is and how to prove who dpproxy is: what
// DRA mode needs to publish ResourceSlices and read ResourceClaims
// (resource.k8s.io, KEP-4381). From inside a pod (the service account's token and
// CA, KUBERNETES_SERVICE_HOST/PORT), or from a kubeconfig file (a node
// agent under systemd): the current context's cluster (server, CA file or
// data, insecure-skip-tls-verify) and user (token, token file, client
// certificate and key as files or data).
#ifndef DPPROXY_PROXY_KUBE_KUBE_CONFIG_H_
#define DPPROXY_PROXY_KUBE_KUBE_CONFIG_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace dpproxy {

struct KubeConfig {
  std::string server;      // https://host:port, no trailing slash
  std::string ca_file;     // PEM bundle to verify the server; or
  std::string ca_data;     // the same as PEM text
  bool insecure = false;   // insecure-skip-tls-verify (tests, never defaults)
  std::string token;       // bearer token; or
  std::string token_file;  // read at every request (projected tokens rotate)
  std::string client_cert_file, client_key_file;  // mutual TLS; or
  std::string client_cert_data, client_key_data;  // the same as PEM text
  std::string namespace_;  // the pod's namespace in-cluster, else ""
  std::string source;      // where it came from, for messages
};

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

// In-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT from
// `getenv`, token, ca.crt and namespace from `sa_dir`. kFailedPrecondition
// naming what is missing (not in a pod, or no service account mounted).
absl::StatusOr<KubeConfig> InClusterConfig(
    const std::function<const char*(const char*)>& getenv = ::getenv,
    const std::string& sa_dir = kServiceAccountDir);

// A kubeconfig file; `context` "" means its current-context. Relative file
// paths in it are relative to the file's directory, as kubectl reads them.
// kInvalidArgument naming the file and the key for anything unusable.
absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path,
                                          const std::string& context = "");

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBE_KUBE_CONFIG_H_
