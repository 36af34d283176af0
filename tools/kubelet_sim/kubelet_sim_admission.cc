// KubeletSim's admission: housekeeping of ended pods and re-admission
// after a start, the device manager's checkpoint, and a pod's devices
// picked (GetPreferredAllocation), allocated and started (PreStartContainer).
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {

using kubelet_sim_internal::kAdmissionRpcTimeout;
using kubelet_sim_internal::kPodsFileName;
using kubelet_sim_internal::kPreStartTimeout;
using kubelet_sim_internal::kUnexpectedAdmissionError;
using kubelet_sim_internal::MakeAllocation;
using kubelet_sim_internal::NewPodUid;

void KubeletSim::Housekeeping() {
  // The plugin watcher's first pass comes one period after the start.
  absl::Time watcher_due = absl::Now() + options_.watcher_period;
  for (;;) {
    // Once a second, when the re-admission of the pods found at start is
    // due, and at each pass of the plugin watcher.
    absl::Duration wait = std::min(absl::Seconds(1), watcher_due - absl::Now());
    int64_t start = 0;
    {
      absl::MutexLock lock(&mu_);
      if (running_ && options_.node_status_period > absl::ZeroDuration()) {
        wait = std::min(wait, status_due_ - absl::Now());
      }
      if (running_ && !pods_synced_) {
        wait = std::min(wait, started_at_ + options_.readmit_delay - absl::Now());
        start = starts_;
      }
    }
    {
      absl::MutexLock lock(&stop_mu_);
      if (wait > absl::ZeroDuration()) {
        stop_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_), wait);
      }
      if (stop_housekeeping_) return;
    }
    if (start != 0) {
      bool due = false;
      {
        absl::MutexLock lock(&mu_);
        due = running_ && !pods_synced_ && starts_ == start &&
              absl::Now() >= started_at_ + options_.readmit_delay;
      }
      if (due) ReadmitAfterStart(start);
    }
    UpdateNodeStatus();
    if (absl::Now() >= watcher_due) {
      watcher_due = absl::Now() + options_.watcher_period;
      bool watching = false;
      {
        absl::MutexLock lock(&mu_);
        watching = running_ && kubelet_.plugin_watcher;
      }
      if (watching) plugin_manager_.Reconcile();
    }
    absl::MutexLock lock(&mu_);
    if (!running_) continue;
    const absl::Time now = absl::Now();
    for (auto it = pod_dirs_gone_at_.begin(); it != pod_dirs_gone_at_.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      (void)::rmdir(JoinPath(JoinPath(options_.root_dir, "pods"), it->first).c_str());
      events_.Emit("pod_dir_removed", {{"pod_uid", it->first}});
      it = pod_dirs_gone_at_.erase(it);
    }
    std::vector<std::string> removed = state_.ExpireResources(now, Grace());
    for (const std::string& r : removed) {
      events_.Emit("resource_removed",
                   {{"resource", r}, {"reason", "grace period after plugin loss ended"}});
    }
    if (!removed.empty()) WriteCheckpointLocked();
  }
}

