// KubeletSim's pods and state: the node's status, the state a test reads,
// re-admission on demand, pods deleted and containers restarted, and the
// waits tests use.
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {

using kubelet_sim_internal::MakeAllocation;

void KubeletSim::UpdateNodeStatus() {
  std::map<std::string, int64_t> status;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || absl::Now() < status_due_) return;
    status_due_ = absl::Now() + options_.node_status_period;
    status = state_.AllAllocatable();
    if (status != status_allocatable_) {
      nlohmann::json shown = nlohmann::json::object();
      for (const auto& [name, n] : status) shown[name] = n;
      events_.Emit("node_status_updated", {{"allocatable", shown}});
    }
    status_allocatable_ = status;
  }
  if (options_.on_node_status) options_.on_node_status(status);
}

State KubeletSim::GetState() {
  State st;
  absl::MutexLock lock(&mu_);
  st.set_personality(PersonalityName(kubelet_.personality));
  st.set_kubelet(kubelet_.name);
  st.set_generation(kubelet_.GenerationName());
  st.set_starts(starts_);
  st.set_root_dir(options_.root_dir);
  st.set_pods_synced(pods_synced_);
  state_.FillState(absl::Now(), &st);
  for (ResourceState& r : *st.mutable_resources()) {
    if (options_.node_status_period <= absl::ZeroDuration()) {
      r.set_status_allocatable(r.allocatable());
    } else {
      auto it = status_allocatable_.find(r.name());
      r.set_status_allocatable(it == status_allocatable_.end() ? 0 : it->second);
    }
  }
  return st;
}

ReadmitResponse KubeletSim::Readmit() {
  ReadmitResponse resp;
  absl::MutexLock admit(&admit_mu_);
  absl::MutexLock lock(&mu_);
  for (ReadmitResult& r : state_.Readmit()) {
    events_.Emit(r.admitted() ? "readmitted" : "readmission_failed",
                 {{"pod", r.pod_name()},
                  {"pod_uid", r.pod_uid()},
                  {"container", r.container()},
                  {"resource", r.resource()},
                  {"reason", r.reason()},
                  {"message", r.message()}});
    *resp.add_results() = std::move(r);
  }
  WriteCheckpointLocked();
  return resp;
}

absl::StatusOr<std::vector<RuntimeDevices>> KubeletSim::PrepareExtendedResourceClaim(
    const AllocateRequest& req) {
  const ExtendedResourceClaim& e = req.extended_resource_claim();
  const std::string claim = absl::StrCat(e.namespace_(), "/", e.name());
  absl::StatusOr<nlohmann::json> r = PrepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
  std::string error;
  if (!r.ok()) {
    error = std::string(r.status().message());
  } else if (!r->contains(e.uid())) {
    error = "the driver's answer does not name the claim";
  } else {
    error = (*r)[e.uid()].value("error", "");
  }
  if (!error.empty()) {
    events_.Emit("pod_waits_for_claim",
                 {{"pod", req.pod_name()}, {"claim", claim}, {"error", error}});
    return absl::UnavailableError(absl::StrCat("pod ", req.pod_name(), " waits: preparing claim ",
                                               claim, " failed: ", error));
  }
  // Each mapped container gets the devices of its request.
  std::vector<RuntimeDevices> out;
  for (const auto& m : e.request_mappings()) {
    RuntimeDevices run;
    run.set_container(m.container());
    run.set_resource(m.resource());
    for (const nlohmann::json& d : (*r)[e.uid()].value("devices", nlohmann::json::array())) {
      const std::vector<std::string> requests =
          d.value("request_names", std::vector<std::string>());
      if (std::find(requests.begin(), requests.end(), m.request()) == requests.end()) continue;
      run.add_claim_devices(d.value("device", ""));
      run.add_claim_pools(d.value("pool", ""));
      run.set_claim_driver(e.driver());
      for (const std::string& id : d.value("cdi_device_ids", std::vector<std::string>())) {
        run.add_cdi_device_ids(id);
      }
    }
    events_.Emit("allocated_from_claim",
                 {{"pod", req.pod_name()},
                  {"container", m.container()},
                  {"resource", m.resource()},
                  {"claim", claim},
                  {"devices", std::vector<std::string>(run.claim_devices().begin(),
                                                       run.claim_devices().end())},
                  {"cdi_devices", std::vector<std::string>(run.cdi_device_ids().begin(),
                                                           run.cdi_device_ids().end())}});
    out.push_back(std::move(run));
  }
  return out;
}

