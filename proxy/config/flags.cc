#include "proxy/config/flags.h"

#include <gflags/gflags.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proxy/cli/cli.h"
#include "proxy/config/config_file.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"

DEFINE_string(kubelet_root, "/var/lib/kubelet",
              "Kubelet root directory (k3s, k0s and snaps move it). The proxy serves its\n"
              "sockets in <root>/device-plugins/ and registers at\n"
              "<root>/device-plugins/kubelet.sock, or uses <root>/plugins_registry/.");
DEFINE_string(plugin_dir, "/var/lib/dpproxy/device-plugins",
              "Directory where vendor plugins register with the proxy: point a plugin's\n"
              "kubelet socket at <plugin_dir>/kubelet.sock. Must not be the kubelet's own.");
DEFINE_string(kubelet_api, "auto",
              "API toward the kubelet: auto (try v1beta1, then v1alpha), v1beta1 or\n"
              "v1alpha (pin it), or dra: publish the resources as the DRA devices of\n"
              "--dra_driver instead of registering device plugins (docs/dra.md).");
DEFINE_string(dra_driver, "",
              "With --kubelet_api=dra: the DRA driver's name, a DNS subdomain\n"
              "(e.g. gpu.vendor.com).");
DEFINE_string(node_name, "",
              "With --kubelet_api=dra: this node's name in the API. Empty: $NODE_NAME.");
DEFINE_string(kubeconfig, "",
              "With --kubelet_api=dra: a kubeconfig for the API server. Empty: the pod's\n"
              "service account (in-cluster).");
DEFINE_string(cdi_dir, "/var/run/cdi",
              "With --kubelet_api=dra: where the claims' CDI specs are written.");
DEFINE_bool(dra_move_fence, true,
            "With DRA on: a resource moved from the device plugin to DRA by a reload is\n"
            "withdrawn behind a NoSchedule taint on the node (dpproxy/moving), lowered once\n"
            "the node's status shows the move, so that no pod routed by the stale status\n"
            "fails. Needs update on nodes; without it the move is made at once.");
DEFINE_string(kubelet_registration, "kubelet",
              "How to register with the kubelet: kubelet (Register at kubelet.sock) or\n"
              "plugin-watcher (a socket in <kubelet_root>/plugins_registry/).");
DEFINE_string(backend_timeout, "30s",
              "Deadline of every call to a backend plugin (the kubelet sets none on Allocate).");
DEFINE_string(dial_timeout, "10s", "How long to wait for a registering plugin's socket.");
DEFINE_int32(backend_max_list_mib, 256,
             "The largest message (device list) accepted from a plugin, in MiB (4-2047).\n"
             "The kubelet accepts at most 4 MiB: a larger list is reported (log, event,\n"
             "metric, status), see docs/configuration.md.");
DEFINE_int32(api_max_body_mib, 16,
             "DRA mode: the largest answer taken from the API server, in MiB (1-1024);\n"
             "a larger one fails that call.");
DEFINE_string(backend_loss_policy, "unhealthy",
              "What the kubelet sees while a backend is away: unhealthy (every device\n"
              "Unhealthy once it has been away --backend_loss_grace) or hold (last known\n"
              "health for --backend_hold, then Unhealthy). Device IDs never change because\n"
              "a backend went away.");
DEFINE_string(backend_loss_grace, "1s",
              "With --backend_loss_policy=unhealthy: how long a lost backend's devices keep\n"
              "their health before they are reported Unhealthy, so that a plugin restarting\n"
              "itself is no flap to the kubelet. 0s: at once.");
DEFINE_string(backend_hold, "30s", "Hold time for --backend_loss_policy=hold.");
DEFINE_string(backend_probe_interval, "10s",
              "How often dpproxy asks each plugin's gRPC server a call it does not serve\n"
              "(answered Unimplemented at once), to catch a plugin that holds its stream\n"
              "open but answers no call (a hung or stopped process). After --backend_probe_misses asks in a row without an\n"
              "answer the plugin is treated as lost (--backend_loss_policy) until it answers\n"
              "again. 0s: never asked. At least 1s.");
DEFINE_string(backend_probe_timeout, "10s",
              "How long each of those asks waits for an answer. A plugin slow under load\n"
              "still answers this call well within 10s.");
DEFINE_int32(flap_damping_flaps, 0,
             "Damp devices whose health flaps: a device that turns Unhealthy more than\n"
             "this many times within --flap_damping_window is held Unhealthy for\n"
             "--flap_damping_backoff, doubled by each further turn while held (up to\n"
             "--flap_damping_max_backoff), and reported once per episode. 0: off, health\n"
             "passes through as the plugin reports it.");
