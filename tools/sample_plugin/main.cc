// sample_plugin: a configurable device plugin of either API version.
// See sample_plugin.h for the behaviour and `sample_plugin --help` for use.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
#include "tools/sample_plugin/control.grpc.pb.h"
#include "tools/sample_plugin/sample_plugin.h"

DEFINE_string(api, "v1beta1",
              "Device-plugin API to speak: v1alpha (Kubernetes 1.9, Register version\n"
              "\"v1alpha2\") or v1beta1 (1.10+).");
DEFINE_string(resource, "example.com/device",
              "Extended resource name(s) to serve, comma-separated: one server, socket\n"
              "and registration per resource, in one process (the control socket\n"
              "serves the first).");
DEFINE_int32(devices, 4, "Number of devices.");
DEFINE_string(id_pattern, "dev-{i}",
              "Device ID pattern: {i} is the index (0..N-1), {uuid} a UUID derived\n"
              "from the resource and index (same on every run), {ctrl} the index as\n"
              "one control character (\"\\x00\", \"\\x01\", ..., at most 32 devices), as\n"
              "a generic plugin in the field names its devices.");
DEFINE_int32(numa_nodes, 0,
             "Report topology: device i on NUMA node i % N. 0: no topology. v1beta1 only.");
DEFINE_bool(preferred, false, "Offer GetPreferredAllocation. v1beta1 only.");
DEFINE_bool(pre_start_required, false, "Ask for PreStartContainer calls. v1beta1 only.");
DEFINE_string(kubelet_socket, "/var/lib/kubelet/device-plugins/kubelet.sock",
              "Registration socket to register at: a kubelet's, or dpproxy's. The\n"
              "plugin's own socket is created in the same directory.");
DEFINE_string(socket_name, "",
              "File name of the plugin's own socket. Empty: sample-<name>.sock.");
DEFINE_string(registration, "kubelet",
              "How to register: kubelet (Register on --kubelet_socket, again after\n"
              "every kubelet restart), plugin-watcher (serve the pluginregistration\n"
              "service in --plugins_registry_dir), or none.");
DEFINE_string(plugins_registry_dir, "/var/lib/kubelet/plugins_registry",
              "Directory for the plugin-watcher registration socket.");
DEFINE_string(register_version, "",
              "Version string to send in Register instead of the API's own; for\n"
              "testing how a kubelet rejects a wrong version.");
DEFINE_string(flip_device, "", "Toggle this device's health every --flip_interval.");
DEFINE_string(flip_interval, "0s", "Period of health flips, e.g. 10s.");
DEFINE_int32(flip_count, 0, "Stop after this many flips (0: flip until stopped).");
DEFINE_bool(single_stream_updates, false,
            "Give each device-list update to only one ListAndWatch stream, as the\n"
            "kubelet's stub plugin does.");
DEFINE_string(allocate_delay, "0s", "Fault injection: delay every Allocate by this much.");
DEFINE_bool(devices_from_list_and_watch, false,
            "Learn the devices in ListAndWatch, as some generic plugins do: Allocate\n"
            "fails (\"requested device does not exist\") until the first list is sent.");
DEFINE_string(first_list_delay, "0s", "Hold the first ListAndWatch list back this long.");
DEFINE_bool(options_only_in_register, false,
            "Give the options in RegisterRequest only: GetDevicePluginOptions fails, as a\n"
            "plugin written for kubelets up to 1.24 answering nil does.");
DEFINE_bool(panic_on_options, false,
            "Register without options and exit with status 2 on GetDevicePluginOptions,\n"
            "as a Go plugin written for kubelets up to 1.24 whose handler answers nil\n"
            "does (its generated server panics).");
DEFINE_string(restart_signal, "either",
              "What makes the plugin register again after it registered once:\n"
              "either (its own socket removed, or kubelet.sock created anew),\n"
              "own-socket (only its own socket removed; it is looked at on every\n"
              "change of its directory and once a second) or kubelet-socket (only a\n"
              "new kubelet.sock, which restarts the plugin's server).");
DEFINE_uint64(allocate_padding, 0,
              "Pad every container's Allocate answer with an environment variable of\n"
              "this many bytes (over 4 MiB, an answer a kubelet cannot receive).");
DEFINE_string(fail_allocate, "",
              "Fault injection: fail every Allocate with INTERNAL and this message.");
DEFINE_string(device_list_fault, "",
              "Fault injection: send malformed device lists: duplicate-id, empty-id,\n"
              "newline-id or unknown-health (first device reported \"Sick\").");
DEFINE_string(cdi_dir, "",
              "Write the CDI spec behind the cdi_devices this plugin answers (v1beta1)\n"
              "into this directory at start, as vendor plugins with CDI do\n"
              "(e.g. /var/run/cdi). Empty: none.");
DEFINE_string(control_node, "",
              "A device node every container gets whatever it was allocated, as GPU\n"
              "plugins give every container their control node (e.g. /dev/sample/ctl).\n"
              "Empty: none.");
