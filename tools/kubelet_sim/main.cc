// kubelet_sim: a kubelet stand-in for device plugins and dpproxy.
// See kubelet_sim.h for the behaviour and `kubelet_sim --help` for use.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <gflags/gflags.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proxy/cli/cli.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/grpc_status.h"
#include "tools/kubelet_sim/control.grpc.pb.h"
#include "tools/kubelet_sim/kubelet_sim.h"

DEFINE_string(root_dir, "/var/lib/kubelet",
              "Kubelet root directory. The simulator serves\n"
              "<root>/device-plugins/kubelet.sock, watches <root>/plugins_registry/\n"
              "(plugin-watcher) and serves <root>/pod-resources/kubelet.sock.");
DEFINE_string(kubelet, "",
              "Which kubelet release to behave like, 1.9 to 1.37 (e.g. 1.24): how it\n"
              "registers plugins and what of the API it reads (see `kubelet_sim\n"
              "generations`). Wins over --personality. [serve, restart]");
DEFINE_string(cdi_gate, "",
              "The DevicePluginCDIDevices feature gate of a 1.28-1.30 kubelet: on or\n"
              "off. Empty: the release's default (off in 1.28, on in 1.29-1.30).\n"
              "[serve, restart]");
DEFINE_bool(per_socket_clients, false,
            "Track plugin clients per socket (kubernetes#135437, in a release our\n"
            "facts do not name yet): in 1.25+, the end of a replaced client's stream\n"
            "disconnects only a client at the same socket, so a rolling update whose\n"
            "instances use unique socket names keeps its registration. [serve]");
DEFINE_string(personality, "v1beta1-sync",
              "Older names for kubelets, kept as aliases: v1alpha (1.9), v1beta1-async\n"
              "(1.24), v1beta1-sync (1.31), plugin-watcher (1.31 with the\n"
              "plugins_registry watcher). [serve, restart]");
DEFINE_string(grace, "",
              "How long a lost plugin's resource is kept (devices Unhealthy) before\n"
              "it is removed, e.g. 5m or 30s. Empty: 0 for v1alpha, 5m otherwise. [serve]");
DEFINE_string(dial_timeout, "10s", "Limit for dialling a plugin's socket. [serve]");
DEFINE_string(late_wipe, "0s",
              "Wipe device-plugins/ once more this long after kubelet.sock listens: a\n"
              "stress (a real kubelet cleans up before it listens). [serve]");
DEFINE_string(readmit_delay, "1s",
              "How long after a start the kubelet re-admits the pods it found (a real\n"
              "1.36 kubelet: about 1 s); pod-resources lists them only from then on. [serve]");
DEFINE_string(watcher_period, "1s",
              "How often the plugin watcher registers and deregisters what it saw in\n"
              "plugins_registry/ (the kubelet's plugin manager: once a second). [serve]");
DEFINE_string(node_status_period, "10s",
              "How often the kubelet writes the node's status, whose allocatable the\n"
              "scheduler routes by (nodeStatusUpdateFrequency); `state` shows it as\n"
              "status_allocatable. 0s: the status follows the device manager at once. [serve]");
DEFINE_string(pod_dir_linger, "2s",
              "How long <root>/pods/<UID> outlives a deleted pod (2-4 s on a real node). "
              "[serve]");
DEFINE_string(events, "",
              "Append JSON-lines events to this file. Empty: <root>/kubelet_sim.events.jsonl;\n"
              "\"-\": none. [serve]");
DEFINE_string(control_socket, "",
              "Control socket of a running simulator. Empty: <root>/kubelet_sim.sock.");
DEFINE_bool(quiet, false, "Do not print events to stdout. [serve]");
DEFINE_bool(pod_resources, true, "Serve the pod-resources API. [serve]");
DEFINE_string(pod, "", "Pod name. Empty: pod-<uid prefix>. [allocate]");
DEFINE_string(pod_namespace, "default", "Pod namespace. [allocate]");
DEFINE_string(uid, "", "Pod UID. Empty: generated. [allocate, delete-pod, restart-container]");
DEFINE_string(containers, "",
              "Containers and their requests, comma-separated, each\n"
              "NAME=RESOURCE:COUNT or NAME=RESOURCE:ID+ID+... for exact devices, e.g.\n"
              "\"main=vendor.com/gpu:2,side=vendor.com/gpu:1\"; \"init:NAME=...\" is an\n"
              "init container, whose devices the app containers reuse. [allocate]");