DEFINE_string(flap_damping_window, "5m", "See --flap_damping_flaps.");
DEFINE_string(flap_damping_backoff, "1m", "See --flap_damping_flaps.");
DEFINE_string(flap_damping_max_backoff, "30m", "See --flap_damping_flaps.");
DEFINE_int32(backend_probe_misses, 3,
             "Unanswered asks in a row that make a plugin silent (1-100). With the\n"
             "defaults, a plugin silent for 30-40s is treated as lost.");
DEFINE_string(rename, "",
              "Serve backend resources under other names, comma-separated FROM=TO, e.g.\n"
              "\"legacy.com/gpu=vendor.com/gpu\".");
DEFINE_string(static_backend, "",
              "Plugins that cannot be pointed at the proxy, comma-separated\n"
              "RESOURCE=SOCKET[@API] with API v1alpha, v1beta1 or auto (default), e.g.\n"
              "\"vendor.com/gpu=/run/vendor/gpu.sock@v1alpha\". Reconnected once a second\n"
              "while away.");
DEFINE_string(compact_ids, "",
              "Resources (comma-separated, names the kubelet sees) whose device IDs the\n"
              "kubelet is shown in a short form (\"c\" + 13 characters, the same in every\n"
              "run), so that lists of long IDs fit the kubelet's 4 MiB. Allocations reach\n"
              "the plugin with its own IDs. Set it before pods use the resource.");
DEFINE_bool(cdi_annotations, false,
            "Also express a backend's CDI devices as a cdi.k8s.io/ container annotation,\n"
            "for kubelets that predate the cdi_devices field (1.27 and older).");
DEFINE_string(events, "", "Append JSON-lines lifecycle events to this file. Empty: none.");
DEFINE_bool(check, false,
            "Validate the configuration (flags and --config file), print it as the file's\n"
            "YAML with every setting in effect, and exit: 0 if valid, 2 (naming the\n"
            "file:line or flag) if not. Nothing is started.");
DEFINE_string(log_format, "text",
              "text: klog's text lines on stderr (I1127 05:42:31.123456  12345 file.cc:42] msg).\n"
              "json: klog's JSON format, one object per line on stderr (ts, caller, msg,\n"
              "v or err), lifecycle events among them with their fields (resource,\n"
              "kubelet_api, backend_api, socket, ...) as keys.");
DEFINE_string(config, "",
              "YAML configuration file (docs/configuration.md). Flags given on the\n"
              "command line override it; list flags (--rename, --static_backend) add to it.");
DEFINE_string(status_file, "/var/lib/dpproxy/status.json",
              "Where dpproxy keeps its status (resources, negotiated versions, backends,\n"
              "devices, lossy-translation counts) as JSON, rewritten on change; read by\n"
              "`dpproxy status`. Unless given, <state_dir>/status.json. Empty: none.");
DEFINE_string(pod_resources_socket, "",
              "Serve the kubelet's pod-resources API (List, Get, GetAllocatableResources)\n"
              "at this Unix socket, with each device a DRA claim of dpproxy's driver gave a\n"
              "container also listed the device-plugin way (resource name, plugin's device\n"
              "ID), for monitoring agents that read devices by resource. Empty: not served.");
DEFINE_string(container_runtime_endpoint, "/run/containerd/containerd.sock",
              "The container runtime's CRI socket (PATH or unix://PATH), asked read-only\n"
              "(ListContainers) which containers run: the holder of a device the kubelet\n"
              "forgot holds it only while its container runs. Nothing listening there, or\n"
              "empty: the kubelet's own sources decide (CRI-O: /var/run/crio/crio.sock).");
DEFINE_string(output, "table", "For `dpproxy status`: table or json.");
DEFINE_string(wait_timeout, "60s",
              "For `dpproxy wait`: how long to wait for <plugin_dir>/kubelet.sock.");
DEFINE_string(state_dir, "/var/lib/dpproxy",
              "Durable state (<state_dir>/state.pb): negotiated versions, backends, last\n"
              "device lists and every allocation the kubelet was answered. Must not be a\n"
              "device-plugins directory. Empty: keep nothing on disk.");
DEFINE_bool(takeover, false,
            "If another dpproxy runs on this --state_dir, take over from it without a\n"
            "gap: it hands the state over, forwards the kubelet's Allocates to this one\n"
            "while this one registers on its own sockets, and exits once this one is\n"
            "registered for every resource (an upgrade beside the running one; see\n"
            "docs/upgrade.md). Without it, a start waits for the other one to exit.");
