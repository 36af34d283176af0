// File: real_node.h
//
// dpconform's view of a real node (real.h): its kubelet's pod-resources
// socket and its API server, through which the real-kubelet cells start
// and end pods and read what the kubelet did with them. Shared by the
// files of real.cc's cells only.
#ifndef DPPROXY_TOOLS_CONFORM_REAL_NODE_H_
#define DPPROXY_TOOLS_CONFORM_REAL_NODE_H_

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <variant>

#include <grpcpp/client_context.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/grid_scenarios.h"

namespace dpproxy::conform {

using grid::Ms;

using Json = nlohmann::json;

// How often a wait looks again at the kubelet or the API server.
inline constexpr absl::Duration kPoll = absl::Milliseconds(200);
// The longest --restart_kubelet may take before the cell fails.
inline constexpr absl::Duration kRestartLimit = absl::Minutes(3);
inline constexpr char kManagedBy[] = "dpconform";
// The pods' containers: ended at once by the SIGTERM of a deletion.
inline constexpr char kPodScript[] = "trap 'exit 0' TERM; sleep 3600 & wait";

// The sockets the kubelet's plugin manager registered, from its metrics
// text: plugin_manager_total_plugins{socket_path="...",state="actual_state_of_world"}.
inline std::set<std::string> RegisteredSockets(const std::string& metrics) {
  std::set<std::string> out;
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (!absl::StartsWith(line, "plugin_manager_total_plugins{")) continue;
    const size_t close = line.find('}');
    if (close == absl::string_view::npos) continue;
    std::string socket;
    bool actual = false;
    absl::string_view labels = line.substr(29, close - 29);
    for (absl::string_view label : absl::StrSplit(labels, "\",", absl::SkipEmpty())) {
      const size_t eq = label.find("=\"");
      if (eq == absl::string_view::npos) continue;
      absl::string_view key = absl::StripLeadingAsciiWhitespace(label.substr(0, eq));
      absl::string_view value = absl::StripSuffix(label.substr(eq + 2), "\"");
      if (key == "socket_path") socket = std::string(value);
      if (key == "state") actual = value == "actual_state_of_world";
    }
    const absl::string_view count = absl::StripAsciiWhitespace(line.substr(close + 1));
    if (actual && !socket.empty() && count != "0") out.insert(socket);
  }
  return out;
}

// GetInfo on a registration socket, as the kubelet asks it: "DRAPlugin
// name [versions]", or why it did not answer.
struct RegistrationInfo {
  bool answered = false;
  std::string type, name;
  std::vector<std::string> versions;
  std::string Describe() const {
    return absl::StrCat(type, " ", name, " [", absl::StrJoin(versions, ", "), "]");
  }
};
inline RegistrationInfo GetInfo(const std::string& socket) {
  RegistrationInfo info;
  auto stub = pluginregistration::Registration::NewStub(MakeUnixChannel(socket, 1 << 20));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  pluginregistration::PluginInfo resp;
  if (!stub->GetInfo(&ctx, {}, &resp).ok()) return info;
  info.answered = true;
  info.type = resp.type();
  info.name = resp.name();
  info.versions.assign(resp.supported_versions().begin(), resp.supported_versions().end());
  return info;
}

