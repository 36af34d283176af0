#include "proxy/config/config_file.h"

#include <map>
#include <set>

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

class Reader {
 public:
  explicit Reader(std::string name) : name_(std::move(name)) {}

  absl::Status Error(const YAML::Node& n, const std::string& key, const std::string& why) {
    std::string where = name_;
    if (n.IsDefined() && n.Mark().line >= 0) {
      absl::StrAppend(&where, ":", n.Mark().line + 1, ":", n.Mark().column + 1);
    }
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, ": ", why));
  }

  absl::Status CheckKeys(const YAML::Node& map, const std::string& path,
                         const std::set<std::string>& known) {
    if (!map.IsMap()) return Error(map, path.empty() ? "(top level)" : path, "must be a mapping");
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (known.count(key) == 0) {
        return Error(kv.first, Join(path, key),
                     absl::StrCat("unknown key (known here: ",
                                  absl::StrJoin(known.begin(), known.end(), ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status String(const YAML::Node& n, const std::string& key, std::string* out) {
    if (!n.IsScalar()) return Error(n, key, "must be a string");
    *out = n.as<std::string>();
    return absl::OkStatus();
  }

  absl::Status OneOf(const YAML::Node& n, const std::string& key,
                     const std::set<std::string>& allowed, std::string* out) {
    std::string v;
    if (absl::Status s = String(n, key, &v); !s.ok()) return s;
    if (allowed.count(v) == 0) {
      return Error(n, key, absl::StrCat("\"", v, "\" is not one of ",
                                        absl::StrJoin(allowed.begin(), allowed.end(), ", ")));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Duration(const YAML::Node& n, const std::string& key, absl::Duration* out) {
    std::string v;
    if (absl::Status s = String(n, key, &v); !s.ok()) return s;
    absl::Duration d;
    if (!absl::ParseDuration(v, &d) || d < absl::ZeroDuration()) {
      return Error(n, key, absl::StrCat("\"", v, "\" is not a duration (examples: 500ms, 10s, 5m)"));
    }
    *out = d;
    return absl::OkStatus();
  }

  absl::Status IntIn(const YAML::Node& n, const std::string& key, int lo, int hi, int* out) {
    int v;
    if (!n.IsScalar() || !YAML::convert<int>::decode(n, v) || v < lo || v > hi) {
      return Error(n, key, absl::StrCat("must be a whole number from ", lo, " to ", hi));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Bool(const YAML::Node& n, const std::string& key, bool* out) {
    bool b;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b)) {
      return Error(n, key, "must be true or false");
    }
    *out = b;
    return absl::OkStatus();
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }

 private:
  const std::string name_;
};

#define DPP_CFG(expr)                          \
  do {                                         \
    if (absl::Status s_ = (expr); !s_.ok()) return s_; \
  } while (0)

// kubelet: its root, the API and how to register.
absl::Status ApplyKubelet(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node k = root["kubelet"]) {
    DPP_CFG(r.CheckKeys(k, "kubelet", {"root", "api", "registration"}));
    if (k["root"]) DPP_CFG(r.String(k["root"], "kubelet.root", &c->kubelet.kubelet_root));
    if (k["api"]) {
      std::string v;
      DPP_CFG(r.OneOf(k["api"], "kubelet.api", {"auto", "v1beta1", "v1alpha", "dra"}, &v));
      c->dra.enabled = v == "dra";
      c->kubelet.api = c->dra.enabled ? std::nullopt : *ParseApiVersion(v, /*allow_auto=*/true);
    }
    if (k["registration"]) {
      std::string v;
      DPP_CFG(r.OneOf(k["registration"], "kubelet.registration", {"kubelet", "plugin-watcher"},
                      &v));
      c->kubelet.registration = v == "kubelet" ? KubeletRegistration::kKubeletSocket
                                               : KubeletRegistration::kPluginWatcher;
    }
  }
  return absl::OkStatus();
}

// dra: the driver, the node, the kubeconfig, CDI and the move fence.
absl::Status ApplyDra(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node d = root["dra"]) {
    DPP_CFG(r.CheckKeys(d, "dra", {"driver", "node_name", "kubeconfig", "cdi_dir", "move_fence"}));
    if (d["driver"]) DPP_CFG(r.String(d["driver"], "dra.driver", &c->dra.driver));
    if (d["node_name"]) DPP_CFG(r.String(d["node_name"], "dra.node_name", &c->dra.node_name));
    if (d["kubeconfig"]) DPP_CFG(r.String(d["kubeconfig"], "dra.kubeconfig", &c->dra.kubeconfig));
    if (d["cdi_dir"]) DPP_CFG(r.String(d["cdi_dir"], "dra.cdi_dir", &c->dra.cdi_dir));
    if (d["move_fence"]) DPP_CFG(r.Bool(d["move_fence"], "dra.move_fence", &c->dra.move_fence));
  }
  return absl::OkStatus();
}

// dpproxy's own paths and addresses.
absl::Status ApplyPathsAndAddresses(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (root["plugin_dir"]) DPP_CFG(r.String(root["plugin_dir"], "plugin_dir", &c->plugin_dir));
  if (root["status_file"]) {
    DPP_CFG(r.String(root["status_file"], "status_file", &c->status_file));
  }
  if (root["state_dir"]) DPP_CFG(r.String(root["state_dir"], "state_dir", &c->state_dir));
  if (root["pod_resources_socket"]) {
    DPP_CFG(r.String(root["pod_resources_socket"], "pod_resources_socket",
                     &c->pod_resources_socket));
  }
  if (root["container_runtime_endpoint"]) {
    DPP_CFG(r.String(root["container_runtime_endpoint"], "container_runtime_endpoint",
                     &c->container_runtime_endpoint));
  }
  if (root["socket_group"]) {
    DPP_CFG(r.String(root["socket_group"], "socket_group", &c->socket_group));
  }
  if (root["metrics_address"]) {
    DPP_CFG(r.String(root["metrics_address"], "metrics_address", &c->metrics_address));
  }
  return absl::OkStatus();
}

// restore and reconcile.
absl::Status ApplyRestoreAndReconcile(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node rs = root["restore"]) {
    DPP_CFG(r.CheckKeys(rs, "restore", {"policy", "hold"}));
    if (rs["policy"]) {
      std::string v;
      DPP_CFG(r.OneOf(rs["policy"], "restore.policy", {"trust", "unhealthy"}, &v));
      c->restore_policy = v == "trust" ? RestorePolicy::kTrust : RestorePolicy::kUnhealthy;
    }
    if (rs["hold"]) DPP_CFG(r.Duration(rs["hold"], "restore.hold", &c->restore_hold));
  }
  if (const YAML::Node rc = root["reconcile"]) {
    DPP_CFG(r.CheckKeys(rc, "reconcile", {"interval", "grace", "start_grace"}));
    if (rc["interval"]) {
      DPP_CFG(r.Duration(rc["interval"], "reconcile.interval", &c->reconcile_interval));
    }
    if (rc["grace"]) DPP_CFG(r.Duration(rc["grace"], "reconcile.grace", &c->reconcile_grace));
    if (rc["start_grace"]) {
      DPP_CFG(r.Duration(rc["start_grace"], "reconcile.start_grace", &c->reconcile_start_grace));
    }
  }
  return absl::OkStatus();
}

// timeouts, limits, backend_loss, backend_probe, flap_damping and cdi_annotations.
absl::Status ApplyLimitsAndPolicy(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node t = root["timeouts"]) {
    DPP_CFG(r.CheckKeys(t, "timeouts", {"backend", "dial"}));
    if (t["backend"]) {
      DPP_CFG(r.Duration(t["backend"], "timeouts.backend", &c->kubelet.backend_timeout));
    }
    if (t["dial"]) DPP_CFG(r.Duration(t["dial"], "timeouts.dial", &c->dial_timeout));
  }
  if (const YAML::Node l = root["limits"]) {
    DPP_CFG(r.CheckKeys(l, "limits", {"backend_list_mib", "api_body_mib"}));
    if (l["backend_list_mib"]) {
      int mib = 0;
      DPP_CFG(r.IntIn(l["backend_list_mib"], "limits.backend_list_mib", 4, 2047, &mib));
      c->backend_max_list_bytes = mib << 20;
    }
    if (l["api_body_mib"]) {
      int mib = 0;
      DPP_CFG(r.IntIn(l["api_body_mib"], "limits.api_body_mib", 1, 1024, &mib));
      c->api_max_body_bytes = mib << 20;
    }
  }
  if (const YAML::Node b = root["backend_loss"]) {
    DPP_CFG(r.CheckKeys(b, "backend_loss", {"policy", "hold", "grace"}));
    if (b["policy"]) {
      std::string v;
      DPP_CFG(r.OneOf(b["policy"], "backend_loss.policy", {"unhealthy", "hold"}, &v));
      c->policy.loss_policy = v == "hold" ? LossPolicy::kHold : LossPolicy::kUnhealthy;
    }
    if (b["hold"]) DPP_CFG(r.Duration(b["hold"], "backend_loss.hold", &c->policy.hold));
    if (b["grace"]) DPP_CFG(r.Duration(b["grace"], "backend_loss.grace", &c->policy.grace));
  }
  if (const YAML::Node p = root["backend_probe"]) {
    DPP_CFG(r.CheckKeys(p, "backend_probe", {"interval", "timeout", "misses"}));
    BackendProbe& probe = c->policy.probe;
    if (p["interval"]) DPP_CFG(r.Duration(p["interval"], "backend_probe.interval", &probe.interval));
    if (p["timeout"]) DPP_CFG(r.Duration(p["timeout"], "backend_probe.timeout", &probe.timeout));
    if (p["misses"]) DPP_CFG(r.IntIn(p["misses"], "backend_probe.misses", 1, 100, &probe.misses));
  }
  if (const YAML::Node f = root["flap_damping"]) {
    DPP_CFG(r.CheckKeys(f, "flap_damping", {"flaps", "window", "backoff", "max_backoff"}));
    FlapDamping& flap = c->policy.flap_damping;
    if (f["flaps"]) DPP_CFG(r.IntIn(f["flaps"], "flap_damping.flaps", 0, 1000, &flap.flaps));
    if (f["window"]) DPP_CFG(r.Duration(f["window"], "flap_damping.window", &flap.window));
    if (f["backoff"]) DPP_CFG(r.Duration(f["backoff"], "flap_damping.backoff", &flap.backoff));
    if (f["max_backoff"]) {
      DPP_CFG(r.Duration(f["max_backoff"], "flap_damping.max_backoff", &flap.max_backoff));
    }
  }
  if (root["cdi_annotations"]) {
    DPP_CFG(r.Bool(root["cdi_annotations"], "cdi_annotations", &c->kubelet.cdi_annotations));
  }
  return absl::OkStatus();
}

// renames, paths (device plugin, DRA or both), compact_ids and id_maps.
absl::Status ApplyResourceMaps(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node m = root["renames"]) {
    if (!m.IsMap()) return r.Error(m, "renames", "must be a mapping FROM: TO");
    for (const auto& kv : m) {
      std::string to;
      const std::string from = kv.first.as<std::string>();
      DPP_CFG(r.String(kv.second, absl::StrCat("renames.", from), &to));
      c->renames[from] = to;
    }
  }
  if (const YAML::Node m = root["paths"]) {
    if (!m.IsMap()) {
      return r.Error(m, "paths", "must be a mapping RESOURCE: device-plugin | dra | both");
    }
    for (const auto& kv : m) {
      const std::string resource = kv.first.as<std::string>();
      std::string v;
      DPP_CFG(r.OneOf(kv.second, absl::StrCat("paths.", resource), {"device-plugin", "dra", "both"},
                      &v));
      c->paths[resource] = v == "dra"    ? KubeletPath::kDra
                           : v == "both" ? KubeletPath::kBoth
                                         : KubeletPath::kDevicePlugin;
    }
  }
  if (const YAML::Node list = root["compact_ids"]) {
    if (!list.IsSequence()) return r.Error(list, "compact_ids", "must be a list of resource names");
    for (size_t i = 0; i < list.size(); ++i) {
      std::string name;
      DPP_CFG(r.String(list[i], absl::StrCat("compact_ids[", i, "]"), &name));
      c->compact_ids.insert(name);
    }
  }
  if (const YAML::Node maps = root["id_maps"]) {
    if (!maps.IsMap()) return r.Error(maps, "id_maps", "must be a mapping RESOURCE: {BACKEND_ID: ID}");
    for (const auto& rm : maps) {
      const std::string resource = rm.first.as<std::string>();
      const std::string path = absl::StrCat("id_maps.", resource);
      if (!rm.second.IsMap()) return r.Error(rm.second, path, "must be a mapping BACKEND_ID: ID");
      for (const auto& kv : rm.second) {
        std::string to;
        DPP_CFG(r.String(kv.second, absl::StrCat(path, ".", kv.first.as<std::string>()), &to));
        c->id_maps[resource][kv.first.as<std::string>()] = to;
      }
    }
  }
  return absl::OkStatus();
}

// backends: the plugins that never register.
absl::Status ApplyStaticBackends(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (const YAML::Node list = root["backends"]) {
    if (!list.IsSequence()) return r.Error(list, "backends", "must be a list");
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node b = list[i];
      const std::string path = absl::StrCat("backends[", i, "]");
      DPP_CFG(r.CheckKeys(b, path, {"resource", "endpoint", "api"}));
      StaticBackendConfig sb;
      if (!b["resource"]) return r.Error(b, path, "needs a resource");
      if (!b["endpoint"]) return r.Error(b, path, "needs an endpoint (socket path)");
      DPP_CFG(r.String(b["resource"], path + ".resource", &sb.resource));
      DPP_CFG(r.String(b["endpoint"], path + ".endpoint", &sb.endpoint));
      if (b["api"]) {
        std::string v;
        DPP_CFG(r.OneOf(b["api"], path + ".api", {"auto", "v1alpha", "v1beta1"}, &v));
        sb.api = *ParseApiVersion(v, /*allow_auto=*/true);
      }
      c->static_backends.push_back(sb);
    }
  }
  return absl::OkStatus();
}