absl::Status KubeletSim::DeletePod(const std::string& uid) {
  absl::MutexLock admit(&admit_mu_);
  std::optional<ExtendedResourceClaim> claim;
  {
    absl::MutexLock lock(&mu_);
    const PodState* p = state_.FindPod(uid);
    if (p != nullptr && p->has_extended_resource_claim() && p->phase() == "Running") {
      claim = p->extended_resource_claim();
    }
  }
  if (claim.has_value()) {
    // The pod's containers are gone: the kubelet unprepares its claim, and
    // keeps the pod until that succeeds.
    absl::StatusOr<nlohmann::json> r =
        UnprepareClaims(claim->driver(), {{claim->namespace_(), claim->name(), claim->uid()}});
    std::string error = r.ok() ? (*r).value(claim->uid(), nlohmann::json::object())
                                     .value("error", "")
                               : std::string(r.status().message());
    if (!error.empty()) {
      return absl::UnavailableError(absl::StrCat("pod ", uid, " stays: unpreparing claim ",
                                                 claim->namespace_(), "/", claim->name(),
                                                 " failed: ", error));
    }
  }
  absl::MutexLock lock(&mu_);
  DPP_RETURN_IF_ERROR(state_.DeletePod(uid));
  events_.Emit("pod_deleted", {{"pod_uid", uid}});
  pod_dirs_gone_at_[uid] = absl::Now() + options_.pod_dir_linger;
  WriteCheckpointLocked();
  return absl::OkStatus();
}

absl::StatusOr<RestartContainerResponse> KubeletSim::RestartContainer(
    const std::string& uid, const std::string& container) {
  absl::MutexLock admit(&admit_mu_);
  std::vector<ContainerRequest> specs;
  std::string pod_name, pod_namespace;
  std::map<std::string, ContainerAllocation> recorded;  // by resource
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is not running");
    auto pod = state_.pods().find(uid);
    if (pod == state_.pods().end() || pod->second.phase() != "Running") {
      return absl::NotFoundError(absl::StrCat("no running pod with uid ", GoQuote(uid)));
    }
    pod_name = pod->second.name();
    pod_namespace = pod->second.namespace_();
    for (const ContainerRequest& c : pod->second.containers()) {
      if (!c.init() && c.name() == container) specs.push_back(c);
    }
    for (const ContainerAllocation& a : state_.allocations()) {
      if (a.pod_uid() == uid && a.container() == container) recorded[a.resource()] = a;
    }
    state_.StopContainer(uid, container);
  }
  if (specs.empty()) {
    return absl::NotFoundError(absl::StrCat("pod ", GoQuote(uid), " has no container ",
                                            GoQuote(container)));
  }
  RestartContainerResponse resp;
  for (const ContainerRequest& c : specs) {
    RuntimeDevices run;
    run.set_container(container);
    run.set_resource(c.resource());
    auto rec = recorded.find(c.resource());
    if (rec != recorded.end()) {
      run.mutable_device_ids()->CopyFrom(rec->second.device_ids());
    } else {
      // The kubelet holds no devices for it (it lost its checkpoint).
      events_.Emit("reallocating", {{"pod", pod_name},
                                    {"pod_uid", uid},
                                    {"container", container},
                                    {"resource", c.resource()},
                                    {"note", "Needs to re-allocate device plugin resources for pod"}});
      absl::StatusOr<std::vector<std::string>> ids = PickDevices(c, {});
      absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> r =
          ids.ok() ? CallAllocate(c.resource(), {*ids}, nullptr)
                   : absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>>(ids.status());
      if (!r.ok()) {
        const std::string message = std::string(r.status().message());
        events_.Emit("container_start_failed", {{"pod", pod_name},
                                                {"pod_uid", uid},
                                                {"container", container},
                                                {"reason", "CreateContainerConfigError"},
                                                {"message", message}});
        return absl::FailedPreconditionError(message);
      }
      const ContainerAllocation a = MakeAllocation(uid, pod_name, pod_namespace, container,
                                                   c.resource(), *ids, (*r)[0]);
      {
        absl::MutexLock lock(&mu_);
        state_.AddAllocation(a);
        WriteCheckpointLocked();
      }
      run.mutable_device_ids()->CopyFrom(a.device_ids());
      resp.set_reallocated(true);
    }
    *resp.add_running() = run;
  }
  {
    absl::MutexLock lock(&mu_);
    for (const RuntimeDevices& run : resp.running()) state_.AddRunning(uid, run);
    WriteCheckpointLocked();
  }
  events_.Emit("container_restarted", {{"pod", pod_name},
                                       {"pod_uid", uid},
                                       {"container", container},
                                       {"reallocated", resp.reallocated()}});
  return resp;
}

bool KubeletSim::WaitForPodsSynced(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto synced = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    return running_ && pods_synced_said_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&synced), timeout);
}

std::set<std::string> KubeletSim::UnsyncedPods() {
  absl::MutexLock lock(&mu_);
  return unsynced_pods_;
}

bool KubeletSim::WaitForResource(const std::string& resource, int min_healthy,
                                 absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> bool {
    const ResourceRecord* r = state_.Find(resource);
    return r != nullptr && r->connected && state_.Allocatable(resource) >= min_healthy;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
}

}  // namespace dpproxy::sim