DEFINE_string(container, "", "Container name. [restart-container]");
DEFINE_bool(batch, false,
            "Send all containers of one resource in a single Allocate call (the\n"
            "API allows it; real kubelets send one container per call). [allocate]");
DEFINE_string(output, "table", "Output format: table or json. [allocate, state, readmit]");
DEFINE_string(resource, "", "Resource name. [wait]");
DEFINE_string(only, "",
              "Comma-separated event names to print; empty: all. [events]");
DEFINE_int32(min_healthy, 1, "Healthy devices to wait for. [wait]");
DEFINE_string(timeout, "30s", "How long to wait. [wait]");
DEFINE_string(cdi_dirs, "/etc/cdi,/var/run/cdi",
              "CDI spec directories the container runtime reads, comma-separated: each\n"
              "prepared device's CDI names are resolved there as a runtime would, and\n"
              "a name no spec defines is an error of that device. Empty: not\n"
              "resolved. [serve]");
DEFINE_string(kubeconfig, "",
              "The API server of the node (a kubeconfig): at each start a 1.32+\n"
              "kubelet deletes the node's ResourceSlices, as the real one does.\n"
              "Empty: no API server. [serve]");
DEFINE_string(node_name, "node-1", "The node's name, for --kubeconfig. [serve]");
DEFINE_string(driver, "", "DRA driver name. [prepare, unprepare, allocate with --extended_claim]");
DEFINE_string(extended_claim, "",
              "NAMESPACE/NAME/UID of the claim the scheduler made for the pod's extended\n"
              "resources (1.34+); with --driver and --request_mappings. [allocate]");
DEFINE_string(request_mappings, "",
              "With --extended_claim: CONTAINER=RESOURCE:REQUEST,... (the claim's request\n"
              "for each container and resource it serves). [allocate]");
DEFINE_string(claims, "",
              "Claims, comma-separated NAMESPACE/NAME/UID. [prepare, unprepare]");

namespace dpproxy::sim {
namespace {

constexpr char kUsage[] = R"(kubelet_sim: a kubelet stand-in for testing device plugins and dpproxy.

Usage:
  kubelet_sim serve [flags]        run the simulated kubelet (default subcommand)
  kubelet_sim allocate [flags]     admit a pod: pick devices, Allocate, PreStart
  kubelet_sim state [flags]        show resources, devices, pods and allocations
  kubelet_sim restart [flags]      restart the kubelet part (wipes device-plugins/),
                                   optionally as another --kubelet release
  kubelet_sim generations          list the kubelet releases it plays and how
                                   each generation differs
  kubelet_sim readmit [flags]      re-run admission for running pods (the check a
                                   kubelet makes after a restart or reboot)
  kubelet_sim delete-pod --uid=U   delete a pod, freeing its devices
  kubelet_sim restart-container --uid=U --container=C
                                   a running pod's container exits and starts again
  kubelet_sim wait --resource=R    wait until R has --min_healthy healthy devices
  kubelet_sim prepare --driver=D --claims=NS/NAME/UID,...
                                   NodePrepareResources of DRA driver D (1.32+),
                                   as when a pod with those claims starts
  kubelet_sim unprepare --driver=D --claims=...   the same, as when it ends
  kubelet_sim events --events=FILE print a JSON-lines event file (any dpproxy
                                   tool's) readably, optionally --only=a,b

The subcommands other than serve talk to a running simulator through its
control socket (--control_socket, or --root_dir to find it). Flags may be
written with dashes or underscores. Events are JSON lines (one object per
line with "ts", "source", "event" and fields) in the --events file.

Examples:
  kubelet_sim serve --root_dir=/tmp/k --kubelet=1.24
  kubelet_sim allocate --root_dir=/tmp/k --pod=train --containers=main=vendor.com/gpu:2
  kubelet_sim allocate --root_dir=/tmp/k --pod=infer --containers=main=vendor.com/gpu:1 \
      --extended_claim=default/infer-extended-resources-x2b4d/UID --driver=gpu.vendor.com \
      --request_mappings=main=vendor.com/gpu:container-0-request-0
  kubelet_sim restart --root_dir=/tmp/k --kubelet=1.31
  kubelet_sim state --root_dir=/tmp/k --output=json

Flags (the subcommands each flag applies to are in brackets):
)";

int Fail(const std::string& msg) {
  std::cerr << "kubelet_sim: " << msg << "\n";
  return 1;
}

// --kubelet (or --personality) and --cdi_gate as a release to play.
absl::StatusOr<KubeletVersion> KubeletFromFlags() {
  std::optional<bool> gate;
  if (FLAGS_cdi_gate == "on") {
    gate = true;
  } else if (FLAGS_cdi_gate == "off") {
    gate = false;
  } else if (!FLAGS_cdi_gate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cdi_gate: \"", FLAGS_cdi_gate, "\" is not on or off"));
  }
  absl::StatusOr<KubeletVersion> k =
      ParseKubeletVersion(FLAGS_kubelet.empty() ? FLAGS_personality : FLAGS_kubelet, gate);
  if (k.ok()) k->per_socket_clients = FLAGS_per_socket_clients;
  return k;
}

