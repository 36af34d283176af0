#include "proxy/config/proxy_config.h"

#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proxy/util/host_port.h"
#include "proxy/util/files.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

std::string DevicePluginDir(const KubeletSideOptions& o) {
  return JoinPath(o.kubelet_root, "device-plugins");
}

std::string KubeletSocketPath(const KubeletSideOptions& o) {
  return JoinPath(DevicePluginDir(o), kKubeletSocketName);
}

std::string KubeletPodResourcesSocket(const KubeletSideOptions& o) {
  return JoinPath(JoinPath(o.kubelet_root, "pod-resources"), "kubelet.sock");
}

std::string KubeletResourceName(const ProxyConfig& config, const std::string& backend_resource) {
  auto it = config.renames.find(backend_resource);
  return it == config.renames.end() ? backend_resource : it->second;
}

const char* KubeletPathName(KubeletPath p) {
  switch (p) {
    case KubeletPath::kDevicePlugin: return "device-plugin";
    case KubeletPath::kDra: return "dra";
    case KubeletPath::kBoth: return "both";
  }
  return "device-plugin";
}

KubeletPath PathOf(const ProxyConfig& config, const std::string& resource) {
  if (auto it = config.paths.find(resource); it != config.paths.end()) return it->second;
  return config.dra.enabled ? KubeletPath::kDra : KubeletPath::kDevicePlugin;
}

bool ServesDevicePlugins(const ProxyConfig& config) {
  if (!config.dra.enabled) return true;
  for (const auto& [resource, path] : config.paths) {
    if (path != KubeletPath::kDra) return true;
  }
  return false;
}

bool ServesDra(const ProxyConfig& config) {
  if (config.dra.enabled) return true;
  for (const auto& [resource, path] : config.paths) {
    if (path != KubeletPath::kDevicePlugin) return true;
  }
  return false;
}

namespace {

// kInvalidArgument when `dir` is, contains or lies inside one of the
// kubelet's own directories under `kubelet_root`, compared by identity
// (a bind mount of one has its identity, not its path).
absl::Status ApartFromKubeletDirs(const char* what, const std::string& dir,
                                  const std::string& kubelet_root, const char* advice) {
  for (const char* sub : {"device-plugins", "plugins_registry", "plugins", "pod-resources"}) {
    const std::string kubelet_dir = JoinPath(kubelet_root, sub);
    if (IsSameOrInside(dir, kubelet_dir) || IsSameOrInside(kubelet_dir, dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", dir, " is, contains or lies inside the kubelet's ", kubelet_dir,
          " (a bind mount of it?); ", advice));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The metrics address, and a pod-resources socket of dpproxy's own that is
// neither the kubelet's nor in a directory a kubelet or dpproxy empties.
absl::Status CheckAddresses(const ProxyConfig& c) {
  if (!c.metrics_address.empty()) {
    if (absl::StatusOr<HostPort> hp = ParseHostPort(c.metrics_address); !hp.ok()) {
      return hp.status();
    }
  }
  if (!c.pod_resources_socket.empty()) {
    const std::string& p = c.pod_resources_socket;
    const std::string kubelet_pod_resources = KubeletPodResourcesSocket(c.kubelet);
    if (p[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--pod_resources_socket=", p, " is not an absolute path"));
    }
    if (p == kubelet_pod_resources) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pod_resources_socket=", p,
          " is the kubelet's own pod-resources socket; dpproxy reads that one: give "
          "another path (e.g. ",
          JoinPath(JoinPath(c.kubelet.kubelet_root, "pod-resources"), "dpproxy.sock"), ")"));
    }
    for (const auto& [dir, what] :
         {std::pair<std::string, std::string>{JoinPath(c.kubelet.kubelet_root, "device-plugins"),
                                              "the kubelet's device-plugins directory (the "
                                              "kubelet empties it at each start)"},
          {c.plugin_dir, "the plugin directory (where plugins register)"}}) {
      if (!dir.empty() && absl::StartsWith(p, dir + "/")) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pod_resources_socket=", p, " lies in ", what));
      }
    }
  }
  return absl::OkStatus();
}

// A takeover hands a state directory over, through kubelet.sock.
absl::Status CheckTakeover(const ProxyConfig& c) {
  if (c.takeover && c.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "--takeover hands a state directory over: it needs --state_dir");
  }
  if (c.takeover && ServesDevicePlugins(c) &&
      c.kubelet.registration == KubeletRegistration::kPluginWatcher) {
    return absl::InvalidArgumentError(
        "--takeover needs registration through kubelet.sock (kubelet.registration: kubelet): "
        "through the plugin watcher, the kubelet deregisters a resource by name when the old "
        "dpproxy's socket goes, which would drop the new one's registration");
  }
  return absl::OkStatus();
}