DEFINE_string(after_handoff, "exit",
              "What a dpproxy does once it has handed over to one started with --takeover:\n"
              "exit (0), or wait: close everything and wait for SIGTERM before exiting,\n"
              "for a container whose restart policy would start it again (the Helm\n"
              "chart's surge rollout).");
DEFINE_string(restore_policy, "trust",
              "After a dpproxy restart, what the kubelet is told about remembered devices\n"
              "until their backend is back: trust (their remembered health, for\n"
              "--restore_hold) or unhealthy. See docs/configuration.md for the trade-off.");
DEFINE_string(restore_hold, "5m", "How long --restore_policy=trust trusts remembered health.");
DEFINE_string(metrics_address, "127.0.0.1:9464",
              "Serve Prometheus metrics at http://<address>/metrics (host:port; port 0\n"
              "picks a free one, logged at start). Empty: no metrics endpoint. The endpoint\n"
              "has no authentication: an address other than loopback exposes resource\n"
              "names, device counts and pod activity to the network (warned at start).");
DEFINE_string(socket_group, "",
              "Group (name or number) allowed to register plugins: <plugin_dir>/kubelet.sock\n"
              "becomes mode 0660 with this group. Empty: 0700, root's plugins only.\n"
              "dpproxy's sockets toward the kubelet are always 0700.");
DEFINE_string(reconcile_interval, "1m",
              "How often to read the kubelet's pod-resources API to learn which pod holds\n"
              "each allocation and release journal entries of pods that are gone (also\n"
              "shortly after start). 0s turns it off.");
DEFINE_string(reconcile_grace, "5m",
              "Journal entries younger than this are never released by reconciliation.");
DEFINE_string(reconcile_start_grace, "10s",
              "For this long after the kubelet starts, a pod missing from its pod-resources\n"
              "API is not taken as gone (its list is empty, then incomplete, for about a\n"
              "second after a start).");