void KubeletSim::ReadmitAfterStart(int64_t start) {
  absl::MutexLock admit(&admit_mu_);
  std::vector<DeviceManager::RefitResult> results;
  KubeletVersion kubelet;
  {
    absl::MutexLock lock(&mu_);
    if (!running_ || starts_ != start || pods_synced_) return;
    results = state_.RefitRunningPods();
    kubelet = kubelet_;
  }
  int admitted = 0, denied = 0, reallocated = 0, failed = 0;
  for (const DeviceManager::RefitResult& r : results) {
    if (!r.admitted) {
      ++denied;
      events_.Emit("readmission_denied", {{"pod", r.pod_name},
                                          {"pod_uid", r.pod_uid},
                                          {"reason", r.reason},
                                          {"message", r.message},
                                          {"note", "Pod admission denied; killing its containers"}});
      continue;
    }
    ++admitted;
    std::string error;
    std::set<std::string> taken;
    for (const ContainerRequest& c : r.forgotten) {
      bool runs = false;
      {
        absl::MutexLock lock(&mu_);
        if (const PodState* p = state_.FindPod(r.pod_uid); p != nullptr) {
          for (const RuntimeDevices& run : p->running()) runs |= run.container() == c.name();
        }
      }
      if (kubelet.minor >= 25 && runs) {
        // kubernetes#118635: a container the runtime reports running is
        // left alone; its devices stay unknown to the kubelet.
        events_.Emit("container_running", {{"pod", r.pod_name},
                                           {"pod_uid", r.pod_uid},
                                           {"container", c.name()},
                                           {"resource", c.resource()},
                                           {"note", "Container detected running, nothing to do"}});
        continue;
      }
      // Before 1.25 the kubelet allocates again for a container it holds
      // nothing for, running or not; from 1.25 for one that does not run
      // (a container that never started: observed on a 1.36.2 node).
      absl::StatusOr<std::vector<std::string>> ids = PickDevices(c, taken);
      absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> resp =
          ids.ok() ? CallAllocate(c.resource(), {*ids}, nullptr)
                   : absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>>(ids.status());
      if (!resp.ok()) {
        error = std::string(resp.status().message());
        break;
      }
      taken.insert(ids->begin(), ids->end());
      const ContainerAllocation a = MakeAllocation(r.pod_uid, r.pod_name, r.pod_namespace,
                                                   c.name(), c.resource(), *ids, (*resp)[0]);
      {
        absl::MutexLock lock(&mu_);
        state_.AddAllocation(a);
      }
      ++reallocated;
      events_.Emit("reallocated", {{"pod", r.pod_name},
                                   {"pod_uid", r.pod_uid},
                                   {"container", c.name()},
                                   {"resource", c.resource()},
                                   {"devices", *ids}});
    }
    if (!error.empty()) {
      ++failed;
      const std::string message = absl::StrCat("Allocate failed due to ", error,
                                               ", which is unexpected");
      {
        absl::MutexLock lock(&mu_);
        state_.FailPod(r.pod_uid, kUnexpectedAdmissionError, message);
      }
      events_.Emit("readmission_failed", {{"pod", r.pod_name},
                                          {"pod_uid", r.pod_uid},
                                          {"reason", kUnexpectedAdmissionError},
                                          {"message", message}});
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (starts_ == start) {
      pods_synced_ = true;
      unsynced_pods_.clear();
    }
    WriteCheckpointLocked();
  }
  events_.Emit("pods_synced", {{"admitted", admitted},
                               {"denied", denied},
                               {"reallocated", reallocated},
                               {"failed", failed}});
  absl::MutexLock lock(&mu_);
  if (starts_ == start) pods_synced_said_ = true;
}

void KubeletSim::WriteCheckpointLocked() { WriteCheckpoint(CheckpointFilesLocked()); }

KubeletSim::CheckpointFiles KubeletSim::CheckpointFilesLocked() {
  CheckpointFiles files;
  files.seq = ++checkpoint_seq_;
  if (!checkpoint_writes_held_) files.checkpoint = state_.CheckpointJson(kubelet_.minor);
  files.pods = state_.PodsJson();
  return files;
}

void KubeletSim::WriteCheckpoint(const CheckpointFiles& files) {
  absl::MutexLock lock(&checkpoint_mu_);
  if (files.seq <= checkpoint_written_) return;  // newer ones are on disk
  checkpoint_written_ = files.seq;
  absl::Status s = files.checkpoint.has_value()
                       ? WriteFileAtomic(checkpoint_path(), *files.checkpoint)
                       : absl::OkStatus();
  if (s.ok()) s = WriteFileAtomic(JoinPath(options_.root_dir, kPodsFileName), files.pods);
  if (!s.ok()) events_.Emit("checkpoint_write_failed", {{"error", std::string(s.message())}});
}


// --- Admission -------------------------------------------------------------------

absl::StatusOr<AllocateResponse> KubeletSim::Allocate(const AllocateRequest& request) {
  if (request.containers().empty()) {
    return absl::InvalidArgumentError("pod has no containers");
  }
  std::set<std::string> names;
  for (const ContainerRequest& c : request.containers()) {
    if (c.name().empty()) return absl::InvalidArgumentError("a container has no name");
    if (!names.insert(c.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("container name ", GoQuote(c.name()), " is used twice"));
    }
    if (c.resource().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("container ", GoQuote(c.name()), " names no resource"));
    }
    if (c.count() < 0 || (c.count() == 0 && c.device_ids().empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ", GoQuote(c.name()), " must request at least one device"));
    }
    if (!c.device_ids().empty() && c.count() != 0 && c.count() != c.device_ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ", GoQuote(c.name()), " asks for ", c.count(), " devices but names ",
          c.device_ids_size()));
    }
  }
  AllocateRequest req = request;
  if (req.pod_uid().empty()) req.set_pod_uid(NewPodUid());
  if (req.pod_namespace().empty()) req.set_pod_namespace("default");
  if (req.pod_name().empty()) req.set_pod_name(absl::StrCat("pod-", req.pod_uid().substr(0, 8)));
  // The containers' requests an extended-resource claim serves leave the
  // device manager's part of the pod.
  AllocateRequest device_manager_part = req;
  if (req.has_extended_resource_claim()) {
    const ExtendedResourceClaim& e = req.extended_resource_claim();
    // DRAExtendedResource: alpha and off by default in 1.34-1.35, beta and
    // on from 1.36 (the kubelet's feature gates); the simulator plays the defaults.
    if (kubelet().minor < 36) {
      return absl::FailedPreconditionError(absl::StrCat(
          "extended resources served through DRA need kubelet 1.36 or later, where "
          "DRAExtendedResource is on by default (1.34-1.35: alpha, off); this kubelet is ",
          kubelet().name));
    }
    if (e.name().empty() || e.uid().empty() || e.driver().empty() ||
        e.request_mappings().empty()) {
      return absl::InvalidArgumentError(
          "extended_resource_claim needs the claim's name, uid and driver and at least one "
          "request mapping");
    }
    std::set<std::pair<std::string, std::string>> mapped;
    for (const auto& m : e.request_mappings()) {
      bool found = false;
      for (const ContainerRequest& c : req.containers()) {
        if (c.name() == m.container() && c.resource() == m.resource()) found = true;
      }
      if (!found || m.request().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extended_resource_claim maps container ", GoQuote(m.container()), " resource ",
            m.resource(), found ? " to no request" : ", which the pod does not ask for"));
      }
      mapped.insert({m.container(), m.resource()});
    }
    device_manager_part.clear_containers();
    for (const ContainerRequest& c : req.containers()) {
      if (mapped.count({c.name(), c.resource()}) == 0) *device_manager_part.add_containers() = c;
    }
  }

  absl::MutexLock admit(&admit_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is not running");
    if (state_.HasPod(req.pod_uid())) {
      return absl::AlreadyExistsError(absl::StrCat("pod ", req.pod_uid(), " already exists"));
    }
  }
  AllocateResponse response;
  response.set_pod_uid(req.pod_uid());
  std::vector<RuntimeDevices> claim_served;
  if (req.has_extended_resource_claim()) {
    absl::StatusOr<std::vector<RuntimeDevices>> served = PrepareExtendedResourceClaim(req);
    if (!served.ok()) return served.status();
    claim_served = *std::move(served);
    // Starting the containers: the device manager's run options
    // (GetDeviceRunContainerOptions) take every resource of the container
    // that any pod holds devices of as a device-plugin resource, whether a
    // claim serves this one or not, and look up its endpoint. One the
    // kubelet dropped (endpointStopGracePeriod after it stopped) fails the
    // start (observed on a 1.36.2 node).
    std::string missing;
    {
      absl::MutexLock lock(&mu_);
      for (const RuntimeDevices& r : claim_served) {
        if (state_.Find(r.resource()) != nullptr) continue;
        for (const ContainerAllocation& a : state_.allocations()) {
          const PodState* p = state_.FindPod(a.pod_uid());
          if (a.resource() == r.resource() && p != nullptr && p->phase() == "Running") {
            missing = r.resource();
          }
        }
      }
    }
    if (!missing.empty()) {
      const ExtendedResourceClaim& e = req.extended_resource_claim();
      (void)UnprepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
      const std::string message =
          absl::StrCat("endpoint not found in cache for a registered resource: ", missing);
      events_.Emit("container_start_failed", {{"pod", req.pod_name()},
                                              {"pod_uid", req.pod_uid()},
                                              {"reason", "CreateContainerConfigError"},
                                              {"message", message}});
      return absl::FailedPreconditionError(absl::StrCat("CreateContainerConfigError: ", message));
    }
  }
  absl::Status s = absl::OkStatus();
  if (!device_manager_part.containers().empty()) {
    s = AdmitPod(device_manager_part, &response);
    if (!s.ok() && req.has_extended_resource_claim()) {
      // Admission failed: the pod never starts, its claim is released.
      const ExtendedResourceClaim& e = req.extended_resource_claim();
      (void)UnprepareClaims(e.driver(), {{e.namespace_(), e.name(), e.uid()}});
    }
  } else {
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Running");
    absl::MutexLock lock(&mu_);
    state_.AddPod(pod);
    (void)MakeDirs(JoinPath(JoinPath(options_.root_dir, "pods"), req.pod_uid()));
  }
  if (s.ok() && req.has_extended_resource_claim()) {
    absl::MutexLock lock(&mu_);
    state_.SetExtendedResourceClaim(req.pod_uid(), req.extended_resource_claim());
    for (const RuntimeDevices& r : claim_served) {
      state_.AddRunning(req.pod_uid(), r);
      *response.add_claim_served() = r;
    }
    WriteCheckpointLocked();
  }
  if (!s.ok()) {
    std::string message = absl::StrCat("Allocate failed due to ", s.message(),
                                       ", which is unexpected");
    if (s.code() == absl::StatusCode::kAborted) message = std::string(s.message());
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Failed");
    pod.set_reason(s.code() == absl::StatusCode::kAborted ? "RunContainerError"
                                                          : "UnexpectedAdmissionError");
    pod.set_message(message);
    {
      absl::MutexLock lock(&mu_);
      state_.AddPod(pod);
      state_.FailPod(pod.uid(), pod.reason(), pod.message());
      WriteCheckpointLocked();
    }
    events_.Emit("admission_failed", {{"pod", req.pod_name()},
                                      {"pod_uid", req.pod_uid()},
                                      {"reason", pod.reason()},
                                      {"message", message}});
    return absl::FailedPreconditionError(message);
  }
  return response;
}

