// dpproxy: bridges Kubernetes device-plugin API versions. Only this file
// touches gflags; everything else takes a ProxyConfig.
#include <sys/stat.h>

#include <iostream>
#include <string>

#include <gflags/gflags.h>
#include <prometheus/exposer.h>
#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "proxy/cli/cli.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"
#include "proxy/config/config_file.h"
#include "proxy/server/metrics.h"
#include "proxy/server/proxy_server.h"

DEFINE_string(kubelet_root, "/var/lib/kubelet",
              "Kubelet root directory (k3s, k0s and snaps move it). The proxy serves its\n"
              "sockets in <root>/device-plugins/ and registers at\n"
              "<root>/device-plugins/kubelet.sock, or uses <root>/plugins_registry/.");
DEFINE_string(plugin_dir, "/var/lib/dpproxy/device-plugins",
              "Directory where vendor plugins register with the proxy: point a plugin's\n"
              "kubelet socket at <plugin_dir>/kubelet.sock. Must not be the kubelet's own.");
DEFINE_string(kubelet_api, "auto",
              "Device-plugin API toward the kubelet: auto (try v1beta1, then v1alpha),\n"
              "v1beta1 or v1alpha (pin it).");
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
DEFINE_string(backend_loss_policy, "unhealthy",
              "What the kubelet sees while a backend is away: unhealthy (every device\n"
              "Unhealthy at once) or hold (last known health for --backend_hold, then\n"
              "Unhealthy). Device IDs never change because a backend went away.");
DEFINE_string(backend_hold, "30s", "Hold time for --backend_loss_policy=hold.");
DEFINE_string(rename, "",
              "Serve backend resources under other names, comma-separated FROM=TO, e.g.\n"
              "\"legacy.com/gpu=vendor.com/gpu\".");
DEFINE_string(static_backend, "",
              "Plugins that cannot be pointed at the proxy, comma-separated\n"
              "RESOURCE=SOCKET[@API] with API v1alpha, v1beta1 or auto (default), e.g.\n"
              "\"vendor.com/gpu=/run/vendor/gpu.sock@v1alpha\". Reconnected once a second\n"
              "while away.");
DEFINE_bool(cdi_annotations, false,
            "Also express a backend's CDI devices as a cdi.k8s.io/ container annotation,\n"
            "for kubelets that predate the cdi_devices field (1.27 and older).");
DEFINE_string(events, "", "Append JSON-lines lifecycle events to this file. Empty: none.");
DEFINE_string(config, "",
              "YAML configuration file (docs/configuration.md). Flags given on the\n"
              "command line override it; list flags (--rename, --static_backend) add to it.");
DEFINE_string(status_file, "/var/lib/dpproxy/status.json",
              "Where dpproxy keeps its status (resources, negotiated versions, backends,\n"
              "devices, lossy-translation counts) as JSON, rewritten on change; read by\n"
              "`dpproxy status`. Empty: none.");
DEFINE_string(output, "table", "For `dpproxy status`: table or json.");
DEFINE_string(state_dir, "/var/lib/dpproxy",
              "Durable state (<state_dir>/state.pb): negotiated versions, backends, last\n"
              "device lists and every allocation the kubelet was answered. Must not be a\n"
              "device-plugins directory. Empty: keep nothing on disk.");
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