DEFINE_string(fault, "",
              "Fault injection: behave as a buggy plugin does, for testing conformance\n"
              "tools (dpconform). One of: wrong-version, register-before-serve,\n"
              "no-devices, stream-per-update, no-container-response, same-device-node,\n"
              "cdi-only, preferred-wrong-size, prestart-fails, no-reregister,\n"
              "late-wipe-blind, unstable-ids, huge-list, watcher-wrong-type,\n"
              "shared-socket (every --resource on one socket name), slow-reserve\n"
              "(serves its socket again 1.5 s after a removal: not a bug; it recovers),\n"
              "stale-socket-blocks (will not start where its socket file is left)\n"
              "(docs/conformance.md says what each does and which scenario it fails).");
DEFINE_string(control_socket, "",
              "Serve the control API here (set-health, set-devices, status). Empty: no\n"
              "control socket for serve; required by the other subcommands.");
DEFINE_string(events, "", "Append JSON-lines events to this file. Empty: none.");
DEFINE_bool(quiet, false, "Do not print events to stdout.");
DEFINE_string(device, "", "Device ID. [set-health]");
DEFINE_string(health, "Unhealthy", "Healthy or Unhealthy. [set-health]");
DEFINE_int32(count, 0,
             "How many devices the plugin lists from now on, as --devices names\n"
             "them (1 to 1,000,000; those listed keep their health). [set-devices]");

namespace dpproxy::sample {
namespace {

constexpr char kUsage[] = R"(sample_plugin: a configurable device plugin (v1alpha or v1beta1).

Usage:
  sample_plugin [serve] [flags]                       serve and register
  sample_plugin set-health --control_socket=S --device=ID --health=Unhealthy
  sample_plugin set-devices --control_socket=S --count=N  list N devices from now on
  sample_plugin status --control_socket=S             counters and devices (JSON)

It serves its socket before registering, re-registers whenever the kubelet
restarts (kubelet.sock recreated, or its own socket removed), and answers
Allocate with envs, mounts and device specs (plus annotations and CDI devices
in v1beta1) derived from the device IDs. Bad flags exit with status 2 and a
message naming the flag. Flags may be written with dashes or underscores.

Examples:
  sample_plugin --resource=vendor.com/gpu --devices=8 --numa_nodes=2 --preferred
  sample_plugin --api=v1alpha --kubelet_socket=/var/lib/dpproxy/plugins/kubelet.sock

Flags:
)";

int Fail(int code, const std::string& msg) {
  std::cerr << "sample_plugin: " << msg << "\n";
  return code;
}

absl::StatusOr<SamplePluginOptions> OptionsFromFlags() {
  SamplePluginOptions o;
  absl::StatusOr<std::optional<ApiVersion>> api = ParseApiVersion(FLAGS_api, /*allow_auto=*/false);
  if (!api.ok()) return absl::InvalidArgumentError(absl::StrCat("--api=", api.status().message()));
  o.api = **api;
  if (FLAGS_registration == "kubelet") {
    o.registration = RegistrationMode::kKubelet;
  } else if (FLAGS_registration == "plugin-watcher") {
    o.registration = RegistrationMode::kPluginWatcher;
  } else if (FLAGS_registration == "none") {
    o.registration = RegistrationMode::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--registration=", FLAGS_registration, " is not kubelet, plugin-watcher or none"));
  }
  // The first; Serve() makes one plugin per --resource.
  o.resource = std::string(absl::StripAsciiWhitespace(
      std::string(FLAGS_resource).substr(0, FLAGS_resource.find(','))));
  o.devices = FLAGS_devices;
  o.id_pattern = FLAGS_id_pattern;
  o.numa_nodes = FLAGS_numa_nodes;
  o.preferred = FLAGS_preferred;
  o.pre_start_required = FLAGS_pre_start_required;
  o.kubelet_socket = FLAGS_kubelet_socket;
  o.socket_name = FLAGS_socket_name;
  o.plugins_registry_dir = FLAGS_plugins_registry_dir;
  o.register_version = FLAGS_register_version;
  o.flip_device = FLAGS_flip_device;
  o.flip_count = FLAGS_flip_count;
  DPP_ASSIGN_OR_RETURN(o.flip_interval, ParseFlagDuration("flip_interval", FLAGS_flip_interval));
  o.single_stream_updates = FLAGS_single_stream_updates;
  DPP_ASSIGN_OR_RETURN(o.allocate_delay, ParseFlagDuration("allocate_delay", FLAGS_allocate_delay));
  o.fail_allocate = FLAGS_fail_allocate;
  o.allocate_padding = FLAGS_allocate_padding;
  o.devices_from_list_and_watch = FLAGS_devices_from_list_and_watch;
  o.options_only_in_register = FLAGS_options_only_in_register;
  o.panic_on_options = FLAGS_panic_on_options;
  o.exit_on_panic = true;
  if (FLAGS_restart_signal == "either") {
    o.restart_signal = RestartSignal::kEither;
  } else if (FLAGS_restart_signal == "own-socket") {
    o.restart_signal = RestartSignal::kOwnSocket;
  } else if (FLAGS_restart_signal == "kubelet-socket") {
    o.restart_signal = RestartSignal::kKubeletSocket;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--restart_signal=", FLAGS_restart_signal,
        " is not one of either, own-socket, kubelet-socket"));
  }
  DPP_ASSIGN_OR_RETURN(o.first_list_delay,
                       ParseFlagDuration("first_list_delay", FLAGS_first_list_delay));
  o.device_list_fault = FLAGS_device_list_fault;
  o.fault = FLAGS_fault;
  o.cdi_dir = FLAGS_cdi_dir;
  o.control_node = FLAGS_control_node;
  DPP_RETURN_IF_ERROR(ValidateOptions(o));
  return o;
}