absl::StatusOr<std::vector<std::string>> KubeletSim::PickDevices(
    const ContainerRequest& c, const std::set<std::string>& taken,
    const std::vector<std::string>& reusable) {
  const int count = c.count() != 0 ? c.count() : c.device_ids_size();
  if (c.device_ids().empty() && static_cast<int>(reusable.size()) >= count) {
    // An init container's devices suffice: reused as they are.
    return std::vector<std::string>(reusable.begin(), reusable.begin() + count);
  }
  std::vector<std::string> available = reusable;
  std::shared_ptr<PluginClient> client;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::vector<std::string>> avail = state_.AvailableFor(c.resource(), 0);
    if (!avail.ok()) return avail.status();
    for (const std::string& id : *avail) {
      if (taken.count(id) == 0 &&
          std::find(reusable.begin(), reusable.end(), id) == reusable.end()) {
        available.push_back(id);
      }
    }
    auto it = endpoints_.find(c.resource());
    if (it != endpoints_.end()) client = it->second;
  }
  if (static_cast<int>(available.size()) < count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested number of devices unavailable for ", c.resource(),
        ". Requested: ", count, ", Available: ", available.size()));
  }
  if (client == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoint for ", c.resource(), " has been stopped"));
  }
  std::vector<std::string> chosen;
  if (!c.device_ids().empty()) {
    for (const std::string& id : c.device_ids()) {
      if (std::find(available.begin(), available.end(), id) == available.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", GoQuote(id), " of ", c.resource(),
            " is not available (unknown, unhealthy or allocated)"));
      }
      chosen.push_back(id);
    }
  } else if (client->beta && client->options.get_preferred_allocation_available()) {
    // The plugin's answer is advice: what it names of the available
    // devices is used as given, and a short answer is topped up from the
    // available devices in order.
    v1beta1::PreferredAllocationRequest preq;
    auto* cr = preq.add_container_requests();
    for (const std::string& id : available) cr->add_available_deviceids(id);
    for (const std::string& id : reusable) cr->add_must_include_deviceids(id);
    cr->set_allocation_size(count);
    v1beta1::PreferredAllocationResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdmissionRpcTimeout));
    grpc::Status st = client->beta->GetPreferredAllocation(&ctx, preq, &presp);
    if (!st.ok()) {
      return absl::UnknownError(absl::StrCat(
          "device plugin GetPreferredAllocation rpc failed with err: ", GoRpcError(st)));
    }
    std::vector<std::string> preferred, returned;
    for (const auto& r : presp.container_responses()) {
      returned.insert(returned.end(), r.deviceids().begin(), r.deviceids().end());
    }
    if (presp.container_responses_size() > 0) {
      for (const std::string& id : presp.container_responses(0).deviceids()) {
        if (std::find(available.begin(), available.end(), id) != available.end() &&
            std::find(preferred.begin(), preferred.end(), id) == preferred.end()) {
          preferred.push_back(id);
        }
      }
    }
    events_.Emit("preferred_allocation", {{"resource", c.resource()},
                                          {"container", c.name()},
                                          {"available", available},
                                          {"size", count},
                                          {"returned", returned},
                                          {"container_responses",
                                           presp.container_responses_size()},
                                          {"preferred", preferred}});
    chosen = reusable;  // must_include is kept whatever the plugin answers
    for (const std::string& id : preferred) {
      if (static_cast<int>(chosen.size()) >= count) break;
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    for (const std::string& id : available) {
      if (static_cast<int>(chosen.size()) >= count) break;
      if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
    }
    chosen.resize(count);
  } else {
    chosen.assign(available.begin(), available.begin() + count);
  }
  return chosen;
}

absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> KubeletSim::CallAllocate(
    const std::string& resource, const std::vector<std::vector<std::string>>& ids,
    std::shared_ptr<PluginClient>* used) {
  std::shared_ptr<PluginClient> client;
  AllocateHook hook;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(resource);
    if (it != endpoints_.end()) client = it->second;
    hook = before_allocate_;
  }
  if (client == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoint for ", resource, " has been stopped"));
  }
  if (hook) hook(resource, ids);
  if (used != nullptr) *used = client;
  std::vector<v1beta1::ContainerAllocateResponse> responses(ids.size());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdmissionRpcTimeout));
  if (client->beta) {
    v1beta1::AllocateRequest areq;
    for (const std::vector<std::string>& container : ids) {
      auto* cr = areq.add_container_requests();
      for (const std::string& id : container) cr->add_devices_ids(id);
    }
    v1beta1::AllocateResponse aresp;
    grpc::Status st = client->beta->Allocate(&ctx, areq, &aresp);
    if (!st.ok()) return absl::UnknownError(GoRpcError(st));
    if (aresp.container_responses_size() == 0) {
      return absl::UnknownError("no containers return in allocation response");
    }
    if (aresp.container_responses_size() < static_cast<int>(ids.size())) {
      return absl::UnknownError(absl::StrCat(
          "allocation response has ", aresp.container_responses_size(),
          " container responses for ", ids.size(), " container requests"));
    }
    for (size_t k = 0; k < ids.size(); ++k) responses[k] = aresp.container_responses(k);
    return responses;
  }
  if (ids.size() != 1) {
    return absl::InvalidArgumentError("v1alpha plugins take one container per Allocate");
  }
  deviceplugin::AllocateRequest areq;
  for (const std::string& id : ids[0]) areq.add_devicesids(id);
  deviceplugin::AllocateResponse aresp;
  grpc::Status st = client->alpha->Allocate(&ctx, areq, &aresp);
  if (!st.ok()) return absl::UnknownError(GoRpcError(st));
  // A 1.9 kubelet stored the v1alpha response as it came; it parses as a
  // v1beta1 ContainerAllocateResponse (same field numbers). Annotations
  // were never read by a 1.9 kubelet.
  aresp.clear_annotations();
  std::string bytes;
  aresp.SerializeToString(&bytes);
  responses[0].ParseFromString(bytes);
  return responses;
}