namespace dpproxy {
namespace {

constexpr char kUsage[] = R"(dpproxy: bridges Kubernetes device-plugin API versions.

Usage:
  dpproxy [flags]                 run the proxy
  dpproxy status [--status_file=F] [--output=table|json]
                                  show what a running dpproxy is doing

Toward the kubelet, dpproxy registers one device plugin per resource in
whichever API the kubelet accepts (v1alpha of 1.9, v1beta1 from 1.10,
synchronous registration from 1.25, or the plugin watcher). Toward vendor
plugins it is a kubelet: point a plugin's kubelet socket at
<plugin_dir>/kubelet.sock and it registers there, in v1alpha ("v1alpha2")
or v1beta1, unchanged. Every call is translated (see docs/translation.md).
SIGTERM or SIGINT stop it cleanly. Logs go to glog (--logtostderr, -v=1 for
per-call detail).

Example:
  dpproxy --kubelet_root=/var/lib/kubelet --plugin_dir=/var/lib/dpproxy/device-plugins

Flags:
)";

// Applies the flags to `c`: every flag, or only those given on the command
// line (so that they override a configuration file).
absl::Status ApplyFlags(bool only_explicit, ProxyConfig* c) {
  auto set = [&](const char* name) {
    return !only_explicit || !gflags::GetCommandLineFlagInfoOrDie(name).is_default;
  };
  if (set("kubelet_root")) c->kubelet.kubelet_root = FLAGS_kubelet_root;
  if (set("plugin_dir")) c->plugin_dir = FLAGS_plugin_dir;
  if (set("kubelet_api")) {
    absl::StatusOr<std::optional<ApiVersion>> api =
        ParseApiVersion(FLAGS_kubelet_api, /*allow_auto=*/true);
    if (!api.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kubelet_api=", api.status().message()));
    }
    c->kubelet.api = *api;
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
  if (set("backend_timeout")) {
    DPP_ASSIGN_OR_RETURN(c->kubelet.backend_timeout,
                         ParseFlagDuration("backend_timeout", FLAGS_backend_timeout));
  }
  if (set("backend_max_list_mib")) {
    if (FLAGS_backend_max_list_mib < 4 || FLAGS_backend_max_list_mib > 2047) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--backend_max_list_mib=", FLAGS_backend_max_list_mib, " is not between 4 and 2047"));
    }
    c->backend_max_list_bytes = FLAGS_backend_max_list_mib << 20;
  }
  if (set("dial_timeout")) {
    DPP_ASSIGN_OR_RETURN(c->dial_timeout, ParseFlagDuration("dial_timeout", FLAGS_dial_timeout));
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
  if (set("backend_hold")) {
    DPP_ASSIGN_OR_RETURN(c->policy.hold, ParseFlagDuration("backend_hold", FLAGS_backend_hold));
  }
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
  if (set("cdi_annotations")) c->kubelet.cdi_annotations = FLAGS_cdi_annotations;
  if (set("status_file")) c->status_file = FLAGS_status_file;
  if (set("state_dir")) c->state_dir = FLAGS_state_dir;
  if (set("metrics_address")) c->metrics_address = FLAGS_metrics_address;
  if (set("socket_group")) c->socket_group = FLAGS_socket_group;
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
  if (set("reconcile_interval")) {
    DPP_ASSIGN_OR_RETURN(c->reconcile_interval,
                         ParseFlagDuration("reconcile_interval", FLAGS_reconcile_interval));
  }
  if (set("reconcile_grace")) {
    DPP_ASSIGN_OR_RETURN(c->reconcile_grace,
                         ParseFlagDuration("reconcile_grace", FLAGS_reconcile_grace));
  }
  if (set("restore_hold")) {
    DPP_ASSIGN_OR_RETURN(c->restore_hold, ParseFlagDuration("restore_hold", FLAGS_restore_hold));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProxyConfig> ConfigFromFlags() {
  ProxyConfig c;
  DPP_RETURN_IF_ERROR(ApplyFlags(/*only_explicit=*/false, &c));  // flag defaults
  if (!FLAGS_config.empty()) {
    c.renames.clear();
    c.static_backends.clear();
    DPP_RETURN_IF_ERROR(LoadConfigFile(FLAGS_config, &c));
    DPP_RETURN_IF_ERROR(ApplyFlags(/*only_explicit=*/true, &c));
  }
  DPP_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

int PrintStatus() {
  absl::StatusOr<std::string> text = ReadFile(FLAGS_status_file);
  if (!text.ok()) {
    std::cerr << "dpproxy: no status at " << FLAGS_status_file
              << " (is dpproxy running with this --status_file?): " << text.status().message()
              << "\n";
    return 1;
  }
  Json st = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (st.is_discarded() || !st.is_object()) {
    std::cerr << "dpproxy: " << FLAGS_status_file << " is not a status file\n";
    return 1;
  }
  if (FLAGS_output == "json") {
    std::cout << st.dump(2) << "\n";
    return 0;
  }
  if (FLAGS_output != "table") {
    std::cerr << "dpproxy: --output=" << FLAGS_output << " is not table or json\n";
    return 2;
  }
  std::cout << "dpproxy pid " << st.value("pid", 0) << ", kubelet root "
            << st.value("kubelet_root", "") << ", plugins register at "
            << st.value("plugin_socket", "") << "\n\n";
  std::cout << absl::StrFormat("%-28s %-26s %-9s %-40s %s\n", "RESOURCE", "KUBELET API",
                               "BACKEND", "BACKEND ENDPOINT", "DEVICES");
  for (const Json& r : st.value("resources", Json::array())) {
    std::string backend = r.value("backend_connected", false) ? r.value("backend_api", "")
                                                              : std::string("down");
    std::cout << absl::StrFormat(
        "%-28s %-26s %-9s %-40s %d/%d healthy\n", r.value("resource", ""),
        r.value("kubelet_api", "").empty() ? "(not registered)" : r.value("kubelet_api", ""),
        backend, r.value("backend_endpoint", "").empty() ? "-" : r.value("backend_endpoint", ""),
        r.value("devices_healthy", 0), r.value("devices_total", 0));
    if (r.value("device_list_too_large", false)) {
      std::cout << absl::StrFormat(
          "  ^ DEVICE LIST TOO LARGE for the kubelet: %d bytes, the kubelet accepts %d; it "
          "sees no devices of this resource\n",
          r.value("device_list_bytes", 0), Resource::kKubeletMaxListBytes);
    }
  }
  const Json state = st.value("state", Json());
  if (state.is_object()) {
    std::cout << "\nstate " << state.value("path", "") << ": "
              << state.value("allocations", 0) << " allocation(s), ";
    if (state.value("writable", true)) {
      std::cout << "writable";
    } else {
      std::cout << "NOT WRITABLE (every Allocate is refused until it is): "
                << state.value("last_write_error", "");
    }
    std::cout << ", " << state.value("save_failures", 0) << " failed write(s)\n";
  }
  const Json quarantined = st.value("quarantined", Json::array());
  if (!quarantined.empty()) {
    std::cout << "\nQUARANTINED (reported Unhealthy until the pod is gone):\n";
    for (const Json& q : quarantined) {
      std::string devices;
      for (const Json& d : q.value("devices", Json::array())) {
        devices += (devices.empty() ? "" : ",") + d.get<std::string>();
      }
      std::string pod = q.value("pod", "");
      if (pod.empty()) {
        pod = q.value("pod_uid", "").empty()
                  ? absl::StrCat("allocation ", q.value("allocation", 0), " (pod unknown)")
                  : absl::StrCat("pod UID ", q.value("pod_uid", ""));
      } else if (!q.value("container", "").empty()) {
        pod += "/" + q.value("container", "");
      }
      std::cout << "  " << q.value("resource", "") << " " << devices << " held by " << pod
                << ": " << q.value("reason", "") << "\n";
    }
  }
  if (st.value("devices_held_twice", 0) > 0) {
    std::cout << "\n" << st.value("devices_held_twice", 0)
              << " device(s) found held by two pods (see the device_held_twice events)\n";
  }
  const Json losses = st.value("lossy_translations", Json::object());
  if (!losses.empty()) std::cout << "\nlossy translations: " << losses.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  std::string command = "run";
  if (argc >= 2 && argv[1][0] != '-') {
    command = argv[1];
    dpproxy::ShiftArgs(&argc, argv);
  }
  if (command != "run" && command != "status" && command != "help") {
    std::cerr << "dpproxy: unknown subcommand \"" << command << "\"; see dpproxy --help\n";
    return 2;
  }
  if (dpproxy::WantsHelp(argc, argv) || command == "help") {
    std::cout << dpproxy::kUsage << dpproxy::FlagsHelp({"proxy/main.cc"});
    return 0;
  }
  dpproxy::NormalizeFlagDashes(argc, argv);
  gflags::SetUsageMessage("see dpproxy --help");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::cerr << "dpproxy: unexpected argument \"" << argv[1] << "\"; see dpproxy --help\n";
    return 2;
  }
  if (command == "status") return dpproxy::PrintStatus();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Nothing dpproxy creates is readable or writable by others unless it
  // says so (sockets and files also get explicit modes, whatever the umask).
  ::umask(077);
  absl::StatusOr<dpproxy::ProxyConfig> config = dpproxy::ConfigFromFlags();
  if (!config.ok()) {
    std::cerr << "dpproxy: " << config.status().message() << "\n";
    return 2;
  }
  dpproxy::BlockTerminationSignals();
  dpproxy::ProxyServer server(*config);
  // Events go to the log, the events file and the counts behind the
  // metrics; the daemon keeps only a short history in memory.
  server.events().SetHistory(256);
  if (!FLAGS_events.empty()) {
    if (absl::Status s = server.events().OpenFile(FLAGS_events); !s.ok()) {
      std::cerr << "dpproxy: " << s.message() << "\n";
      return 2;
    }
  }
  if (absl::Status s = server.Start(); !s.ok()) {
    LOG(ERROR) << "cannot start: " << s.message();
    return 1;
  }
  auto metrics = std::make_shared<dpproxy::ProxyMetrics>(&server);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!config->metrics_address.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(config->metrics_address);
    } catch (const std::exception& e) {
      LOG(ERROR) << "cannot serve metrics at " << config->metrics_address << ": " << e.what();
      server.Shutdown();
      return 1;
    }
    exposer->RegisterCollectable(metrics);
    if (!dpproxy::IsLoopbackAddress(config->metrics_address)) {
      LOG(WARNING) << "metrics are served at " << config->metrics_address
                   << ", which is not a loopback address: the endpoint has no authentication, "
                      "so anyone who can reach it sees resource names, device counts and "
                      "allocation activity (use 127.0.0.1:PORT, or protect the port)";
      server.events().Emit("metrics_exposed", {{"address", config->metrics_address}});
    }
    std::vector<int> ports = exposer->GetListeningPorts();
    LOG(INFO) << "metrics at http://" << config->metrics_address.substr(0, config->metrics_address.rfind(':'))
              << ":" << (ports.empty() ? 0 : ports[0]) << "/metrics";
  }
  int sig = dpproxy::WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << " received";
  server.events().Emit("signal", {{"signal", sig}});
  exposer.reset();
  server.Shutdown();
  return 0;
}