// The resources served through DRA, and what DRA mode needs: a driver name
// that is a DNS subdomain, the node's name and an absolute CDI directory.
absl::Status CheckDra(const ProxyConfig& c) {
  for (const auto& [resource, path] : c.paths) {
    if (resource.empty()) return absl::InvalidArgumentError("paths: a resource name is empty");
    if (path != KubeletPath::kDevicePlugin && !c.dra.enabled && c.dra.driver.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "paths: ", resource, " is served through DRA (", KubeletPathName(path),
          "): that needs a driver name (dra.driver or --dra_driver, e.g. gpu.vendor.com)"));
    }
  }
  if (ServesDra(c)) {
    const std::string& d = c.dra.driver;
    bool subdomain = !d.empty() && d.size() <= 253;
    for (absl::string_view label : absl::StrSplit(d, '.')) {
      if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
        subdomain = false;
      }
      for (char ch : label) {
        if (!(absl::ascii_isdigit(ch) || (ch >= 'a' && ch <= 'z') || ch == '-')) subdomain = false;
      }
    }
    if (!subdomain) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dra driver \"", d,
          "\" is not a DNS subdomain (lowercase letters, digits, '-' and '.'), e.g. "
          "gpu.vendor.com"));
    }
    if (c.dra.node_name.empty()) {
      return absl::InvalidArgumentError(
          "dra: no node name (--node_name, or NODE_NAME in the environment, e.g. from the "
          "downward API's spec.nodeName)");
    }
    if (c.dra.cdi_dir.empty() || c.dra.cdi_dir[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("dra cdi_dir \"", c.dra.cdi_dir, "\" is not an absolute path"));
    }
  }
  return absl::OkStatus();
}

// The kubelet root and dpproxy's plugin directory: absolute, apart from
// each other by identity, and their sockets within the length a path may
// have.
absl::Status CheckPluginDirectory(const ProxyConfig& c) {
  if (c.kubelet.kubelet_root.empty() || c.kubelet.kubelet_root[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "kubelet root directory \"", c.kubelet.kubelet_root, "\" must be an absolute path"));
  }
  if (c.plugin_dir.empty() || c.plugin_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("plugin directory \"", c.plugin_dir, "\" must be an absolute path"));
  }
  // Compared by identity (device and inode of every ancestor, links and
  // ".." resolved), not by spelling: dpproxy removes stale sockets from its
  // plugin directory at start and must never do so in the kubelet's.
  if (IsSameOrInside(c.plugin_dir, c.kubelet.kubelet_root) ||
      IsSameOrInside(c.kubelet.kubelet_root, c.plugin_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plugin directory ", c.plugin_dir, " is, contains or lies inside the kubelet root ",
        c.kubelet.kubelet_root,
        "; plugins must register with the proxy in a directory of its own (default "
        "/var/lib/dpproxy/device-plugins)"));
  }
  // The kubelet's own directories, wherever they are mounted too: a bind
  // mount of device-plugins/ at the plugin directory has its identity, not
  // its path.
  DPP_RETURN_IF_ERROR(ApartFromKubeletDirs(
      "plugin directory", c.plugin_dir, c.kubelet.kubelet_root,
      "plugins must register with the proxy in a directory of its own (default "
      "/var/lib/dpproxy/device-plugins)"));
  DPP_RETURN_IF_ERROR(ValidateSocketPath(JoinPath(c.plugin_dir, kKubeletSocketName)));
  DPP_RETURN_IF_ERROR(ValidateSocketPath(KubeletSocketPath(c.kubelet)));
  return absl::OkStatus();
}

// Timeouts, and the largest device list accepted from a plugin.
absl::Status CheckLimits(const ProxyConfig& c) {
  if (c.kubelet.backend_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("backend timeout must be positive");
  }
  if (c.dial_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dial timeout must be positive");
  }
  if (c.backend_max_list_bytes < (4 << 20) || c.backend_max_list_bytes > (2047 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the largest device list accepted from a plugin must be 4 to 2047 MiB (gRPC's limit); "
        "got ", c.backend_max_list_bytes / (1 << 20), " MiB"));
  }
  return absl::OkStatus();
}

// The state directory: absolute, and apart from the plugin directory and
// every kubelet directory.
absl::Status CheckStateDirectory(const ProxyConfig& c) {
  if (!c.state_dir.empty()) {
    if (c.state_dir[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("state directory \"", c.state_dir, "\" must be an absolute path"));
    }
    if (IsSameOrInside(c.state_dir, c.plugin_dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state directory ", c.state_dir, " is or lies inside the plugin directory ",
          c.plugin_dir, "; keep them apart (default: state in /var/lib/dpproxy, plugins in "
          "/var/lib/dpproxy/device-plugins)"));
    }
    if (IsSameOrInside(c.state_dir, c.kubelet.kubelet_root)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state directory ", c.state_dir, " lies inside the kubelet root ",
          c.kubelet.kubelet_root, "; dpproxy keeps its state in a directory of its own"));
    }
    // The kubelet's own directories by identity too, as for the plugin
    // directory: a kubelet start wipes device-plugins/, and a journal
    // there would go with it.
    DPP_RETURN_IF_ERROR(ApartFromKubeletDirs(
        "state directory", c.state_dir, c.kubelet.kubelet_root,
        "dpproxy keeps its state in a directory of its own (default /var/lib/dpproxy)"));
  }
  return absl::OkStatus();
}