absl::Status KubeletSim::AdmitPod(const AllocateRequest& req, AllocateResponse* response) {
  const KubeletVersion kubelet = this->kubelet();
  struct Planned {
    const ContainerRequest* request;
    std::vector<std::string> ids;
  };
  std::vector<Planned> planned;
  std::map<std::string, std::set<std::string>> taken;  // by this pod so far

  // 1. Pick devices per container, asking the plugin for its preference:
  // init containers first, whose devices the app containers reuse.
  std::vector<const ContainerRequest*> order;
  for (const ContainerRequest& c : req.containers()) {
    if (c.init()) order.push_back(&c);
  }
  for (const ContainerRequest& c : req.containers()) {
    if (!c.init()) order.push_back(&c);
  }
  std::map<std::string, std::vector<std::string>> reusable;  // init containers' devices
  for (const ContainerRequest* c : order) {
    std::vector<std::string>& reuse = reusable[c->resource()];
    absl::StatusOr<std::vector<std::string>> chosen =
        PickDevices(*c, taken[c->resource()], reuse);
    if (!chosen.ok()) return chosen.status();
    if (c->init()) {
      for (const std::string& id : *chosen) {
        if (std::find(reuse.begin(), reuse.end(), id) == reuse.end()) reuse.push_back(id);
      }
    } else {
      taken[c->resource()].insert(chosen->begin(), chosen->end());
      for (const std::string& id : *chosen) {
        reuse.erase(std::remove(reuse.begin(), reuse.end(), id), reuse.end());
      }
    }
    planned.push_back({c, *std::move(chosen)});
  }

  // 2. Allocate: one call per container as the kubelet does, or one call
  // per resource with every container request when batching.
  std::vector<v1beta1::ContainerAllocateResponse> responses(planned.size());
  std::vector<std::vector<size_t>> calls;
  if (req.batch()) {
    std::map<std::string, size_t> call_of;
    for (size_t i = 0; i < planned.size(); ++i) {
      auto [it, inserted] = call_of.emplace(planned[i].request->resource(), calls.size());
      if (inserted) calls.emplace_back();
      calls[it->second].push_back(i);
    }
  } else {
    for (size_t i = 0; i < planned.size(); ++i) calls.push_back({i});
  }
  std::map<std::string, std::shared_ptr<PluginClient>> used;
  for (const std::vector<size_t>& call : calls) {
    const std::string& resource = planned[call[0]].request->resource();
    std::vector<std::vector<std::string>> ids;
    for (size_t i : call) ids.push_back(planned[i].ids);
    absl::StatusOr<std::vector<v1beta1::ContainerAllocateResponse>> r =
        CallAllocate(resource, ids, &used[resource]);
    if (!r.ok()) return r.status();
    for (size_t k = 0; k < call.size(); ++k) responses[call[k]] = (*r)[k];
  }
  // What this release's ContainerAllocateResponse does not have, it never
  // read: cdi_devices before 1.28 (and in 1.28-1.30 with the gate off).
  std::vector<std::vector<std::string>> unread(responses.size());
  if (!kubelet.ReadsCdiDevices()) {
    for (size_t i = 0; i < responses.size(); ++i) {
      if (responses[i].cdi_devices_size() > 0) unread[i].push_back("cdi_devices");
      responses[i].clear_cdi_devices();
    }
  }

  // 3. Record (checkpoint) the admitted pod.
  std::vector<ContainerAllocation> allocations;
  {
    absl::MutexLock lock(&mu_);
    PodState pod;
    pod.set_uid(req.pod_uid());
    pod.set_name(req.pod_name());
    pod.set_namespace_(req.pod_namespace());
    pod.set_phase("Running");
    for (const Planned& p : planned) {
      ContainerRequest* spec = pod.add_containers();
      spec->set_name(p.request->name());
      spec->set_resource(p.request->resource());
      spec->set_count(static_cast<int32_t>(p.ids.size()));
      spec->set_init(p.request->init());
      spec->set_never_starts(p.request->never_starts());
      if (p.request->init()) continue;  // ran to completion
      if (p.request->never_starts()) continue;  // its creation fails
      // The container runtime starts it with these devices.
      RuntimeDevices* run = pod.add_running();
      run->set_container(p.request->name());
      run->set_resource(p.request->resource());
      for (const std::string& id : p.ids) run->add_device_ids(id);
    }
    state_.AddPod(pod);
    (void)MakeDirs(JoinPath(JoinPath(options_.root_dir, "pods"), req.pod_uid()));
    for (size_t i = 0; i < planned.size(); ++i) {
      const ContainerAllocation a = MakeAllocation(
          req.pod_uid(), req.pod_name(), req.pod_namespace(), planned[i].request->name(),
          planned[i].request->resource(), planned[i].ids, responses[i]);
      state_.AddAllocation(a);
      allocations.push_back(a);
    }
    WriteCheckpointLocked();
  }
  for (size_t i = 0; i < allocations.size(); ++i) {
    const ContainerAllocation& a = allocations[i];
    Json envs = Json::object();
    for (const auto& [k, v] : a.response().envs()) envs[k] = v;
    Json cdi = Json::array();
    for (const auto& d : a.response().cdi_devices()) cdi.push_back(d.name());
    events_.Emit("allocated", {{"pod", a.pod_name()},
                               {"pod_uid", a.pod_uid()},
                               {"container", a.container()},
                               {"resource", a.resource()},
                               {"devices", std::vector<std::string>(a.device_ids().begin(),
                                                                    a.device_ids().end())},
                               {"envs", envs},
                               {"mounts", a.response().mounts_size()},
                               {"device_specs", a.response().devices_size()},
                               {"annotations", a.response().annotations_size()},
                               {"cdi_devices", cdi},
                               {"unread", unread[i]}});
  }

  // 4. Start the containers: PreStartContainer when the plugin requires it.
  for (ContainerAllocation& a : allocations) {
    std::shared_ptr<PluginClient> client = used[a.resource()];
    if (!client->beta || !client->options.pre_start_required()) {
      *response->add_allocations() = a;
      continue;
    }
    v1beta1::PreStartContainerRequest preq;
    for (const std::string& id : a.device_ids()) preq.add_devices_ids(id);
    v1beta1::PreStartContainerResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kPreStartTimeout));
    grpc::Status st = client->beta->PreStartContainer(&ctx, preq, &presp);
    if (!st.ok()) {
      return absl::AbortedError(absl::StrCat(
          "device plugin PreStartContainer rpc failed with err: ", GoRpcError(st)));
    }
    a.set_pre_started(true);
    events_.Emit("pre_start", {{"pod", a.pod_name()},
                               {"container", a.container()},
                               {"resource", a.resource()},
                               {"devices", std::vector<std::string>(a.device_ids().begin(),
                                                                    a.device_ids().end())}});
    *response->add_allocations() = a;
  }
  return absl::OkStatus();
}

}  // namespace dpproxy::sim