namespace dpproxy {
namespace {

// Whether a flag applies: every flag, or only those given on the command
// line (so that they override a configuration file).
using FlagFilter = std::function<bool(const char* name)>;

// The flags copied as given, each to its setting.
template <typename T>
struct PlainFlag {
  const char* name;
  const T& value;
  T& (*setting)(ProxyConfig& c);
};

void ApplyPlainFlags(const FlagFilter& set, ProxyConfig* c) {
  const PlainFlag<std::string> strings[] = {
      {"kubelet_root", FLAGS_kubelet_root,
       [](ProxyConfig& c) -> auto& { return c.kubelet.kubelet_root; }},
      {"plugin_dir", FLAGS_plugin_dir, [](ProxyConfig& c) -> auto& { return c.plugin_dir; }},
      {"dra_driver", FLAGS_dra_driver, [](ProxyConfig& c) -> auto& { return c.dra.driver; }},
      {"node_name", FLAGS_node_name, [](ProxyConfig& c) -> auto& { return c.dra.node_name; }},
      {"kubeconfig", FLAGS_kubeconfig, [](ProxyConfig& c) -> auto& { return c.dra.kubeconfig; }},
      {"cdi_dir", FLAGS_cdi_dir, [](ProxyConfig& c) -> auto& { return c.dra.cdi_dir; }},
      {"status_file", FLAGS_status_file, [](ProxyConfig& c) -> auto& { return c.status_file; }},
      {"pod_resources_socket", FLAGS_pod_resources_socket,
       [](ProxyConfig& c) -> auto& { return c.pod_resources_socket; }},
      {"container_runtime_endpoint", FLAGS_container_runtime_endpoint,
       [](ProxyConfig& c) -> auto& { return c.container_runtime_endpoint; }},
      {"state_dir", FLAGS_state_dir, [](ProxyConfig& c) -> auto& { return c.state_dir; }},
      {"metrics_address", FLAGS_metrics_address,
       [](ProxyConfig& c) -> auto& { return c.metrics_address; }},
      {"socket_group", FLAGS_socket_group, [](ProxyConfig& c) -> auto& { return c.socket_group; }},
  };
  for (const PlainFlag<std::string>& f : strings) {
    if (set(f.name)) f.setting(*c) = f.value;
  }
  const PlainFlag<bool> bools[] = {
      {"dra_move_fence", FLAGS_dra_move_fence,
       [](ProxyConfig& c) -> auto& { return c.dra.move_fence; }},
      {"cdi_annotations", FLAGS_cdi_annotations,
       [](ProxyConfig& c) -> auto& { return c.kubelet.cdi_annotations; }},
      {"takeover", FLAGS_takeover, [](ProxyConfig& c) -> auto& { return c.takeover; }},
  };
  for (const PlainFlag<bool>& f : bools) {
    if (set(f.name)) f.setting(*c) = f.value;
  }
}

// The duration flags, each parsed into its setting.
absl::Status ApplyDurationFlags(const FlagFilter& set, ProxyConfig* c) {
  struct DurationFlag {
    const char* name;
    const std::string& value;
    absl::Duration& (*setting)(ProxyConfig& c);
  };
  const DurationFlag flags[] = {
      {"backend_timeout", FLAGS_backend_timeout,
       [](ProxyConfig& c) -> auto& { return c.kubelet.backend_timeout; }},
      {"dial_timeout", FLAGS_dial_timeout, [](ProxyConfig& c) -> auto& { return c.dial_timeout; }},
      {"backend_hold", FLAGS_backend_hold, [](ProxyConfig& c) -> auto& { return c.policy.hold; }},
      {"backend_loss_grace", FLAGS_backend_loss_grace,
       [](ProxyConfig& c) -> auto& { return c.policy.grace; }},
      {"backend_probe_interval", FLAGS_backend_probe_interval,
       [](ProxyConfig& c) -> auto& { return c.policy.probe.interval; }},
      {"backend_probe_timeout", FLAGS_backend_probe_timeout,
       [](ProxyConfig& c) -> auto& { return c.policy.probe.timeout; }},
      {"flap_damping_window", FLAGS_flap_damping_window,
       [](ProxyConfig& c) -> auto& { return c.policy.flap_damping.window; }},
      {"flap_damping_backoff", FLAGS_flap_damping_backoff,
       [](ProxyConfig& c) -> auto& { return c.policy.flap_damping.backoff; }},
      {"flap_damping_max_backoff", FLAGS_flap_damping_max_backoff,
       [](ProxyConfig& c) -> auto& { return c.policy.flap_damping.max_backoff; }},
      {"reconcile_interval", FLAGS_reconcile_interval,
       [](ProxyConfig& c) -> auto& { return c.reconcile_interval; }},
      {"reconcile_grace", FLAGS_reconcile_grace,
       [](ProxyConfig& c) -> auto& { return c.reconcile_grace; }},
      {"reconcile_start_grace", FLAGS_reconcile_start_grace,
       [](ProxyConfig& c) -> auto& { return c.reconcile_start_grace; }},
      {"restore_hold", FLAGS_restore_hold, [](ProxyConfig& c) -> auto& { return c.restore_hold; }},
  };
  for (const DurationFlag& f : flags) {
    if (!set(f.name)) continue;
    DPP_ASSIGN_OR_RETURN(f.setting(*c), ParseFlagDuration(f.name, f.value));
  }
  return absl::OkStatus();
}

// The kubelet's API and how to register with it.
absl::Status ApplyKubeletFlags(const FlagFilter& set, ProxyConfig* c) {
  if (set("kubelet_api")) {
    if (FLAGS_kubelet_api == "dra") {
      c->dra.enabled = true;
      c->kubelet.api.reset();
    } else {
      absl::StatusOr<std::optional<ApiVersion>> api =
          ParseApiVersion(FLAGS_kubelet_api, /*allow_auto=*/true);
      if (!api.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kubelet_api=", api.status().message(), " (or dra)"));
      }
      c->kubelet.api = *api;
      c->dra.enabled = false;
    }
  }
  if (set("kubelet_registration")) {
    if (FLAGS_kubelet_registration == "kubelet") {
      c->kubelet.registration = KubeletRegistration::kKubeletSocket;
    } else if (FLAGS_kubelet_registration == "plugin-watcher") {
      c->kubelet.registration = KubeletRegistration::kPluginWatcher;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kubelet_registration=", FLAGS_kubelet_registration,
          " is not kubelet or plugin-watcher"));
    }
  }
  return absl::OkStatus();
}