int PrintGenerations() {
  std::cout << "Kubelet releases kubelet_sim plays (--kubelet=1.N), by generation:\n\n";
  for (const KubeletGeneration& g : KubeletGenerations()) {
    std::cout << absl::StrFormat("  %-10s %s\n", GenerationName(g), g.differences);
  }
  std::cout << "\nAliases: v1alpha = 1.9, v1beta1-async = 1.24, v1beta1-sync = 1.31,\n"
               "plugin-watcher = 1.31 with the plugins_registry watcher (1.13+ all watch).\n";
  return 0;
}

std::string ControlSocket() {
  if (!FLAGS_control_socket.empty()) return FLAGS_control_socket;
  return JoinPath(FLAGS_root_dir, "kubelet_sim.sock");
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

void PrintState(const State& st) {
  std::cout << absl::StrFormat("kubelet_sim %s (%s, %s), root %s, started %d time(s)\n",
                               st.kubelet(), st.generation(), st.personality(), st.root_dir(),
                               st.starts());
  if (st.resources().empty()) std::cout << "no resources registered\n";
  for (const ResourceState& r : st.resources()) {
    std::cout << absl::StrFormat(
        "\nresource %s  api %s via %s  %s  capacity %d  allocatable %d (node status: %d)\n"
        "  endpoint %s%s%s\n",
        r.name(), r.api_version().empty() ? "-" : r.api_version(),
        r.registered_via().empty() ? "checkpoint" : r.registered_via(),
        r.connected() ? "connected"
                      : absl::StrCat("disconnected for ", r.disconnected_ms() / 1000, "s"),
        r.capacity(), r.allocatable(), r.status_allocatable(),
        r.endpoint().empty() ? "-" : r.endpoint(),
        r.pre_start_required() ? "  [PreStart required]" : "",
        r.get_preferred_allocation_available() ? "  [preferred allocation]" : "");
    for (const DeviceState& d : r.devices()) {
      std::cout << absl::StrFormat("  %-40s %-9s numa=%-5s %s\n", d.id(), d.health(),
                                   d.numa_nodes().empty() ? "-" : absl::StrJoin(d.numa_nodes(), "+"),
                                   d.allocated_to().empty() ? "" : "-> " + d.allocated_to());
    }
  }
  if (!st.pods().empty()) std::cout << "\npods:\n";
  for (const PodState& p : st.pods()) {
    std::cout << absl::StrFormat("  %s/%s uid=%s %s%s\n", p.namespace_(), p.name(), p.uid(),
                                 p.phase(),
                                 p.reason().empty() ? "" : " (" + p.reason() + ": " + p.message() + ")");
  }
}

absl::StatusOr<AllocateRequest> ParseAllocate() {
  AllocateRequest req;
  req.set_pod_name(FLAGS_pod);
  req.set_pod_namespace(FLAGS_pod_namespace);
  req.set_pod_uid(FLAGS_uid);
  req.set_batch(FLAGS_batch);
  if (FLAGS_containers.empty()) {
    return absl::InvalidArgumentError(
        "--containers is required, e.g. --containers=main=vendor.com/gpu:1");
  }
  for (absl::string_view spec : absl::StrSplit(FLAGS_containers, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> nv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    size_t colon = nv.size() == 2 ? nv[1].rfind(':') : absl::string_view::npos;
    if (nv.size() != 2 || nv[0].empty() || colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container spec \"", spec, "\" is not NAME=RESOURCE:COUNT or NAME=RESOURCE:ID+ID"));
    }
    ContainerRequest* c = req.add_containers();
    absl::string_view name = nv[0];
    if (absl::ConsumePrefix(&name, "init:")) c->set_init(true);
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("container spec \"", spec, "\" names no container"));
    }
    c->set_name(std::string(name));
    c->set_resource(std::string(nv[1].substr(0, colon)));
    absl::string_view what = nv[1].substr(colon + 1);
    int count = 0;
    if (absl::SimpleAtoi(what, &count)) {
      if (count <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("container spec \"", spec, "\": count must be at least 1"));
      }
      c->set_count(count);
    } else {
      for (absl::string_view id : absl::StrSplit(what, '+', absl::SkipEmpty())) {
        c->add_device_ids(std::string(id));
      }
      if (c->device_ids().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("container spec \"", spec, "\" names no device"));
      }
    }
  }
  if (FLAGS_extended_claim.empty() != FLAGS_request_mappings.empty()) {
    return absl::InvalidArgumentError(
        "--extended_claim and --request_mappings go together (with --driver)");
  }
  if (!FLAGS_extended_claim.empty()) {
    std::vector<std::string> parts = absl::StrSplit(FLAGS_extended_claim, '/');
    if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--extended_claim=", FLAGS_extended_claim, " is not NAMESPACE/NAME/UID"));
    }
    if (FLAGS_driver.empty()) {
      return absl::InvalidArgumentError("--extended_claim needs --driver (the claim's driver)");
    }
    ExtendedResourceClaim* e = req.mutable_extended_resource_claim();
    e->set_namespace_(parts[0]);
    e->set_name(parts[1]);
    e->set_uid(parts[2]);
    e->set_driver(FLAGS_driver);
    for (absl::string_view spec : absl::StrSplit(FLAGS_request_mappings, ',', absl::SkipEmpty())) {
      std::vector<absl::string_view> nv = absl::StrSplit(spec, absl::MaxSplits('=', 1));
      const size_t colon = nv.size() == 2 ? nv[1].rfind(':') : absl::string_view::npos;
      if (nv.size() != 2 || nv[0].empty() || colon == absl::string_view::npos || colon == 0 ||
          colon + 1 == nv[1].size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "request mapping \"", spec, "\" is not CONTAINER=RESOURCE:REQUEST"));
      }
      auto* m = e->add_request_mappings();
      m->set_container(std::string(nv[0]));
      m->set_resource(std::string(nv[1].substr(0, colon)));
      m->set_request(std::string(nv[1].substr(colon + 1)));
    }
  }
  return req;
}