// The paths in `dir`, sorted.
inline std::vector<std::string> SocketsIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(JoinPath(dir, name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// What the kubelet does with a pod.
struct PodOutcome {
  enum Kind { kRunning, kRefused, kContainerError, kImage, kTimeout } kind = kTimeout;
  std::string reason;   // the kubelet's or the runtime's word
  std::string message;  // its text
  Json pod;
};

// What a plugin's (or driver's) side of each pod outcome says, for
// OutcomeProblem.
struct PodOutcomeTexts {
  std::string refused_did, refused_expects;
  std::string container_did, container_expects;
  std::string harness_did;  // the flags the harness needs (kImage)
  std::string late_did, late_expects, late_users;
};

// A pod outcome that is not kRunning as a Problem of `owner`'s, in the
// kubelet's or the runtime's words, after `timeout`.
inline Problem OutcomeProblem(const std::string& owner, const std::string& pod,
                              const PodOutcome& out, absl::Duration timeout,
                              const PodOutcomeTexts& t) {
  Problem p;
  p.owner = owner;
  switch (out.kind) {
    case PodOutcome::kRefused:
      p.summary = absl::StrCat("the kubelet refused pod ", pod, ": ", out.reason, ": ",
                               out.message);
      p.plugin_did = t.refused_did;
      p.kubelet_expects = t.refused_expects;
      p.users_see = absl::StrCat("pods fail with ", out.reason, ": ", out.message);
      break;
    case PodOutcome::kContainerError:
      p.summary = absl::StrCat("pod ", pod, "'s container could not be made: ", out.reason, ": ",
                               out.message);
      p.plugin_did = t.container_did;
      p.kubelet_expects = t.container_expects;
      p.users_see = absl::StrCat("pods stuck in ", out.reason);
      break;
    case PodOutcome::kImage:
      p.summary = absl::StrCat("dpconform could not run pod ", pod, ": ", out.reason, ": ",
                               out.message);
      p.plugin_did = t.harness_did;
      p.kubelet_expects = "an image it need not pull";
      p.users_see = "nothing: fix the flags";
      break;
    case PodOutcome::kTimeout:
    case PodOutcome::kRunning:
      p.summary = absl::StrCat("pod ", pod, " was not running after ",
                               absl::FormatDuration(timeout), " (", out.reason, ")");
      p.plugin_did = t.late_did;
      p.kubelet_expects = t.late_expects;
      p.users_see = t.late_users;
      break;
  }
  return p;
}

// The node, its kubelet's pod-resources socket and the API server.
class RealNode {
 public:
  static absl::StatusOr<std::unique_ptr<RealNode>> Connect(const ConformOptions& o) {
    absl::StatusOr<KubeConfig> config = LoadKubeconfig(o.real.kubeconfig);
    if (!config.ok()) return config.status();
    absl::StatusOr<std::unique_ptr<KubeClient>> api = KubeClient::Create(*config);
    if (!api.ok()) return api.status();
    auto node = std::unique_ptr<RealNode>(new RealNode(o, *std::move(api)));
    if (absl::Status s = node->FindNode(); !s.ok()) return s;
    return node;
  }

  const std::string& name() const { return name_; }
  // "v1.37.2", as the node reports its kubelet.
  const std::string& kubelet_version() const { return kubelet_version_; }
  // "1.37".
  std::string minor() const {
    const size_t second = kubelet_version_.find('.', kubelet_version_.find('.') + 1);
    return kubelet_version_.substr(1, second == std::string::npos ? std::string::npos : second - 1);
  }
  const std::string& pod_resources_socket() const { return pod_resources_; }
  const std::string& namespace_name() const { return namespace_; }
  KubeClient& api() { return *api_; }

  // The kubelet's metrics: through the API server's node proxy (as
  // `kubectl get --raw /api/v1/nodes/NAME/proxy/metrics`), or, where the
  // API server cannot reach the kubelet (a kubelet serving on loopback
  // only), from the kubelet's own port on 127.0.0.1 with --kubeconfig's
  // credentials and CA.
  absl::StatusOr<std::string> KubeletMetrics() {
    if (!direct_) {
      absl::StatusOr<std::string> text =
          api_->GetText(absl::StrCat("/api/v1/nodes/", name_, "/proxy/metrics"));
      if (text.ok() || kubelet_port_ == 0) return text;
      proxy_error_ = std::string(text.status().message());
    }
    if (kubelet_ == nullptr) {
      KubeConfig direct = api_->config();
      direct.server = absl::StrCat("https://127.0.0.1:", kubelet_port_);
      absl::StatusOr<std::unique_ptr<KubeClient>> c = KubeClient::Create(direct);
      if (!c.ok()) return c.status();
      kubelet_ = *std::move(c);
    }
    absl::StatusOr<std::string> text = kubelet_->GetText("/metrics");
    if (text.ok()) {
      direct_ = true;
      return text;
    }
    return absl::Status(text.status().code(),
                        absl::StrCat("the kubelet's metrics: through the API server, ",
                                     proxy_error_, "; from 127.0.0.1:", kubelet_port_, ", ",
                                     text.status().message()));
  }

  // One device a DRA claim gave a container, as the pod-resources socket
  // lists it (from 1.34; earlier kubelets list none).
  struct ClaimDevice {
    std::string claim, driver, pool, device;
    std::vector<std::string> cdi;
  };
  // The claims' devices the kubelet lists for each container of a pod.
  absl::StatusOr<std::map<std::string, std::vector<ClaimDevice>>> ContainerClaims(
      const std::string& pod) {
    v1::ListPodResourcesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status st = stub_->List(&ctx, {}, &resp);
    if (!st.ok()) return Unreachable("List", st);
    std::map<std::string, std::vector<ClaimDevice>> out;
    for (const v1::PodResources& p : resp.pod_resources()) {
      if (p.name() != pod || p.namespace_() != namespace_) continue;
      for (const v1::ContainerResources& c : p.containers()) {
        std::vector<ClaimDevice>& devices = out[c.name()];
        for (const v1::DynamicResource& d : c.dynamic_resources()) {
          for (const v1::ClaimResource& r : d.claim_resources()) {
            ClaimDevice cd{d.claim_name(), r.driver_name(), r.pool_name(), r.device_name(), {}};
            for (const v1::CDIDevice& n : r.cdi_devices()) cd.cdi.push_back(n.name());
            devices.push_back(std::move(cd));
          }
        }
      }
    }
    return out;
  }

  // The IDs of `resource`'s devices the kubelet lists as allocatable.
  absl::StatusOr<std::set<std::string>> Allocatable(const std::string& resource) {
    v1::AllocatableResourcesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status st = stub_->GetAllocatableResources(&ctx, {}, &resp);
    if (!st.ok()) return Unreachable("GetAllocatableResources", st);
    std::set<std::string> ids;
    for (const v1::ContainerDevices& d : resp.devices()) {
      if (d.resource_name() == resource) ids.insert(d.device_ids().begin(), d.device_ids().end());
    }
    return ids;
  }

  // The IDs of `resource` the kubelet lists for each container of a pod.
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> ContainerDevices(
      const std::string& pod, const std::string& resource) {
    v1::ListPodResourcesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    grpc::Status st = stub_->List(&ctx, {}, &resp);
    if (!st.ok()) return Unreachable("List", st);
    std::map<std::string, std::vector<std::string>> out;
    for (const v1::PodResources& p : resp.pod_resources()) {
      if (p.name() != pod || p.namespace_() != namespace_) continue;
      for (const v1::ContainerResources& c : p.containers()) {
        std::vector<std::string>& ids = out[c.name()];
        for (const v1::ContainerDevices& d : c.devices()) {
          if (d.resource_name() != resource) continue;
          ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
        }
      }
    }
    return out;
  }

  // The node's allocatable count of `resource` as the API server has it.
  absl::StatusOr<int64_t> NodeAllocatable(const std::string& resource) {
    absl::StatusOr<Json> node = api_->Get(absl::StrCat("/api/v1/nodes/", name_));
    if (!node.ok()) return node.status();
    const Json& a = (*node)["status"].value("allocatable", Json::object());
    int64_t n = 0;
    if (a.contains(resource) && a[resource].is_string() &&
        !absl::SimpleAtoi(a[resource].get<std::string>(), &n)) {
      return absl::InternalError(absl::StrCat("the node's allocatable ", resource, " is ",
                                              a[resource].dump()));
    }
    return n;
  }

  // Makes a pod bound to this node, one container c0, c1, ... per entry of
  // `containers`, each asking for that many devices of that resource.
  absl::Status CreatePod(const std::string& pod,
                         const std::vector<std::pair<std::string, int>>& containers) {
    Json list = Json::array();
    for (size_t i = 0; i < containers.size(); ++i) {
      const auto& [resource, count] = containers[i];
      list.push_back(
          Container(absl::StrCat("c", i), {{"limits", {{resource, absl::StrCat(count)}}}}));
    }
    return api_->Post(PodsPath(), PodManifest(pod, list, {{"nodeName", name_}})).status();
  }

  // Makes a pod of the claim `claim` (made beforehand in the namespace),
  // one container c0, c1, ... per entry of `requests`, each given the
  // claim's requests named in its entry (all of it for an empty entry).
  // The scheduler places it, on this node only: a claim is allocated while
  // the pod is scheduled, so a pod bound by name would never get one.
  absl::Status CreateClaimPod(const std::string& pod, const std::string& claim,
                              const std::vector<std::vector<std::string>>& requests) {
    Json containers = Json::array();
    for (size_t i = 0; i < requests.size(); ++i) {
      Json claims = Json::array();
      if (requests[i].empty()) claims.push_back({{"name", "claim"}});
      for (const std::string& r : requests[i]) claims.push_back({{"name", "claim"}, {"request", r}});
      containers.push_back(Container(absl::StrCat("c", i), {{"claims", claims}}));
    }
    Json term = {{"matchFields", {{{"key", "metadata.name"},
                                   {"operator", "In"},
                                   {"values", {name_}}}}}};
    return api_
        ->Post(PodsPath(),
               PodManifest(pod, containers,
                           {{"affinity",
                             {{"nodeAffinity",
                               {{"requiredDuringSchedulingIgnoredDuringExecution",
                                 {{"nodeSelectorTerms", {term}}}}}}}},
                            {"resourceClaims",
                             {{{"name", "claim"}, {"resourceClaimName", claim}}}}}))
        .status();
  }

  absl::StatusOr<Json> GetPod(const std::string& pod) {
    return api_->Get(absl::StrCat(PodsPath(), "/", pod));
  }

  // The ID of the pod's first running container, "" if none runs.
  std::string RunningContainerId(const std::string& pod) {
    absl::StatusOr<Json> p = GetPod(pod);
    if (!p.ok()) return "";
    for (const Json& c : (*p)["status"].value("containerStatuses", Json::array())) {
      if (c.value("state", Json::object()).contains("running")) return c.value("containerID", "");
    }
    return "";
  }

  // Waits up to `timeout` until the pod runs, the kubelet refuses it, its
  // container cannot be made, or it ended.
  PodOutcome WaitPod(const std::string& pod, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    PodOutcome out;
    while (true) {
      absl::StatusOr<Json> p = GetPod(pod);
      if (p.ok()) {
        out.pod = *p;
        const Json& status = (*p).value("status", Json::object());
        const std::string phase = status.value("phase", "");
        if (phase == "Failed" || phase == "Succeeded") {
          out.kind = PodOutcome::kRefused;
          out.reason = status.value("reason", phase);
          out.message = status.value("message", "");
          if (out.message.empty()) out.message = TerminatedText(status);
          return out;
        }
        bool all_running = phase == "Running";
        for (const Json& c : status.value("containerStatuses", Json::array())) {
          const Json& state = c.value("state", Json::object());
          if (!state.contains("running")) all_running = false;
          if (!state.contains("waiting")) continue;
          const std::string why = state["waiting"].value("reason", "");
          if (why == "ErrImageNeverPull" || why == "ErrImagePull" ||
              why == "ImagePullBackOff" || why == "InvalidImageName") {
            out.kind = PodOutcome::kImage;
          } else if (why == "CreateContainerError" || why == "CreateContainerConfigError" ||
                     why == "RunContainerError" || why == "StartError") {
            out.kind = PodOutcome::kContainerError;
          } else {
            continue;
          }
          out.reason = why;
          out.message = state["waiting"].value("message", "");
          return out;
        }
        if (all_running) {
          out.kind = PodOutcome::kRunning;
          return out;
        }
        out.reason = phase;
      } else {
        out.reason = std::string(p.status().message());
      }
      if (absl::Now() >= deadline) {
        out.kind = PodOutcome::kTimeout;
        if (std::string warning = LatestWarning(pod); !warning.empty()) {
          absl::StrAppend(&out.reason, "; the latest warning: ", warning);
        }
        return out;
      }
      absl::SleepFor(kPoll);
    }
  }

  // The newest Warning event about the pod ("FailedMount: ..."), or "".
  std::string LatestWarning(const std::string& pod) {
    absl::StatusOr<Json> events = api_->Get(absl::StrCat(
        "/api/v1/namespaces/", namespace_, "/events?fieldSelector=involvedObject.name%3D", pod));
    if (!events.ok()) return "";
    std::string newest, text;
    for (const Json& e : (*events).value("items", Json::array())) {
      if (e.value("type", "") != "Warning") continue;
      const std::string at = e.value("lastTimestamp", e.value("eventTime", ""));
      if (!text.empty() && at < newest) continue;
      newest = at;
      text = absl::StrCat(e.value("reason", ""), ": ", e.value("message", ""));
    }
    return text;
  }

  // Deletes the pod and waits until it is gone (its containers stopped), up
  // to `timeout`.
  absl::Status DeletePod(const std::string& pod, absl::Duration timeout) {
    absl::StatusOr<Json> d = api_->Delete(absl::StrCat(PodsPath(), "/", pod));
    if (!d.ok() && !absl::IsNotFound(d.status())) return d.status();
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<Json> p = GetPod(pod);
      if (absl::IsNotFound(p.status())) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "pod ", namespace_, "/", pod, " was not gone ", absl::FormatDuration(timeout),
            " after its deletion"));
      }
      absl::SleepFor(kPoll);
    }
  }

  // Deletes every pod dpconform made in the namespace (a run stopped half
  // way leaves some).
  absl::Status DeleteOurPods(absl::Duration timeout) {
    absl::StatusOr<Json> list = api_->Get(absl::StrCat(
        PodsPath(), "?labelSelector=app.kubernetes.io%2Fmanaged-by%3D", kManagedBy));
    if (!list.ok()) return list.status();
    for (const Json& p : (*list).value("items", Json::array())) {
      if (absl::Status s = DeletePod(p["metadata"].value("name", ""), timeout); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  RealNode(const ConformOptions& o, std::unique_ptr<KubeClient> api)
      : o_(o),
        api_(std::move(api)),
        namespace_(o.real.namespace_),
        pod_resources_(JoinPath(o.real.kubelet_root, "pod-resources/kubelet.sock")),
        stub_(v1::PodResourcesLister::NewStub(MakeUnixChannel(pod_resources_, 64 << 20))) {}

  std::string PodsPath() const { return absl::StrCat("/api/v1/namespaces/", namespace_, "/pods"); }

  Json Container(const std::string& name, const Json& resources) const {
    return {{"name", name},
            {"image", o_.real.pod_image},
            {"imagePullPolicy", "Never"},
            {"command", {"/bin/sh", "-c", kPodScript}},
            {"resources", resources}};
  }

  // A pod of dpconform's, its spec `spec` with what every pod has.
  Json PodManifest(const std::string& pod, const Json& containers, Json spec) const {
    spec["hostNetwork"] = true;
    // It needs no API access, and a cluster may have no service account or
    // CA config map in the namespace yet.
    spec["automountServiceAccountToken"] = false;
    spec["restartPolicy"] = "Never";
    spec["terminationGracePeriodSeconds"] = 5;
    spec["tolerations"] = {{{"operator", "Exists"}}};
    spec["containers"] = containers;
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata",
             {{"name", pod},
              {"namespace", namespace_},
              {"labels", {{"app.kubernetes.io/managed-by", kManagedBy}}}}},
            {"spec", std::move(spec)}};
  }

  absl::Status FindNode() {
    name_ = o_.real.node;
    if (name_.empty()) {
      absl::StatusOr<Json> nodes = api_->Get("/api/v1/nodes");
      if (!nodes.ok()) return nodes.status();
      std::vector<std::string> names;
      for (const Json& n : (*nodes).value("items", Json::array())) {
        names.push_back(n["metadata"].value("name", ""));
      }
      if (names.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--node: the cluster has ", names.size(), " nodes (", absl::StrJoin(names, ", "),
            "); name the one whose kubelet runs here"));
      }
      name_ = names[0];
    }
    absl::StatusOr<Json> node = api_->Get(absl::StrCat("/api/v1/nodes/", name_));
    if (!node.ok()) return node.status();
    kubelet_version_ = (*node)["status"]["nodeInfo"].value("kubeletVersion", "");
    kubelet_port_ = (*node)["status"].value("/daemonEndpoints/kubeletEndpoint/Port"_json_pointer, 0);
    if (kubelet_version_.size() < 4 || kubelet_version_[0] != 'v') {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", name_, " reports no kubelet version (\"", kubelet_version_, "\")"));
    }
    return absl::OkStatus();
  }

  absl::Status Unreachable(const char* call, const grpc::Status& st) const {
    return absl::UnavailableError(absl::StrCat("the kubelet's pod-resources socket ",
                                               pod_resources_, " did not answer ", call, ": ",
                                               st.error_message()));
  }

  static std::string TerminatedText(const Json& status) {
    for (const Json& c : status.value("containerStatuses", Json::array())) {
      const Json& t = c.value("state", Json::object()).value("terminated", Json::object());
      if (!t.empty()) {
        return absl::StrCat("container ", c.value("name", ""), " ended: ",
                            t.value("reason", ""), " (exit ", t.value("exitCode", -1), ")");
      }
    }
    return "";
  }

  const ConformOptions& o_;
  std::unique_ptr<KubeClient> api_;
  const std::string namespace_;
  const std::string pod_resources_;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub_;
  std::string name_;
  std::string kubelet_version_;
  int kubelet_port_ = 0;
  // The kubelet's port, for its metrics where the API server cannot reach
  // it (KubeletMetrics).
  std::unique_ptr<KubeClient> kubelet_;
  bool direct_ = false;
  std::string proxy_error_;
};

// The node of options.real_kubelets, connected, its kubelet checked to be
// the release each names; an error naming what is wrong otherwise.
absl::StatusOr<std::unique_ptr<RealNode>> ConnectRealNode(const ConformOptions& o);

// A short ID of this run: its pods' (and claims') names begin
// dpconform-<id>-<cell>.
std::string RealRunId();

// Plays the scenarios of `all` the options select (--scenarios, or every
// one but `needs_restart` without --restart_kubelet) on each real kubelet,
// one cell at a time: `play(scenario, i, dir)` is cell i's result, named and
// timed here.
using PlayRealCell =
    std::function<CellResult(const std::string& scenario, size_t i, const std::string& dir)>;
absl::StatusOr<std::vector<CellResult>> RunRealCells(const ConformOptions& o, const RealNode& n,
                                                     const std::vector<std::string>& all,
                                                     const std::string& needs_restart,
                                                     const PlayRealCell& play);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_REAL_NODE_H_