// The sockets' group, the holds and the backend-loss grace.
absl::Status CheckPolicy(const ProxyConfig& c) {
  if (!c.socket_group.empty()) {
    if (absl::StatusOr<gid_t> g = ResolveGroup(c.socket_group); !g.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("socket group: ", g.status().message()));
    }
  }
  if (c.restore_hold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("restore hold must not be negative");
  }
  if (c.policy.hold < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("backend hold time must not be negative");
  }
  if (c.policy.grace < absl::ZeroDuration() || c.policy.grace > absl::Minutes(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend_loss.grace ", absl::FormatDuration(c.policy.grace),
        " is not between 0s and 1m (for longer, use backend_loss.policy: hold)"));
  }
  const BackendProbe& probe = c.policy.probe;
  if (probe.interval != absl::ZeroDuration() && probe.interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend_probe.interval ", absl::FormatDuration(probe.interval),
        " is not 0s (off) or at least 1s (dpproxy's passes run once a second)"));
  }
  if (probe.timeout <= absl::ZeroDuration() || probe.timeout > absl::Minutes(5)) {
    return absl::InvalidArgumentError(absl::StrCat("backend_probe.timeout ",
                                                   absl::FormatDuration(probe.timeout),
                                                   " is not more than 0s and at most 5m"));
  }
  const FlapDamping& flap = c.policy.flap_damping;
  if (flap.flaps < 0 || flap.flaps > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("flap_damping.flaps ", flap.flaps, " is not between 0 (off) and 1000"));
  }
  if (flap.window <= absl::ZeroDuration() || flap.window > absl::Hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat("flap_damping.window ",
                                                   absl::FormatDuration(flap.window),
                                                   " is not more than 0s and at most 24h"));
  }
  if (flap.backoff < absl::Seconds(1) || flap.max_backoff < flap.backoff ||
      flap.max_backoff > absl::Hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flap_damping.backoff ", absl::FormatDuration(flap.backoff), " and max_backoff ",
        absl::FormatDuration(flap.max_backoff),
        ": the backoff must be at least 1s, and max_backoff at least the backoff and at most 24h"));
  }
  if (probe.misses < 1 || probe.misses > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend_probe.misses ", probe.misses, " is not between 1 and 100"));
  }
  return absl::OkStatus();
}

// Renames, device-ID maps and compact IDs: valid resource names, and no
// two backend devices mapped to one ID.
absl::Status CheckRenamesAndIds(const ProxyConfig& c) {
  for (const auto& [from, to] : c.renames) {
    if (absl::Status s = ValidateResourceName(to); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rename ", from, " -> ", to, ": ", s.message()));
    }
  }
  for (const auto& [resource, map] : c.id_maps) {
    if (absl::Status s = ValidateResourceName(resource); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("id map: ", s.message()));
    }
    std::set<std::string> targets;
    for (const auto& [from, to] : map) {
      if (from.empty() || to.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("id map of ", resource, ": device IDs must not be empty"));
      }
      if (!targets.insert(to).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "id map of ", resource, ": two backend devices map to \"", to, "\""));
      }
    }
  }
  // Two resources' maps onto one ID: a kubelet before 1.37 puts one's
  // device health on the other's pods (kubernetes#140323).
  std::map<std::string, std::string> mapped_to;  // target ID -> resource
  for (const auto& [resource, map] : c.id_maps) {
    for (const auto& [from, to] : map) {
      auto [it, fresh] = mapped_to.try_emplace(to, resource);
      if (!fresh && it->second != resource) {
        return absl::InvalidArgumentError(absl::StrCat(
            "id maps of ", it->second, " and ", resource, " both map a device to \"", to,
            "\": a kubelet before 1.37 would show one resource's device health on the other's "
            "pods; give each resource IDs of its own"));
      }
    }
  }
  for (const std::string& resource : c.compact_ids) {
    if (absl::Status s = ValidateResourceName(resource); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("compact IDs: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Static backends: a valid resource name and an absolute socket path.
absl::Status CheckStaticBackends(const ProxyConfig& c) {
  for (const StaticBackendConfig& b : c.static_backends) {
    if (absl::Status s = ValidateResourceName(b.resource); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("static backend: ", s.message()));
    }
    if (b.endpoint.empty() || b.endpoint[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "static backend ", b.resource, ": endpoint \"", b.endpoint,
          "\" must be an absolute socket path"));
    }
    DPP_RETURN_IF_ERROR(ValidateSocketPath(b.endpoint));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const ProxyConfig& c) {
  // In this order: the first problem found is the one reported.
  for (absl::Status (*check)(const ProxyConfig&) :
       {CheckAddresses, CheckTakeover, CheckDra, CheckPluginDirectory, CheckLimits,
        CheckStateDirectory, CheckPolicy, CheckRenamesAndIds, CheckStaticBackends}) {
    DPP_RETURN_IF_ERROR(check(c));
  }
  return absl::OkStatus();
}

void NodeNameFromEnvironment(ProxyConfig* config) {
  if (!ServesDra(*config) || !config->dra.node_name.empty()) return;
  if (const char* n = ::getenv("NODE_NAME"); n != nullptr) config->dra.node_name = n;
}

}  // namespace dpproxy