int RunClient(const std::string& command) {
  const std::string socket = ControlSocket();
  if (!PathExists(socket)) {
    return Fail(absl::StrCat("no simulator control socket at ", socket,
                             " (is `kubelet_sim serve` running with this --root_dir?)"));
  }
  auto stub = KubeletControl::NewStub(MakeUnixChannel(socket, kControlMaxMessageBytes));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
  grpc::Status st;
  const bool json = FLAGS_output == "json";
  if (FLAGS_output != "json" && FLAGS_output != "table") {
    return Fail(absl::StrCat("--output=", FLAGS_output, " is not table or json"));
  }
  if (command == "allocate") {
    absl::StatusOr<AllocateRequest> req = ParseAllocate();
    if (!req.ok()) return Fail(std::string(req.status().message()));
    AllocateResponse resp;
    st = stub->Allocate(&ctx, *req, &resp);
    if (st.ok()) {
      if (json) {
        std::cout << ToJson(resp) << "\n";
      } else {
        std::cout << "pod uid " << resp.pod_uid() << " admitted\n";
        for (const ContainerAllocation& a : resp.allocations()) {
          std::cout << absl::StrFormat("  container %s: %s %s%s\n", a.container(), a.resource(),
                                       absl::StrJoin(a.device_ids(), ","),
                                       a.pre_started() ? " (PreStartContainer called)" : "");
          for (const auto& [k, v] : a.response().envs()) {
            std::cout << "    env " << k << "=" << v << "\n";
          }
          for (const auto& m : a.response().mounts()) {
            std::cout << "    mount " << m.host_path() << " -> " << m.container_path()
                      << (m.read_only() ? " (ro)" : "") << "\n";
          }
          for (const auto& d : a.response().devices()) {
            std::cout << "    device " << d.host_path() << " -> " << d.container_path() << " "
                      << d.permissions() << "\n";
          }
          for (const auto& [k, v] : a.response().annotations()) {
            std::cout << "    annotation " << k << "=" << v << "\n";
          }
          for (const auto& c : a.response().cdi_devices()) {
            std::cout << "    cdi " << c.name() << "\n";
          }
        }
        for (const RuntimeDevices& r : resp.claim_served()) {
          std::cout << absl::StrFormat("  container %s: %s %s (claim %s)\n", r.container(),
                                       r.resource(), absl::StrJoin(r.claim_devices(), ","),
                                       req->extended_resource_claim().name());
          for (const std::string& c : r.cdi_device_ids()) std::cout << "    cdi " << c << "\n";
        }
      }
    }
  } else if (command == "state") {
    State resp;
    st = stub->GetState(&ctx, GetStateRequest(), &resp);
    if (st.ok()) json ? void(std::cout << ToJson(resp) << "\n") : PrintState(resp);
  } else if (command == "restart") {
    RestartRequest req;
    if (!FLAGS_kubelet.empty()) {
      req.set_personality(FLAGS_kubelet);
    } else if (gflags::GetCommandLineFlagInfoOrDie("personality").is_default == false) {
      req.set_personality(FLAGS_personality);
    }
    if (!FLAGS_cdi_gate.empty()) {
      if (FLAGS_cdi_gate != "on" && FLAGS_cdi_gate != "off") {
        return Fail(absl::StrCat("--cdi_gate: \"", FLAGS_cdi_gate, "\" is not on or off"));
      }
      req.set_cdi_gate(FLAGS_cdi_gate == "on" ? 1 : -1);
    }
    State resp;
    st = stub->Restart(&ctx, req, &resp);
    if (st.ok()) {
      std::cout << "restarted as " << resp.kubelet() << " (" << resp.generation() << ", "
                << resp.personality() << ")\n";
    }
  } else if (command == "readmit") {
    ReadmitResponse resp;
    st = stub->Readmit(&ctx, ReadmitRequest(), &resp);
    if (st.ok()) {
      if (json) {
        std::cout << ToJson(resp) << "\n";
      } else {
        int failed = 0;
        for (const ReadmitResult& r : resp.results()) {
          failed += r.admitted() ? 0 : 1;
          std::cout << absl::StrFormat("  %s/%s %s: %s\n", r.pod_name(), r.container(),
                                       r.resource(),
                                       r.admitted() ? "admitted" : r.reason() + ": " + r.message());
        }
        std::cout << resp.results_size() - failed << " admitted, " << failed << " failed\n";
      }
    }
  } else if (command == "restart-container") {
    if (FLAGS_uid.empty() || FLAGS_container.empty()) {
      return Fail("restart-container needs --uid and --container");
    }
    RestartContainerRequest req;
    req.set_pod_uid(FLAGS_uid);
    req.set_container(FLAGS_container);
    RestartContainerResponse resp;
    st = stub->RestartContainer(&ctx, req, &resp);
    if (st.ok()) {
      for (const RuntimeDevices& r : resp.running()) {
        std::cout << FLAGS_container << " runs with " << r.resource() << " "
                  << absl::StrJoin(r.device_ids(), ",")
                  << (resp.reallocated() ? " (allocated again)" : "") << "\n";
      }
    }
  } else if (command == "delete-pod") {
    if (FLAGS_uid.empty()) return Fail("delete-pod needs --uid");
    DeletePodRequest req;
    req.set_pod_uid(FLAGS_uid);
    State resp;
    st = stub->DeletePod(&ctx, req, &resp);
    if (st.ok()) std::cout << "pod " << FLAGS_uid << " deleted\n";
  } else if (command == "prepare" || command == "unprepare") {
    if (FLAGS_driver.empty()) return Fail(command + " needs --driver");
    DraClaimsRequest req;
    req.set_driver(FLAGS_driver);
    req.set_unprepare(command == "unprepare");
    for (absl::string_view c : absl::StrSplit(FLAGS_claims, ',', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(c, '/');
      if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[2].empty()) {
        return Fail(absl::StrCat("--claims: \"", c, "\" is not NAMESPACE/NAME/UID"));
      }
      auto* claim = req.add_claims();
      claim->set_namespace_(parts[0]);
      claim->set_name(parts[1]);
      claim->set_uid(parts[2]);
    }
    if (req.claims_size() == 0) return Fail(command + " needs --claims");
    DraClaimsResponse resp;
    st = stub->DraClaims(&ctx, req, &resp);
    if (st.ok()) {
      const nlohmann::json answer = nlohmann::json::parse(resp.claims_json());
      if (json) {
        std::cout << answer.dump(1) << "\n";
      } else {
        for (const auto& [uid, r] : answer.items()) {
          const std::string error = r.value("error", "");
          std::cout << uid << ": " << (error.empty() ? "ok" : "ERROR " + error) << "\n";
          if (!r.contains("devices")) continue;
          for (const auto& d : r["devices"]) {
            std::cout << "  " << d.value("pool", "") << " " << d.value("device", "") << " -> "
                      << absl::StrJoin(d["cdi_device_ids"].get<std::vector<std::string>>(), " ")
                      << "\n";
            if (!d.contains("runtime")) continue;
            for (const auto& e : d["runtime"]["errors"]) {
              std::cout << "    CDI ERROR " << e.get<std::string>() << "\n";
            }
            const nlohmann::json& edits = d["runtime"]["edits"];
            std::cout << "    container gets " << edits["env"].size() << " env, "
                      << edits["deviceNodes"].size() << " device node(s), "
                      << edits["mounts"].size() << " mount(s)\n";
          }
        }
      }
    }
  } else if (command == "wait") {
    if (FLAGS_resource.empty()) return Fail("wait needs --resource");
    absl::StatusOr<absl::Duration> timeout = ParseFlagDuration("timeout", FLAGS_timeout);
    if (!timeout.ok()) return Fail(std::string(timeout.status().message()));
    WaitForResourceRequest req;
    req.set_resource(FLAGS_resource);
    req.set_min_healthy(FLAGS_min_healthy);
    req.set_timeout_ms(absl::ToInt64Milliseconds(*timeout));
    State resp;
    st = stub->WaitForResource(&ctx, req, &resp);
    if (st.ok()) std::cout << FLAGS_resource << " ready\n";
  }
  if (!st.ok()) return Fail(DescribeGrpcStatus(st));
  return 0;
}