absl::Status Apply(Reader& r, const YAML::Node& root, ProxyConfig* c) {
  if (root.IsNull()) return absl::OkStatus();  // an empty file changes nothing
  DPP_CFG(r.CheckKeys(root, "",
                      {"kubelet", "plugin_dir", "status_file", "state_dir", "restore", "reconcile",
                       "metrics_address", "socket_group", "timeouts", "limits", "backend_loss",
                       "backend_probe", "flap_damping", "cdi_annotations", "renames", "id_maps", "compact_ids", "backends",
                       "dra", "paths", "pod_resources_socket", "container_runtime_endpoint"}));
  // Section by section, in this order: the first problem found is reported.
  for (absl::Status (*apply)(Reader&, const YAML::Node&, ProxyConfig*) :
       {ApplyKubelet, ApplyDra, ApplyPathsAndAddresses, ApplyRestoreAndReconcile,
        ApplyLimitsAndPolicy, ApplyResourceMaps, ApplyStaticBackends}) {
    DPP_CFG(apply(r, root, c));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

std::string ApiOrAuto(const std::optional<ApiVersion>& a) {
  return a.has_value() ? std::string(ApiName(*a)) : std::string("auto");
}

// The per-resource settings: renames, paths, compact IDs, ID maps and
// static backends.
void EmitResourceMaps(const ProxyConfig& c, YAML::Emitter* out) {
  *out << YAML::Key << "renames" << YAML::Value << YAML::BeginMap;
  for (const auto& [from, to] : c.renames) *out << YAML::Key << from << YAML::Value << to;
  *out << YAML::EndMap;
  *out << YAML::Key << "paths" << YAML::Value << YAML::BeginMap;
  for (const auto& [resource, path] : c.paths) {
    *out << YAML::Key << resource << YAML::Value << KubeletPathName(path);
  }
  *out << YAML::EndMap;
  *out << YAML::Key << "compact_ids" << YAML::Value << YAML::BeginSeq;
  for (const std::string& r : c.compact_ids) *out << r;
  *out << YAML::EndSeq;
  *out << YAML::Key << "id_maps" << YAML::Value << YAML::BeginMap;
  for (const auto& [resource, ids] : c.id_maps) {
    *out << YAML::Key << resource << YAML::Value << YAML::BeginMap;
    for (const auto& [from, to] : ids) *out << YAML::Key << from << YAML::Value << to;
    *out << YAML::EndMap;
  }
  *out << YAML::EndMap;
  *out << YAML::Key << "backends" << YAML::Value << YAML::BeginSeq;
  for (const StaticBackendConfig& b : c.static_backends) {
    *out << YAML::BeginMap << YAML::Key << "resource" << YAML::Value << b.resource << YAML::Key
        << "endpoint" << YAML::Value << b.endpoint << YAML::Key << "api" << YAML::Value
        << ApiOrAuto(b.api) << YAML::EndMap;
  }
  *out << YAML::EndSeq;
}

}  // namespace

std::string ConfigToYaml(const ProxyConfig& c) {
  auto duration = [](absl::Duration d) { return absl::FormatDuration(d); };
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "kubelet" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "root" << YAML::Value << c.kubelet.kubelet_root;
  out << YAML::Key << "api" << YAML::Value << (c.dra.enabled ? "dra" : ApiOrAuto(c.kubelet.api));
  out << YAML::Key << "registration" << YAML::Value
      << (c.kubelet.registration == KubeletRegistration::kKubeletSocket ? "kubelet"
                                                                        : "plugin-watcher");
  out << YAML::EndMap;
  out << YAML::Key << "dra" << YAML::Value << YAML::BeginMap << YAML::Key << "driver"
      << YAML::Value << c.dra.driver << YAML::Key << "node_name" << YAML::Value
      << c.dra.node_name << YAML::Key << "kubeconfig" << YAML::Value << c.dra.kubeconfig
      << YAML::Key << "cdi_dir" << YAML::Value << c.dra.cdi_dir << YAML::Key << "move_fence"
      << YAML::Value << c.dra.move_fence << YAML::EndMap;
  out << YAML::Key << "plugin_dir" << YAML::Value << c.plugin_dir;
  out << YAML::Key << "status_file" << YAML::Value << c.status_file;
  out << YAML::Key << "state_dir" << YAML::Value << c.state_dir;
  out << YAML::Key << "pod_resources_socket" << YAML::Value << c.pod_resources_socket;
  out << YAML::Key << "container_runtime_endpoint" << YAML::Value
      << c.container_runtime_endpoint;
  out << YAML::Key << "socket_group" << YAML::Value << c.socket_group;
  out << YAML::Key << "metrics_address" << YAML::Value << c.metrics_address;
  out << YAML::Key << "restore" << YAML::Value << YAML::BeginMap << YAML::Key << "policy"
      << YAML::Value << (c.restore_policy == RestorePolicy::kTrust ? "trust" : "unhealthy")
      << YAML::Key << "hold" << YAML::Value << duration(c.restore_hold) << YAML::EndMap;
  out << YAML::Key << "reconcile" << YAML::Value << YAML::BeginMap << YAML::Key << "interval"
      << YAML::Value << duration(c.reconcile_interval) << YAML::Key << "grace" << YAML::Value
      << duration(c.reconcile_grace) << YAML::Key << "start_grace" << YAML::Value
      << duration(c.reconcile_start_grace) << YAML::EndMap;
  out << YAML::Key << "timeouts" << YAML::Value << YAML::BeginMap << YAML::Key << "backend"
      << YAML::Value << duration(c.kubelet.backend_timeout) << YAML::Key << "dial"
      << YAML::Value << duration(c.dial_timeout) << YAML::EndMap;
  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap << YAML::Key
      << "backend_list_mib" << YAML::Value << (c.backend_max_list_bytes >> 20) << YAML::Key
      << "api_body_mib" << YAML::Value << (c.api_max_body_bytes >> 20) << YAML::EndMap;
  out << YAML::Key << "backend_loss" << YAML::Value << YAML::BeginMap << YAML::Key << "policy"
      << YAML::Value << (c.policy.loss_policy == LossPolicy::kHold ? "hold" : "unhealthy")
      << YAML::Key << "hold" << YAML::Value << duration(c.policy.hold) << YAML::Key << "grace"
      << YAML::Value << duration(c.policy.grace) << YAML::EndMap;
  out << YAML::Key << "backend_probe" << YAML::Value << YAML::BeginMap << YAML::Key << "interval"
      << YAML::Value << duration(c.policy.probe.interval) << YAML::Key << "timeout"
      << YAML::Value << duration(c.policy.probe.timeout) << YAML::Key << "misses"
      << YAML::Value << c.policy.probe.misses << YAML::EndMap;
  out << YAML::Key << "flap_damping" << YAML::Value << YAML::BeginMap << YAML::Key << "flaps"
      << YAML::Value << c.policy.flap_damping.flaps << YAML::Key << "window" << YAML::Value
      << duration(c.policy.flap_damping.window) << YAML::Key << "backoff" << YAML::Value
      << duration(c.policy.flap_damping.backoff) << YAML::Key << "max_backoff" << YAML::Value
      << duration(c.policy.flap_damping.max_backoff) << YAML::EndMap;
  out << YAML::Key << "cdi_annotations" << YAML::Value << c.kubelet.cdi_annotations;
  EmitResourceMaps(c, &out);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status LoadConfigText(const std::string& text, const std::string& name,
                            ProxyConfig* config) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid YAML: ",
                                                   e.msg));
  }
  ProxyConfig copy = *config;
  Reader reader(name);
  absl::Status s;
  try {
    s = Apply(reader, root, &copy);
  } catch (const YAML::Exception& e) {
    s = absl::InvalidArgumentError(absl::StrCat(name, ":", e.mark.line + 1, ": ", e.msg));
  }
  if (!s.ok()) return s;
  NodeNameFromEnvironment(&copy);
  if (absl::Status v = ValidateConfig(copy); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", v.message()));
  }
  *config = std::move(copy);
  return absl::OkStatus();
}