int Serve() {
  absl::StatusOr<SamplePluginOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(2, std::string(options.status().message()));
  const std::vector<std::string> resources = absl::StrSplit(FLAGS_resource, ',',
                                                            absl::SkipWhitespace());
  if (resources.size() > 1 && !FLAGS_socket_name.empty()) {
    return Fail(2, absl::StrCat("--socket_name=", FLAGS_socket_name, " names one socket, and ",
                                resources.size(), " resources each need their own: leave it "
                                "empty (sample-<name>.sock each)"));
  }
  std::vector<std::unique_ptr<SamplePlugin>> plugins;
  for (const std::string& r : resources) {
    SamplePluginOptions o = *options;
    o.resource = r;
    if (absl::Status s = ValidateOptions(o); !s.ok()) return Fail(2, std::string(s.message()));
    plugins.push_back(std::make_unique<SamplePlugin>(o));
  }
  if (plugins.empty()) return Fail(2, "--resource: no resource name");
  BlockTerminationSignals();
  KeepGrpcForProcess();  // a stop takes milliseconds (grpc_util.h)
  for (auto& plugin : plugins) {
    plugin->events().SetEcho(!FLAGS_quiet);
    if (!FLAGS_events.empty()) {
      if (absl::Status s = plugin->events().OpenFile(FLAGS_events); !s.ok()) {
        return Fail(2, std::string(s.message()));
      }
    }
  }
  if (!FLAGS_control_socket.empty()) {
    if (absl::Status s = plugins.front()->StartControl(FLAGS_control_socket); !s.ok()) {
      return Fail(1, std::string(s.message()));
    }
  }
  for (auto& plugin : plugins) {
    if (absl::Status s = plugin->Start(); !s.ok()) return Fail(1, std::string(s.message()));
  }
  int sig = WaitForTerminationSignal();
  plugins.front()->events().Emit("signal", {{"signal", sig}});
  plugins.front()->StopControl();
  for (auto& plugin : plugins) plugin->Stop();
  if (!FLAGS_control_socket.empty()) ::unlink(FLAGS_control_socket.c_str());
  // Stopped, and every event written and flushed. gRPC is still
  // initialized (above): the process ends here, without static
  // destructors running beside gRPC's own threads.
  EndProcess(0);
}

int RunClient(const std::string& command) {
  if (FLAGS_control_socket.empty()) return Fail(2, command + " needs --control_socket");
  if (!PathExists(FLAGS_control_socket)) {
    return Fail(1, absl::StrCat("no control socket at ", FLAGS_control_socket));
  }
  auto stub = PluginControl::NewStub(MakeUnixChannel(FLAGS_control_socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  PluginStatus status;
  grpc::Status st;
  if (command == "set-health") {
    if (FLAGS_device.empty()) return Fail(2, "set-health needs --device");
    SetHealthRequest req;
    req.set_device_id(FLAGS_device);
    req.set_health(FLAGS_health);
    st = stub->SetHealth(&ctx, req, &status);
  } else if (command == "set-devices") {
    if (FLAGS_count < 1) return Fail(2, "set-devices needs --count (1 or more)");
    SetDeviceCountRequest req;
    req.set_devices(FLAGS_count);
    SetDeviceCountResponse resp;
    st = stub->SetDeviceCount(&ctx, req, &resp);
    if (!st.ok()) return Fail(1, DescribeGrpcStatus(st));
    std::cout << "{\"devices\": " << resp.devices() << "}\n";
    return 0;
  } else {
    st = stub->GetStatus(&ctx, GetStatusRequest(), &status);
  }
  if (!st.ok()) return Fail(1, DescribeGrpcStatus(st));
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(status, &out, o);
  std::cout << out << "\n";
  return 0;
}

}  // namespace
}  // namespace dpproxy::sample

int main(int argc, char** argv) {
  std::string command = "serve";
  if (argc >= 2 && argv[1][0] != '-') {
    command = argv[1];
    dpproxy::ShiftArgs(&argc, argv);
  }
  if (dpproxy::WantsHelp(argc, argv) || command == "help") {
    std::cout << dpproxy::sample::kUsage << dpproxy::FlagsHelp({"sample_plugin/main.cc"});
    return 0;
  }
  if (command != "serve" && command != "set-health" && command != "set-devices" &&
      command != "status") {
    std::cerr << "sample_plugin: unknown subcommand \"" << command
              << "\"; see sample_plugin --help\n";
    return 2;
  }
  if (!dpproxy::ParseFlags("sample_plugin", &argc, &argv)) return 2;
  if (command == "serve") return dpproxy::sample::Serve();
  return dpproxy::sample::RunClient(command);
}