int PrintEvents() {
  if (FLAGS_events.empty() || FLAGS_events == "-") return Fail("events needs --events=FILE");
  absl::StatusOr<std::string> text = ReadFile(FLAGS_events);
  if (!text.ok()) return Fail(std::string(text.status().message()));
  std::vector<std::string> only = absl::StrSplit(FLAGS_only, ',', absl::SkipEmpty());
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    ++line_no;
    Json e = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_discarded() || !e.is_object()) {
      std::cerr << "kubelet_sim: " << FLAGS_events << ":" << line_no
                << ": not a JSON object; skipped\n";
      continue;
    }
    if (!only.empty() &&
        std::find(only.begin(), only.end(), e.value("event", "")) == only.end()) {
      continue;
    }
    std::cout << EventLog::Format(e) << "\n";
  }
  return 0;
}

int Serve() {
  absl::StatusOr<KubeletVersion> kubelet = KubeletFromFlags();
  if (!kubelet.ok()) return Fail(std::string(kubelet.status().message()));
  KubeletSimOptions options;
  options.root_dir = FLAGS_root_dir;
  options.personality = kubelet->personality;
  options.kubelet = *kubelet;
  options.pod_resources = FLAGS_pod_resources;
  if (!FLAGS_grace.empty()) {
    absl::StatusOr<absl::Duration> g = ParseFlagDuration("grace", FLAGS_grace);
    if (!g.ok()) return Fail(std::string(g.status().message()));
    options.endpoint_grace = *g;
  }
  absl::StatusOr<absl::Duration> dial = ParseFlagDuration("dial_timeout", FLAGS_dial_timeout);
  if (!dial.ok()) return Fail(std::string(dial.status().message()));
  options.dial_timeout = *dial;
  absl::StatusOr<absl::Duration> late = ParseFlagDuration("late_wipe", FLAGS_late_wipe);
  if (!late.ok()) return Fail(std::string(late.status().message()));
  options.late_wipe = *late;
  absl::StatusOr<absl::Duration> readmit = ParseFlagDuration("readmit_delay", FLAGS_readmit_delay);
  if (!readmit.ok()) return Fail(std::string(readmit.status().message()));
  options.readmit_delay = *readmit;
  absl::StatusOr<absl::Duration> watcher_period =
      ParseFlagDuration("watcher_period", FLAGS_watcher_period);
  if (!watcher_period.ok()) return Fail(std::string(watcher_period.status().message()));
  if (*watcher_period <= absl::ZeroDuration()) {
    return Fail("--watcher_period must be positive");
  }
  options.watcher_period = *watcher_period;
  absl::StatusOr<absl::Duration> status_period =
      ParseFlagDuration("node_status_period", FLAGS_node_status_period);
  if (!status_period.ok()) return Fail(std::string(status_period.status().message()));
  if (*status_period < absl::ZeroDuration()) return Fail("--node_status_period must not be negative");
  options.node_status_period = *status_period;
  absl::StatusOr<absl::Duration> linger =
      ParseFlagDuration("pod_dir_linger", FLAGS_pod_dir_linger);
  if (!linger.ok()) return Fail(std::string(linger.status().message()));
  options.pod_dir_linger = *linger;
  options.cdi_dirs = absl::StrSplit(FLAGS_cdi_dirs, ',', absl::SkipEmpty());
  options.kubeconfig = FLAGS_kubeconfig;
  options.node_name = FLAGS_node_name;
  if (absl::Status s = MakeDirs(options.root_dir); !s.ok()) {
    return Fail(absl::StrCat("cannot create --root_dir: ", s.message()));
  }

  BlockTerminationSignals();
  KeepGrpcForProcess();  // ends through EndProcess (grpc_util.h)
  KubeletSim sim(options);
  sim.events().SetEcho(!FLAGS_quiet);
  std::string events = FLAGS_events.empty()
                           ? JoinPath(options.root_dir, "kubelet_sim.events.jsonl")
                           : FLAGS_events;
  if (events != "-") {
    if (absl::Status s = sim.events().OpenFile(events); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (absl::Status s = sim.StartControl(ControlSocket()); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (absl::Status s = sim.Start(); !s.ok()) return Fail(std::string(s.message()));
  int sig = WaitForTerminationSignal();
  sim.events().Emit("signal", {{"signal", sig}});
  sim.StopControl();
  sim.Stop();
  ::unlink(ControlSocket().c_str());
  EndProcess(0);
}

}  // namespace
}  // namespace dpproxy::sim

int main(int argc, char** argv) {
  std::string command = "serve";
  if (argc >= 2 && argv[1][0] != '-') {
    command = argv[1];
    dpproxy::ShiftArgs(&argc, argv);
  }
  const std::vector<std::string> known = {"serve", "allocate", "state", "restart",
                                          "readmit", "delete-pod", "restart-container", "wait", "prepare", "unprepare",
                                          "events", "generations",
                                          "help"};
  if (dpproxy::WantsHelp(argc, argv) || command == "help") {
    std::cout << dpproxy::sim::kUsage << dpproxy::FlagsHelp({"kubelet_sim/main.cc"});
    return 0;
  }
  if (std::find(known.begin(), known.end(), command) == known.end()) {
    std::cerr << "kubelet_sim: unknown subcommand \"" << command
              << "\"; see kubelet_sim --help\n";
    return 2;
  }
  if (!dpproxy::ParseFlags("kubelet_sim", &argc, &argv)) return 2;
  if (command == "serve") return dpproxy::sim::Serve();
  if (command == "events") return dpproxy::sim::PrintEvents();
  if (command == "generations") return dpproxy::sim::PrintGenerations();
  return dpproxy::sim::RunClient(command);
}