absl::Status LoadConfigFile(const std::string& path, ProxyConfig* config) {
  absl::StatusOr<std::string> text = ReadFileUpTo(path, kMaxConfigFileBytes);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read configuration file: ", text.status().message()));
  }
  return LoadConfigText(*text, path, config);
}

namespace {

// Every scalar of `node` under its path, in document order.
void Flatten(const YAML::Node& node, const std::string& path,
             std::vector<std::pair<std::string, std::string>>* out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      Flatten(kv.second, path.empty() ? key : absl::StrCat(path, ".", key), out);
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) Flatten(node[i], absl::StrCat(path, "[", i, "]"), out);
  } else if (node.IsScalar()) {
    out->emplace_back(path, node.Scalar());
  }
}

}  // namespace

std::vector<SettingChange> ChangedSettings(const ProxyConfig& from, const ProxyConfig& to) {
  std::vector<std::pair<std::string, std::string>> a, b;
  Flatten(YAML::Load(ConfigToYaml(from)), "", &a);
  Flatten(YAML::Load(ConfigToYaml(to)), "", &b);
  std::map<std::string, std::string> after(b.begin(), b.end());
  std::vector<SettingChange> out;
  std::set<std::string> seen;
  for (const auto& [path, value] : a) {
    seen.insert(path);
    auto it = after.find(path);
    if (it == after.end()) {
      out.push_back({path, value, ""});
    } else if (it->second != value) {
      out.push_back({path, value, it->second});
    }
  }
  for (const auto& [path, value] : b) {
    if (seen.count(path) == 0) out.push_back({path, "", value});
  }
  return out;
}

}  // namespace dpproxy
