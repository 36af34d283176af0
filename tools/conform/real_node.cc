#include "tools/conform/real_node.h"

#include <dirent.h>

#include <algorithm>

#include <grpcpp/client_context.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy::conform {

std::set<std::string> RegisteredSockets(const std::string& metrics) {
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

RegistrationInfo GetInfo(const std::string& socket) {
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

std::vector<std::string> SocketsIn(const std::string& dir) {
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

Problem OutcomeProblem(const std::string& owner, const std::string& pod, const PodOutcome& out,
                       absl::Duration timeout, const PodOutcomeTexts& t) {
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

absl::StatusOr<std::unique_ptr<RealNode>> RealNode::Connect(const ConformOptions& o) {
  absl::StatusOr<KubeConfig> config = LoadKubeconfig(o.real.kubeconfig);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<KubeClient>> api = KubeClient::Create(*config);
  if (!api.ok()) return api.status();
  auto node = std::unique_ptr<RealNode>(new RealNode(o, *std::move(api)));
  if (absl::Status s = node->FindNode(); !s.ok()) return s;
  return node;
}

std::string RealNode::minor() const {
  const size_t second = kubelet_version_.find('.', kubelet_version_.find('.') + 1);
  return kubelet_version_.substr(1, second == std::string::npos ? std::string::npos : second - 1);
}

absl::StatusOr<std::string> RealNode::KubeletMetrics() {
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

absl::StatusOr<std::map<std::string, std::vector<RealNode::ClaimDevice>>> RealNode::ContainerClaims(
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

absl::StatusOr<std::set<std::string>> RealNode::Allocatable(const std::string& resource) {
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

absl::StatusOr<std::map<std::string, std::vector<std::string>>> RealNode::ContainerDevices(
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

absl::StatusOr<int64_t> RealNode::NodeAllocatable(const std::string& resource) {
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

absl::Status RealNode::CreatePod(const std::string& pod,
                       const std::vector<std::pair<std::string, int>>& containers) {
  Json list = Json::array();
  for (size_t i = 0; i < containers.size(); ++i) {
    const auto& [resource, count] = containers[i];
    list.push_back(
        Container(absl::StrCat("c", i), {{"limits", {{resource, absl::StrCat(count)}}}}));
  }
  return api_->Post(PodsPath(), PodManifest(pod, list, {{"nodeName", name_}})).status();
}

absl::Status RealNode::CreateClaimPod(const std::string& pod, const std::string& claim,
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

absl::StatusOr<Json> RealNode::GetPod(const std::string& pod) {
  return api_->Get(absl::StrCat(PodsPath(), "/", pod));
}

std::string RealNode::RunningContainerId(const std::string& pod) {
  absl::StatusOr<Json> p = GetPod(pod);
  if (!p.ok()) return "";
  for (const Json& c : (*p)["status"].value("containerStatuses", Json::array())) {
    if (c.value("state", Json::object()).contains("running")) return c.value("containerID", "");
  }
  return "";
}

PodOutcome RealNode::WaitPod(const std::string& pod, absl::Duration timeout) {
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

std::string RealNode::LatestWarning(const std::string& pod) {
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

absl::Status RealNode::DeletePod(const std::string& pod, absl::Duration timeout) {
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

absl::Status RealNode::DeleteOurPods(absl::Duration timeout) {
  absl::StatusOr<Json> list = api_->Get(absl::StrCat(
      PodsPath(), "?labelSelector=app.kubernetes.io%2Fmanaged-by%3D", kManagedBy));
  if (!list.ok()) return list.status();
  for (const Json& p : (*list).value("items", Json::array())) {
    if (absl::Status s = DeletePod(p["metadata"].value("name", ""), timeout); !s.ok()) return s;
  }
  return absl::OkStatus();
}

Json RealNode::Container(const std::string& name, const Json& resources) const {
  return {{"name", name},
          {"image", o_.real.pod_image},
          {"imagePullPolicy", "Never"},
          {"command", {"/bin/sh", "-c", kPodScript}},
          {"resources", resources}};
}

Json RealNode::PodManifest(const std::string& pod, const Json& containers, Json spec) const {
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

absl::Status RealNode::FindNode() {
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

absl::Status RealNode::Unreachable(const char* call, const grpc::Status& st) const {
  return absl::UnavailableError(absl::StrCat("the kubelet's pod-resources socket ",
                                             pod_resources_, " did not answer ", call, ": ",
                                             st.error_message()));
}

std::string RealNode::TerminatedText(const Json& status) {
  for (const Json& c : status.value("containerStatuses", Json::array())) {
    const Json& t = c.value("state", Json::object()).value("terminated", Json::object());
    if (!t.empty()) {
      return absl::StrCat("container ", c.value("name", ""), " ended: ",
                          t.value("reason", ""), " (exit ", t.value("exitCode", -1), ")");
    }
  }
  return "";
}

}  // namespace dpproxy::conform
