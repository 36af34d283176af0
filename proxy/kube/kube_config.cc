#include "proxy/kube/kube_config.h"

#include <functional>

#include <cstdlib>

#include <yaml-cpp/yaml.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": ", what));
}

// The entry named `name` of a kubeconfig list (clusters, users, contexts).
const YAML::Node Named(const YAML::Node& list, const std::string& name) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const YAML::Node& e : list) {
    if (e["name"] && e["name"].as<std::string>() == name) return e;
  }
  return YAML::Node();
}

std::string Str(const YAML::Node& n, const char* key) {
  return n && n[key] && n[key].IsScalar() ? n[key].as<std::string>() : std::string();
}

}  // namespace

absl::StatusOr<KubeConfig> InClusterConfig(
    const std::function<const char*(const char*)>& getenv, const std::string& sa_dir) {
  const char* host = getenv("KUBERNETES_SERVICE_HOST");
  const char* port = getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    return absl::FailedPreconditionError(
        "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (give "
        "--kubeconfig outside a cluster)");
  }
  KubeConfig c;
  const std::string h = host;
  // An IPv6 service address needs brackets in a URL.
  c.server = absl::StrCat("https://", h.find(':') != std::string::npos ? "[" + h + "]" : h,
                          ":", port);
  c.token_file = JoinPath(sa_dir, "token");
  c.ca_file = JoinPath(sa_dir, "ca.crt");
  for (const std::string& f : {c.token_file, c.ca_file}) {
    if (!PathExists(f)) {
      return absl::FailedPreconditionError(
          absl::StrCat("in a pod, but ", f,
                       " is missing: is a service account token mounted "
                       "(automountServiceAccountToken)?"));
    }
  }
  if (absl::StatusOr<std::string> ns = ReadFile(JoinPath(sa_dir, "namespace")); ns.ok()) {
    c.namespace_ = std::string(absl::StripAsciiWhitespace(*ns));
  }
  c.source = absl::StrCat("in-cluster (", sa_dir, ")");
  return c;
}

namespace {

// The user `user_name` of a kubeconfig's users: a token (or its file) or a
// client certificate and key (files or data). `file` resolves a path
// against the kubeconfig's directory; `data` decodes a base64 field.
absl::Status ApplyUser(
    const YAML::Node& root, const std::string& path, const std::string& user_name,
    const std::function<std::string(const std::string&)>& file,
    const std::function<absl::Status(const YAML::Node&, const char*, std::string*)>& data,
    KubeConfig* c) {
  const YAML::Node user_entry = Named(root["users"], user_name);
  if (!user_entry || !user_entry["user"]) {
    return Bad(path, absl::StrCat("no user \"", user_name, "\""));
  }
  const YAML::Node user = user_entry["user"];
  if (user["exec"] || user["auth-provider"]) {
    return Bad(path, absl::StrCat("user \"", user_name,
                                  "\" needs an exec or auth-provider plugin, which dpproxy "
                                  "does not run; give it a token or a client certificate"));
  }
  c->token = Str(user, "token");
  c->token_file = file(Str(user, "tokenFile"));
  c->client_cert_file = file(Str(user, "client-certificate"));
  c->client_key_file = file(Str(user, "client-key"));
  if (absl::Status s = data(user, "client-certificate-data", &c->client_cert_data); !s.ok()) {
    return s;
  }
  if (absl::Status s = data(user, "client-key-data", &c->client_key_data); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Bad(path, std::string(text.status().message()));
  YAML::Node root;
  try {
    root = YAML::Load(*text);
  } catch (const YAML::Exception& e) {
    return Bad(path, absl::StrCat("not YAML: ", e.what()));
  }
  if (!root.IsMap()) return Bad(path, "not a kubeconfig (a YAML map)");
  const std::string ctx_name = context.empty() ? Str(root, "current-context") : context;
  if (ctx_name.empty()) return Bad(path, "no current-context, and no context given");
  const YAML::Node ctx = Named(root["contexts"], ctx_name);
  if (!ctx || !ctx["context"]) return Bad(path, absl::StrCat("no context \"", ctx_name, "\""));
  const std::string cluster_name = Str(ctx["context"], "cluster");
  const std::string user_name = Str(ctx["context"], "user");
  const YAML::Node cluster_entry = Named(root["clusters"], cluster_name);
  if (!cluster_entry || !cluster_entry["cluster"]) {
    return Bad(path, absl::StrCat("no cluster \"", cluster_name, "\""));
  }
  const YAML::Node cluster = cluster_entry["cluster"];
  const std::string dir = path.find('/') == std::string::npos
                              ? std::string(".")
                              : path.substr(0, path.rfind('/'));
  auto file = [&](const std::string& f) {
    return f.empty() || f[0] == '/' ? f : JoinPath(dir, f);
  };
  auto data = [&](const YAML::Node& n, const char* key,
                  std::string* out) -> absl::Status {
    const std::string b64 = Str(n, key);
    if (b64.empty()) return absl::OkStatus();
    if (!absl::Base64Unescape(b64, out)) return Bad(path, absl::StrCat(key, " is not base64"));
    return absl::OkStatus();
  };
  KubeConfig c;
  c.server = std::string(absl::StripSuffix(Str(cluster, "server"), "/"));
  if (c.server.empty()) return Bad(path, absl::StrCat("cluster \"", cluster_name, "\" has no server"));
  c.ca_file = file(Str(cluster, "certificate-authority"));
  if (absl::Status s = data(cluster, "certificate-authority-data", &c.ca_data); !s.ok()) return s;
  c.insecure = Str(cluster, "insecure-skip-tls-verify") == "true";
  if (!user_name.empty()) {
    if (absl::Status s = ApplyUser(root, path, user_name, file, data, &c); !s.ok()) return s;
  }
  c.source = absl::StrCat(path, " (context ", ctx_name, ")");
  return c;
}

}  // namespace dpproxy
