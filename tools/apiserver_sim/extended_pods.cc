#include "tools/apiserver_sim/extended_pods.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dpproxy::sim {

ExtendedResourcePods::ExtendedResourcePods(KubeletSim* kubelet, KubeClient* api,
                                           std::string resource, std::string node)
    : kubelet_(kubelet), api_(api), resource_(std::move(resource)), node_(std::move(node)) {}

absl::StatusOr<ExtendedResourcePods::Pod> ExtendedResourcePods::Start(const std::string& name,
                                                                      int count) {
  // The node as the scheduler sees it: its allocatable for the resource
  // as the node's status shows it (the device plugin's healthy devices at
  // the kubelet's last status update, not now), its taints, and what its
  // pods request. The Node in the API server where it has one, else the
  // kubelet's own status.
  const State st = kubelet_->GetState();
  int64_t allocatable = 0;
  for (const ResourceState& r : st.resources()) {
    if (r.name() == resource_) allocatable = r.status_allocatable();
  }
  absl::StatusOr<nlohmann::json> node = api_->Get(absl::StrCat("/api/v1/nodes/", node_));
  if (node.ok()) {
    const nlohmann::json& a = node->value("/status/allocatable"_json_pointer,
                                          nlohmann::json::object());
    int64_t n = 0;
    if (a.contains(resource_) && a[resource_].is_string() &&
        !absl::SimpleAtoi(a[resource_].get<std::string>(), &n)) {
      n = 0;
    }
    allocatable = n;
    // A NoSchedule taint the pod does not tolerate (it tolerates none):
    // the node is not considered.
    for (const nlohmann::json& t :
         node->value("/spec/taints"_json_pointer, nlohmann::json::array())) {
      if (t.value("effect", "") == "NoSchedule" || t.value("effect", "") == "NoExecute") {
        return absl::ResourceExhaustedError(absl::StrCat(
            "pod ", name, " is pending: 0/1 nodes are available: 1 node(s) had untolerated "
            "taint {", t.value("key", ""), ": ", t.value("value", ""), "}"));
      }
    }
  } else if (node.status().code() != absl::StatusCode::kNotFound) {
    return node.status();
  }
  // Every running pod's request of the resource counts, as the real
  // scheduler counts it: those the device plugin serves and those a claim
  // serves alike (the pod's spec asks for the extended resource either way).
  int64_t requested = 0;
  for (const PodState& p : st.pods()) {
    if (p.phase() != "Running") continue;
    for (const ContainerRequest& c : p.containers()) {
      if (c.resource() == resource_ && !c.init()) requested += c.count();
    }
    for (const RuntimeDevices& r : p.running()) {
      if (r.resource() == resource_) requested += r.claim_devices_size();
    }
  }
  absl::StatusOr<ExtendedResourceRoute> route = RouteExtendedResource(api_, resource_, allocatable);
  if (!route.ok()) return route.status();

  AllocateRequest req;
  req.set_pod_name(name);
  ContainerRequest* c = req.add_containers();
  c->set_name("main");
  c->set_resource(resource_);
  c->set_count(count);
  Pod pod;
  pod.name = name;
  pod.route = *route;
  switch (*route) {
    case ExtendedResourceRoute::kNone:
      return absl::ResourceExhaustedError(absl::StrCat(
          "pod ", name, " is pending: 0/1 nodes are available: Insufficient ", resource_));
    case ExtendedResourceRoute::kDevicePlugin:
      if (allocatable - requested < count) {
        return absl::ResourceExhaustedError(
            absl::StrCat("pod ", name, " is pending: 0/1 nodes are available: Insufficient ",
                         resource_, " (allocatable ", allocatable, ", requested ", requested,
                         ")"));
      }
      break;
    case ExtendedResourceRoute::kDra: {
      ExtendedResourcePod ask;
      ask.name = name;
      ask.node = node_;
      ask.containers.push_back({"main", {{resource_, count}}});
      absl::StatusOr<GeneratedClaim> claim = CreateExtendedResourceClaim(api_, ask);
      if (!claim.ok()) {
        if (claim.status().code() != absl::StatusCode::kFailedPrecondition) return claim.status();
        return absl::ResourceExhaustedError(
            absl::StrCat("pod ", name, " is pending: ", claim.status().message()));
      }
      const nlohmann::json& meta = claim->claim["metadata"];
      ExtendedResourceClaim* e = req.mutable_extended_resource_claim();
      e->set_namespace_(meta.value("namespace", "default"));
      e->set_name(meta.value("name", ""));
      e->set_uid(meta.value("uid", ""));
      e->set_driver(claim->claim.value("/status/allocation/devices/results/0/driver"_json_pointer,
                                       std::string()));
      for (const nlohmann::json& m : claim->status["requestMappings"]) {
        auto* mapping = e->add_request_mappings();
        mapping->set_container(m.value("containerName", ""));
        mapping->set_resource(m.value("resourceName", ""));
        mapping->set_request(m.value("requestName", ""));
      }
      pod.claim = absl::StrCat(e->namespace_(), "/", e->name());
      pod.claim_path = absl::StrCat("/apis/", claim->claim.value("apiVersion", ""),
                                    "/namespaces/", e->namespace_(), "/resourceclaims/",
                                    e->name());
      break;
    }
  }
  absl::StatusOr<AllocateResponse> admitted = kubelet_->Allocate(req);
  if (!admitted.ok()) {
    // The pod will not run here: the claim controller deletes its claim.
    if (!pod.claim_path.empty()) (void)api_->Delete(pod.claim_path);
    return admitted.status();
  }
  pod.uid = admitted->pod_uid();
  for (const ContainerAllocation& a : admitted->allocations()) {
    pod.devices.insert(pod.devices.end(), a.device_ids().begin(), a.device_ids().end());
  }
  for (const RuntimeDevices& r : admitted->claim_served()) {
    pod.devices.insert(pod.devices.end(), r.claim_devices().begin(), r.claim_devices().end());
  }
  running_[pod.uid] = pod;
  return pod;
}

absl::Status ExtendedResourcePods::End(const std::string& uid) {
  auto it = running_.find(uid);
  if (it == running_.end()) {
    return absl::NotFoundError(absl::StrCat("no running pod ", uid, " was placed here"));
  }
  absl::Status s = kubelet_->DeletePod(uid);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) return s;
  if (!it->second.claim_path.empty()) {
    absl::StatusOr<nlohmann::json> gone = api_->Delete(it->second.claim_path);
    if (!gone.ok()) return gone.status();
  }
  running_.erase(it);
  return absl::OkStatus();
}

}  // namespace dpproxy::sim