// The size limits, and what to do when a backend goes or a state is damaged.
absl::Status ApplyLimitAndPolicyFlags(const FlagFilter& set, ProxyConfig* c) {
  if (set("backend_max_list_mib")) {
    if (FLAGS_backend_max_list_mib < 4 || FLAGS_backend_max_list_mib > 2047) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend_max_list_mib=", FLAGS_backend_max_list_mib, " is not between 4 and 2047"));
    }
    c->backend_max_list_bytes = FLAGS_backend_max_list_mib << 20;
  }
  if (set("backend_probe_misses")) c->policy.probe.misses = FLAGS_backend_probe_misses;
  if (set("flap_damping_flaps")) c->policy.flap_damping.flaps = FLAGS_flap_damping_flaps;
  if (set("api_max_body_mib")) {
    if (FLAGS_api_max_body_mib < 1 || FLAGS_api_max_body_mib > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--api_max_body_mib=", FLAGS_api_max_body_mib, " is not between 1 and 1024"));
    }
    c->api_max_body_bytes = FLAGS_api_max_body_mib << 20;
  }
  if (set("backend_loss_policy")) {
    if (FLAGS_backend_loss_policy == "unhealthy") {
      c->policy.loss_policy = LossPolicy::kUnhealthy;
    } else if (FLAGS_backend_loss_policy == "hold") {
      c->policy.loss_policy = LossPolicy::kHold;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend_loss_policy=", FLAGS_backend_loss_policy, " is not unhealthy or hold"));
    }
  }
  if (set("restore_policy")) {
    if (FLAGS_restore_policy == "trust") {
      c->restore_policy = RestorePolicy::kTrust;
    } else if (FLAGS_restore_policy == "unhealthy") {
      c->restore_policy = RestorePolicy::kUnhealthy;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--restore_policy=", FLAGS_restore_policy, " is not trust or unhealthy"));
    }
  }
  return absl::OkStatus();
}

// The lists: renames, static backends and compact IDs (always applied:
// empty unless given).
absl::Status ApplyListFlags(ProxyConfig* c) {
  for (absl::string_view item : absl::StrSplit(FLAGS_rename, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rename: \"", item, "\" is not FROM=TO"));
    }
    c->renames[kv[0]] = kv[1];
  }
  for (absl::string_view item : absl::StrSplit(FLAGS_static_backend, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--static_backend: \"", item, "\" is not RESOURCE=SOCKET[@API]"));
    }
    StaticBackendConfig sb;
    sb.resource = kv[0];
    std::vector<std::string> ea = absl::StrSplit(kv[1], absl::MaxSplits('@', 1));
    sb.endpoint = ea[0];
    if (ea.size() == 2) {
      absl::StatusOr<std::optional<ApiVersion>> api = ParseApiVersion(ea[1], /*allow_auto=*/true);
      if (!api.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--static_backend ", sb.resource, ": api ", api.status().message()));
      }
      sb.api = *api;
    }
    c->static_backends.push_back(sb);
  }
  for (absl::string_view item : absl::StrSplit(FLAGS_compact_ids, ',', absl::SkipEmpty())) {
    c->compact_ids.insert(std::string(item));
  }
  return absl::OkStatus();
}

// Applies the flags to `c`: every flag, or only those given on the command
// line (so that they override a configuration file).
absl::Status ApplyFlags(bool only_explicit, ProxyConfig* c) {
  const FlagFilter set = [only_explicit](const char* name) {
    return !only_explicit || !gflags::GetCommandLineFlagInfoOrDie(name).is_default;
  };
  ApplyPlainFlags(set, c);
  DPP_RETURN_IF_ERROR(ApplyKubeletFlags(set, c));
  DPP_RETURN_IF_ERROR(ApplyDurationFlags(set, c));
  DPP_RETURN_IF_ERROR(ApplyLimitAndPolicyFlags(set, c));
  return ApplyListFlags(c);
}

}  // namespace

absl::StatusOr<ProxyConfig> ConfigFromFlags() {
  ProxyConfig c;
  DPP_RETURN_IF_ERROR(ApplyFlags(/*only_explicit=*/false, &c));  // flag defaults
  bool status_file_named = !gflags::GetCommandLineFlagInfoOrDie("status_file").is_default;
  if (!FLAGS_config.empty()) {
    c.renames.clear();
    c.static_backends.clear();
    c.compact_ids.clear();
    // Whether the file names a status file (no path is this one).
    const std::string unset(1, '\0');
    const std::string before = c.status_file;
    c.status_file = unset;
    DPP_RETURN_IF_ERROR(LoadConfigFile(FLAGS_config, &c));
    if (c.status_file == unset) {
      c.status_file = before;
    } else {
      status_file_named = true;
    }
    DPP_RETURN_IF_ERROR(ApplyFlags(/*only_explicit=*/true, &c));
  }
  // The status file follows the state directory unless it was named.
  if (!status_file_named) c.status_file = DefaultStatusFile(c.state_dir);
  NodeNameFromEnvironment(&c);
  DPP_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

std::string DefaultStatusFile(const std::string& state_dir) {
  return JoinPath(state_dir.empty() ? std::string("/var/lib/dpproxy") : state_dir,
                  "status.json");
}

}  // namespace dpproxy
