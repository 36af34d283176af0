// File: proxy_config.h
//
// Everything dpproxy is told: where the kubelet and the plugins are, which
// APIs to speak, policies, limits and files. Plain values with defaults,
// and one validation that names the field and the problem. No gRPC, no
// server: flags (flags.h) and the YAML file (config_file.h) fill it in, and
// every other part takes the piece it needs.
//
//   ProxyConfig c;
//   c.kubelet.kubelet_root = "/var/snap/microk8s/common/var/lib/kubelet";
//   DPP_RETURN_IF_ERROR(ValidateConfig(c));
#ifndef DPPROXY_PROXY_CONFIG_PROXY_CONFIG_H_
#define DPPROXY_PROXY_CONFIG_PROXY_CONFIG_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proxy/config/api_version.h"

namespace dpproxy {

enum class KubeletRegistration {
  kKubeletSocket,  // Register at <kubelet_root>/device-plugins/kubelet.sock
  kPluginWatcher,  // a socket in <kubelet_root>/plugins_registry/
};

// The kubelet side: one device plugin per resource.
struct KubeletSideOptions {
  std::string kubelet_root = "/var/lib/kubelet";
  // nullopt: negotiate (v1beta1 first, then v1alpha).
  std::optional<ApiVersion> api;
  KubeletRegistration registration = KubeletRegistration::kKubeletSocket;
  // Deadline of every call the proxy makes to a backend.
  absl::Duration backend_timeout = absl::Seconds(30);
  // Also express CDI devices as a "cdi.k8s.io/..." container annotation, for
  // runtimes driven by kubelets that predate the cdi_devices field.
  bool cdi_annotations = false;
  // Which of two names the kubelet-facing sockets have:
  // dpproxy-<resource>.sock (0) or dpproxy-<resource>.1.sock (1). A dpproxy
  // that takes over from a running one (--takeover) serves on the other
  // name, so that both serve while the kubelet moves to the new one.
  int socket_generation = 0;
};

// <kubelet_root>/device-plugins and the kubelet.sock in it.
std::string DevicePluginDir(const KubeletSideOptions& o);
std::string KubeletSocketPath(const KubeletSideOptions& o);
// The kubelet's pod-resources API: <kubelet_root>/pod-resources/kubelet.sock.
std::string KubeletPodResourcesSocket(const KubeletSideOptions& o);

enum class LossPolicy {
  // Report every device Unhealthy once the backend has been lost for
  // `grace` (1 s by default): no new pod gets a device nobody answers for,
  // and a plugin that restarts itself within the grace (on a kubelet.sock
  // it saw created, say) is no flap in the kubelet's view. The default.
  kUnhealthy,
  // Keep reporting the last known health for `hold`, then Unhealthy: rides
  // out a quick plugin restart without the kubelet seeing a flap.
  kHold,
};

// The watchdog's asks of a backend (backend_watchdog.h): a plugin that
// holds its stream open but answers nothing for `misses` asks in a row,
// each given `timeout`, asked every `interval`, is treated as lost. The
// ask is a method no plugin serves, which the plugin's gRPC server answers
// (Unimplemented) without calling the plugin's code: a plugin slow under
// load still answers it well within 10 s (the kubelet itself gives a
// plugin 10 s to answer its dial), and a plugin that crashes when asked
// for its options is never asked. With the defaults a plugin is declared
// silent after 30 to 40 s without an answer.
struct BackendProbe {
  absl::Duration interval = absl::Seconds(10);  // zero: no watchdog
  absl::Duration timeout = absl::Seconds(10);
  int misses = 3;
};

// Damping of devices whose health flaps (flap_damper.h): a device that
// turns Unhealthy more than `flaps` times within `window` is held
// Unhealthy for `backoff`, doubled by each further turn while held, up to
// `max_backoff`. `flaps` 0: off, health passes through as the plugin
// reports it.
struct FlapDamping {
  int flaps = 0;
  absl::Duration window = absl::Minutes(5);
  absl::Duration backoff = absl::Minutes(1);
  absl::Duration max_backoff = absl::Minutes(30);
};

struct ResourcePolicy {
  LossPolicy loss_policy = LossPolicy::kUnhealthy;
  absl::Duration hold = absl::ZeroDuration();
  // kUnhealthy's grace (backend_loss.grace); 0: Unhealthy at once.
  absl::Duration grace = absl::Seconds(1);
  BackendProbe probe;
  FlapDamping flap_damping;
  // Backend device ID -> the ID the kubelet sees, for a backend that names
  // devices differently from its predecessor (indexes vs UUIDs). IDs not in
  // the map pass through unchanged.
  std::map<std::string, std::string> id_map;
  // Show the kubelet a short ID for every device the map does not name:
  // "c" and 13 base32 characters of a hash of the backend's ID, the same in
  // every run (nothing to persist), for lists that would not fit the
  // kubelet's 4 MiB otherwise. Allocations are mapped back exactly.
  bool compact_ids = false;
};

// A plugin that cannot be pointed at dpproxy's registration socket: dialled
// by dpproxy instead.
struct StaticBackendConfig {
  std::string resource;  // as the plugin names it (before renames)
  std::string endpoint;  // absolute socket path
  // nullopt: probe which DevicePlugin service answers.
  std::optional<ApiVersion> api;
};

// What the kubelet is told about remembered devices after a proxy restart,
// until their backend is back.
enum class RestorePolicy {
  // Remembered health for `restore_hold`: a kubelet that re-admits pods in
  // that window (node reboot, kubelet restart) finds their devices healthy.
  kTrust,
  // Unhealthy at once: no pod is admitted to a device nobody answers for,
  // but pods re-admitted before the backend is back fail with
  // UnexpectedAdmissionError.
  kUnhealthy,
};

// The largest message dpproxy accepts from a plugin by default: device
// lists of sliced GPUs reach tens of MiB, far past gRPC's 4 MiB default.
inline constexpr int kDefaultBackendMaxListBytes = 256 << 20;
// The largest answer taken from the API server (DRA mode).
inline constexpr int kDefaultApiMaxBodyBytes = 16 << 20;

// DRA mode (kubelet.api: dra): each backend resource is published as the
// DRA devices of one driver (ResourceSlices in the API server) and claims
// are prepared through the kubelet's DRA service, instead of registering a
// device plugin with the kubelet (docs/dra.md).
struct DraOptions {
  bool enabled = false;
  std::string driver;     // a DNS subdomain, e.g. gpu.vendor.com
  std::string node_name;  // the node's name in the API
  std::string kubeconfig;  // "" = in-cluster (service account)
  std::string cdi_dir = "/var/run/cdi";
  // A resource that leaves the device manager for DRA (a reload of
  // `paths`) is withdrawn behind a NoSchedule taint on the node, lowered
  // once the node's status shows the move (move_fence.h): no pod routed by
  // the stale status is refused. Needs `update` on nodes.
  bool move_fence = true;
};

// How the kubelet is served one resource: as a device plugin (an
// extended resource), through DRA (the driver's ResourceSlices and
// claims), or both at once. Whichever path a pod comes by, its devices are
// allocated by the resource's one allocator: a device held on one path is
// refused on the other, with its holder named.
enum class KubeletPath { kDevicePlugin, kDra, kBoth };

// "device-plugin", "dra", "both".
const char* KubeletPathName(KubeletPath p);

struct ProxyConfig {
  KubeletSideOptions kubelet;
  // dra.enabled (kubelet.api: dra) makes DRA the path of every resource
  // `paths` does not name; otherwise that is the device plugin.
  DraOptions dra;
  // Kubelet-facing resource name -> its path, where it is not the default.
  std::map<std::string, KubeletPath> paths;
  // Where vendor plugins register (kubelet.sock) and put their sockets.
  std::string plugin_dir = "/var/lib/dpproxy/device-plugins";
  absl::Duration dial_timeout = absl::Seconds(10);
  // The largest message accepted from a plugin (a device list); the
  // kubelet's own limit is 4 MiB, which dpproxy reports, not enforces.
  int backend_max_list_bytes = kDefaultBackendMaxListBytes;
  int api_max_body_bytes = kDefaultApiMaxBodyBytes;
  ResourcePolicy policy;
  // Backend resource name -> name toward the kubelet.
  std::map<std::string, std::string> renames;
  // Kubelet-facing resource -> (backend device ID -> kubelet device ID).
  std::map<std::string, std::map<std::string, std::string>> id_maps;
  // Kubelet-facing resources whose device IDs are shown compact
  // (ResourcePolicy::compact_ids). Switching it on or off changes the IDs
  // the kubelet knows: do it before pods use the resource.
  std::set<std::string> compact_ids;
  std::vector<StaticBackendConfig> static_backends;
  // The status as JSON, rewritten (atomically) whenever it changes; "" = none.
  std::string status_file;
  // Where dpproxy serves the pod-resources API with claims' devices added
  // as device-plugin devices (pod_resources_view.h); empty: not served.
  std::string pod_resources_socket;
  // The container runtime's CRI endpoint (a Unix socket path, or
  // unix://PATH), read-only: which containers run. "" or nothing listening
  // there: not asked (Reconciler::Options::container_runtime_socket).
  std::string container_runtime_endpoint;
  // Durable state (<state_dir>/state.pb); "" = keep nothing on disk.
  std::string state_dir;
  // How long a start waits for <state_dir>/lock, held by another dpproxy
  // (a previous one may still be shutting down); then it fails.
  absl::Duration state_lock_wait = absl::Seconds(10);
  // If another dpproxy holds the state directory, take it over without a
  // gap instead of waiting for it to exit (proxy/handoff/handoff.proto):
  // it hands the state over, forwards the kubelet's Allocates while this
  // one registers, and exits once this one is registered for every
  // resource. Device-plugin mode only.
  bool takeover = false;
  // After a handoff's Release, how long the old dpproxy waits for the new
  // one to serve; then it stops (a restart serves again). Not a flag: the
  // new one loads and serves in well under a second; tests shorten it.
  absl::Duration handoff_timeout = absl::Seconds(60);
  RestorePolicy restore_policy = RestorePolicy::kTrust;
  absl::Duration restore_hold = absl::Minutes(5);
  // Reconciliation with the kubelet's pod-resources API
  // (<kubelet_root>/pod-resources/kubelet.sock): shortly after start and
  // then every interval; 0 turns it off. Journal entries whose devices no
  // pod holds in two consecutive answers, and that are older than the grace,
  // are released.
  absl::Duration reconcile_interval = absl::Minutes(1);
  absl::Duration reconcile_grace = absl::Minutes(5);
  // For this long after the kubelet starts (kubelet.sock created), a pod
  // missing from its pod-resources List is not taken as gone: the List is
  // empty, then incomplete, for about a second after a start.
  absl::Duration reconcile_start_grace = absl::Seconds(10);
  // Group allowed to use the backend registration socket (mode 0660); ""
  // keeps it 0700 (root's plugins only). Name or number.
  std::string socket_group;
  // Prometheus endpoint (host:port) served by the dpproxy binary; "" = none.
  std::string metrics_address;
};

// kInvalidArgument naming the field and the problem.
absl::Status ValidateConfig(const ProxyConfig& config);

// DRA mode without a node name takes NODE_NAME from the environment (in a
// DaemonSet, the downward API's spec.nodeName), whether the rest came from
// flags or a file.
void NodeNameFromEnvironment(ProxyConfig* config);

// The path of a kubelet-facing resource (`paths`, else the default).
KubeletPath PathOf(const ProxyConfig& config, const std::string& resource);
// Whether some resource is served as a device plugin, or through DRA: the
// kubelet sides dpproxy runs.
bool ServesDevicePlugins(const ProxyConfig& config);
bool ServesDra(const ProxyConfig& config);

// The name the kubelet sees for a backend resource (after renames).
std::string KubeletResourceName(const ProxyConfig& config, const std::string& backend_resource);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CONFIG_PROXY_CONFIG_H_
