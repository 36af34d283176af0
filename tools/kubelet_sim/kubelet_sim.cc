// KubeletSim (kubelet_sim.h): start and stop, and the kubelet's gRPC
// services (registration, pod-resources, the container runtime's view, the
// control API).
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {

using kubelet_sim_internal::kPodsFileName;

class KubeletSim::RegistrationV1Beta1 final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationV1Beta1(KubeletSim* sim) : sim_(sim) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* req,
                        v1beta1::Empty*) override {
    return ToGrpcStatus(sim_->HandleRegister(std::string(kV1Beta1Version), req->version(),
                                             req->endpoint(), req->resource_name(),
                                             &req->options()));
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::RegistrationV1Alpha final : public deviceplugin::Registration::Service {
 public:
  explicit RegistrationV1Alpha(KubeletSim* sim) : sim_(sim) {}
  grpc::Status Register(grpc::ServerContext*, const deviceplugin::RegisterRequest* req,
                        deviceplugin::Empty*) override {
    return ToGrpcStatus(sim_->HandleRegister(std::string(kV1AlphaVersion), req->version(),
                                             req->endpoint(), req->resource_name(),
                                             nullptr));
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::PodResources final : public v1::PodResourcesLister::Service {
 public:
  explicit PodResources(KubeletSim* sim) : sim_(sim) {}

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* resp) override {
    const State st = sim_->GetState();
    const Index index(st);
    const std::set<std::string> unsynced = sim_->UnsyncedPods();
    for (const PodState& p : st.pods()) {
      // Active pods only; right after a start, not the pods found then
      // until the kubelet has synced them (about a second).
      if (p.phase() != "Running" || unsynced.count(p.uid()) > 0) continue;
      Fill(index, p, resp->add_pod_resources());
    }
    return grpc::Status::OK;
  }

  // 1.27 behind a gate, on from 1.34: one running pod by namespace and name.
  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* req,
                   v1::GetPodResourcesResponse* resp) override {
    if (sim_->kubelet().minor < 34) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "unknown method Get for service v1.PodResourcesLister");
    }
    const State st = sim_->GetState();
    const std::set<std::string> unsynced = sim_->UnsyncedPods();
    for (const PodState& p : st.pods()) {
      if (p.phase() != "Running" || unsynced.count(p.uid()) > 0 ||
          p.name() != req->pod_name() || p.namespace_() != req->pod_namespace()) {
        continue;
      }
      Fill(Index(st), p, resp->mutable_pod_resources());
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("pod ", req->pod_namespace(), "/", req->pod_name(),
                                     " not found"));
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext*,
                                       const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* resp) override {
    return Allocatable(resp);
  }

 private:
  // The state's allocations by pod, and each device's topology.
  struct Index {
    explicit Index(const State& st) {
      for (const ResourceState& r : st.resources()) {
        for (const sim::DeviceState& d : r.devices()) devices[{r.name(), d.id()}] = &d;
      }
      for (const ContainerAllocation& a : st.allocations()) by_pod[a.pod_uid()].push_back(&a);
    }
    std::map<std::pair<std::string, std::string>, const sim::DeviceState*> devices;
    std::map<std::string, std::vector<const ContainerAllocation*>> by_pod;
  };

  // A pod as pod-resources lists it: every app container, the devices the
  // device manager gave it, and (1.34+) the devices its claims gave it.
  void Fill(const Index& index, const PodState& p, v1::PodResources* pr) {
    pr->set_name(p.name());
    pr->set_namespace_(p.namespace_());
    auto container = [&](const std::string& name) {
      for (auto& existing : *pr->mutable_containers()) {
        if (existing.name() == name) return &existing;
      }
      v1::ContainerResources* c = pr->add_containers();
      c->set_name(name);
      return c;
    };
    std::set<std::string> init_containers;  // not listed
    for (const ContainerRequest& c : p.containers()) {
      if (c.init()) {
        init_containers.insert(c.name());
      } else {
        container(c.name());
      }
    }
    auto allocations = index.by_pod.find(p.uid());
    for (const ContainerAllocation* a :
         allocations == index.by_pod.end() ? std::vector<const ContainerAllocation*>{}
                                           : allocations->second) {
      if (init_containers.count(a->container()) > 0) continue;
      v1::ContainerResources* c = container(a->container());
      // The real kubelet answers one ContainerDevices per device ID, each
      // with its own topology, not one per container and resource.
      for (const std::string& id : a->device_ids()) {
        v1::ContainerDevices* d = c->add_devices();
        d->set_resource_name(a->resource());
        d->add_device_ids(id);
        auto dev = index.devices.find({a->resource(), id});
        if (dev != index.devices.end()) {
          for (int64_t n : dev->second->numa_nodes()) d->mutable_topology()->add_nodes()->set_id(n);
        }
      }
    }
    if (!p.has_extended_resource_claim() || sim_->kubelet().minor < 34) return;
    for (const RuntimeDevices& r : p.running()) {
      if (r.claim_devices().empty()) continue;
      v1::DynamicResource* dr = container(r.container())->add_dynamic_resources();
      dr->set_claim_name(p.extended_resource_claim().name());
      dr->set_claim_namespace(p.extended_resource_claim().namespace_());
      for (int i = 0; i < r.claim_devices_size(); ++i) {
        v1::ClaimResource* cr = dr->add_claim_resources();
        cr->set_driver_name(r.claim_driver());
        cr->set_pool_name(i < r.claim_pools_size() ? r.claim_pools(i) : "");
        cr->set_device_name(r.claim_devices(i));
        // The CDI names of the container's request (the driver's answer
        // names them per request, not per device).
        for (const std::string& cdi : r.cdi_device_ids()) cr->add_cdi_devices()->set_name(cdi);
      }
    }
  }

  grpc::Status Allocatable(v1::AllocatableResourcesResponse* resp) {
    State st = sim_->GetState();
    for (const ResourceState& r : st.resources()) {
      for (const sim::DeviceState& d : r.devices()) {
        if (d.health() != kHealthy) continue;
        v1::ContainerDevices* cd = resp->add_devices();
        cd->set_resource_name(r.name());
        cd->add_device_ids(d.id());
        for (int64_t n : d.numa_nodes()) cd->mutable_topology()->add_nodes()->set_id(n);
      }
    }
    return grpc::Status::OK;
  }

  KubeletSim* const sim_;
};

class KubeletSim::Control final : public KubeletControl::Service {
 public:
  explicit Control(KubeletSim* sim) : sim_(sim) {}

  grpc::Status Allocate(grpc::ServerContext*, const AllocateRequest* req,
                        AllocateResponse* resp) override {
    absl::StatusOr<AllocateResponse> r = sim_->Allocate(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status GetState(grpc::ServerContext*, const GetStateRequest*, State* resp) override {
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status Restart(grpc::ServerContext*, const RestartRequest* req, State* resp) override {
    absl::Status s;
    if (req->personality().empty()) {
      s = sim_->Restart();
    } else {
      std::optional<bool> gate;
      if (req->cdi_gate() != 0) gate = req->cdi_gate() > 0;
      absl::StatusOr<KubeletVersion> parsed = ParseKubeletVersion(req->personality(), gate);
      if (!parsed.ok()) return ToGrpcStatus(parsed.status());
      s = sim_->Restart(*parsed);
    }
    if (!s.ok()) return ToGrpcStatus(s);
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status DraClaims(grpc::ServerContext*, const DraClaimsRequest* req,
                         DraClaimsResponse* resp) override {
    std::vector<KubeletSim::DraClaim> claims;
    for (const auto& c : req->claims()) claims.push_back({c.namespace_(), c.name(), c.uid()});
    absl::StatusOr<nlohmann::json> r = req->unprepare()
                                           ? sim_->UnprepareClaims(req->driver(), claims)
                                           : sim_->PrepareClaims(req->driver(), claims);
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_claims_json(r->dump());
    return grpc::Status::OK;
  }
  grpc::Status Readmit(grpc::ServerContext*, const ReadmitRequest*,
                       ReadmitResponse* resp) override {
    *resp = sim_->Readmit();
    return grpc::Status::OK;
  }
  grpc::Status RestartContainer(grpc::ServerContext*, const RestartContainerRequest* req,
                                RestartContainerResponse* resp) override {
    absl::StatusOr<RestartContainerResponse> r =
        sim_->RestartContainer(req->pod_uid(), req->container());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = *std::move(r);
    return grpc::Status::OK;
  }
  grpc::Status DeletePod(grpc::ServerContext*, const DeletePodRequest* req,
                         State* resp) override {
    if (absl::Status s = sim_->DeletePod(req->pod_uid()); !s.ok()) return ToGrpcStatus(s);
    *resp = sim_->GetState();
    return grpc::Status::OK;
  }
  grpc::Status WaitForResource(grpc::ServerContext*, const WaitForResourceRequest* req,
                               State* resp) override {
    bool ok = sim_->WaitForResource(req->resource(), req->min_healthy(),
                                    absl::Milliseconds(req->timeout_ms()));
    *resp = sim_->GetState();
    if (!ok) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("resource ", req->resource(), " did not reach ",
                                       req->min_healthy(), " healthy devices within ",
                                       req->timeout_ms(), " ms"));
    }
    return grpc::Status::OK;
  }

 private:
  KubeletSim* const sim_;
};

class KubeletSim::ContainerRuntime final : public runtime::v1::RuntimeService::Service {
 public:
  explicit ContainerRuntime(KubeletSim* sim) : sim_(sim) {}

  grpc::Status ListContainers(grpc::ServerContext*, const runtime::v1::ListContainersRequest* req,
                              runtime::v1::ListContainersResponse* resp) override {
    const State st = sim_->GetState();
    const runtime::v1::ContainerFilter& f = req->filter();
    // Only running containers are kept: any other state asked lists none.
    if (f.has_state() && f.state().state() != runtime::v1::CONTAINER_RUNNING) {
      return grpc::Status::OK;
    }
    for (const PodState& p : st.pods()) {
      if (p.phase() != "Running") continue;
      std::set<std::string> names;
      for (const RuntimeDevices& r : p.running()) names.insert(r.container());
      for (const std::string& name : names) {
        const std::string id = absl::StrCat(p.uid(), "-", name);
        if (!f.id().empty() && f.id() != id) continue;
        runtime::v1::Container c;
        c.set_id(id);
        c.set_pod_sandbox_id(p.uid());
        c.mutable_metadata()->set_name(name);
        c.set_state(runtime::v1::CONTAINER_RUNNING);
        auto& labels = *c.mutable_labels();
        labels["io.kubernetes.pod.uid"] = p.uid();
        labels["io.kubernetes.pod.name"] = p.name();
        labels["io.kubernetes.pod.namespace"] = p.namespace_();
        labels["io.kubernetes.container.name"] = name;
        bool selected = f.pod_sandbox_id().empty() || f.pod_sandbox_id() == p.uid();
        for (const auto& [k, v] : f.label_selector()) {
          auto it = labels.find(k);
          selected = selected && it != labels.end() && it->second == v;
        }
        if (selected) *resp->add_containers() = std::move(c);
      }
    }
    return grpc::Status::OK;
  }

 private:
  KubeletSim* const sim_;
};

// --- KubeletSim -----------------------------------------------------------------

KubeletSim::KubeletSim(KubeletSimOptions options)
    : options_(std::move(options)),
      kubelet_(options_.kubelet.value_or(KubeletVersionOf(options_.personality))),
      late_wipe_delay_(options_.late_wipe),
      dra_({options_.cdi_dirs, options_.kubeconfig, options_.node_name}, &events_),
      device_plugin_handler_(MakeDevicePluginHandler()),
      dra_plugin_handler_(MakeDraPluginHandler()),
      plugin_manager_(plugins_registry_dir(), options_.dial_timeout, &events_) {}

void KubeletSim::SetLateWipe(absl::Duration late_wipe) {
  absl::MutexLock lock(&mu_);
  late_wipe_delay_ = late_wipe;
}

void KubeletSim::HoldCheckpointWrites(bool hold) {
  absl::MutexLock lock(&mu_);
  checkpoint_writes_held_ = hold;
}

KubeletSim::~KubeletSim() {
  StopControl();
  Stop();
  if (runtime_server_) {
    runtime_server_->Shutdown(std::chrono::system_clock::now());
    runtime_server_->Wait();
    runtime_server_.reset();
  }
}

std::string KubeletSim::device_plugin_dir() const {
  return JoinPath(options_.root_dir, "device-plugins");
}
std::string KubeletSim::kubelet_socket() const {
  return JoinPath(device_plugin_dir(), kKubeletSocketName);
}
std::string KubeletSim::plugins_registry_dir() const {
  return JoinPath(options_.root_dir, "plugins_registry");
}
std::string KubeletSim::pod_resources_socket() const {
  return JoinPath(JoinPath(options_.root_dir, "pod-resources"), "kubelet.sock");
}
std::string KubeletSim::container_runtime_socket() const {
  return JoinPath(JoinPath(options_.root_dir, "containerd"), "containerd.sock");
}
std::string KubeletSim::pods_path() const { return JoinPath(options_.root_dir, kPodsFileName); }

std::string KubeletSim::checkpoint_path() const {
  return JoinPath(device_plugin_dir(), kKubeletCheckpointName);
}

Personality KubeletSim::personality() {
  absl::MutexLock lock(&mu_);
  return kubelet_.personality;
}

KubeletVersion KubeletSim::kubelet() {
  absl::MutexLock lock(&mu_);
  return kubelet_;
}

absl::Duration KubeletSim::Grace() const {
  if (options_.endpoint_grace.has_value()) return *options_.endpoint_grace;
  return kubelet_.personality == Personality::kV1Alpha ? absl::ZeroDuration()
                                                      : absl::Minutes(5);
}

absl::Status KubeletSim::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::OkStatus();
  }
  DPP_RETURN_IF_ERROR(ValidateSocketPath(kubelet_socket()));
  if (options_.pod_resources) DPP_RETURN_IF_ERROR(ValidateSocketPath(pod_resources_socket()));
  DPP_RETURN_IF_ERROR(MakeDirs(device_plugin_dir()));
  DPP_RETURN_IF_ERROR(MakeDirs(plugins_registry_dir()));
  if (options_.pod_resources) {
    DPP_RETURN_IF_ERROR(MakeDirs(JoinPath(options_.root_dir, "pod-resources")));
  }

  // Allocation state first, as the kubelet reads its checkpoint at start.
  std::string checkpoint, pods;
  if (absl::StatusOr<std::string> c = ReadFile(checkpoint_path()); c.ok()) checkpoint = *c;
  if (absl::StatusOr<std::string> p = ReadFile(JoinPath(options_.root_dir, kPodsFileName));
      p.ok()) {
    pods = *p;
  }
  KubeletVersion kubelet;
  size_t restored_allocations = 0, restored_resources = 0;
  {
    absl::MutexLock lock(&mu_);
    kubelet = kubelet_;
    absl::Status s = state_.Restore(checkpoint, pods, absl::Now(), kubelet.minor);
    if (!s.ok()) {
      events_.Emit("checkpoint_unreadable",
                   {{"error", std::string(s.message())},
                    {"note", "Continue after failing to read checkpoint file. Device "
                             "allocation info may NOT be up-to-date"}});
    }
    restored_allocations = state_.allocations().size();
    restored_resources = state_.ResourceNames().size();
  }

  dra_.SetKubelet(kubelet.minor, kubelet.name);
  if (kubelet.minor >= 32 && !options_.kubeconfig.empty()) dra_.DeleteNodeSlices();

  // Remove every non-directory entry but the checkpoint: plugins see their
  // sockets vanish and know the kubelet restarted.
  absl::StatusOr<std::vector<std::string>> removed =
      RemoveFilesExcept(device_plugin_dir(), {std::string(kKubeletCheckpointName)});
  if (!removed.ok()) return removed.status();
  events_.Emit("directory_cleaned", {{"dir", device_plugin_dir()}, {"removed", *removed}});
  const Personality personality = kubelet.personality;
  if (kubelet.plugin_watcher) {
    DPP_RETURN_IF_ERROR(WriteFileAtomic(
        JoinPath(device_plugin_dir(), kDeprecationMarkerName), ""));
  }

  {
    absl::MutexLock lock(&mu_);
    running_ = true;
    ++starts_;
    started_at_ = absl::Now();
    status_due_ = started_at_;  // a starting kubelet writes the node's status at once
    pods_synced_ = false;
    unsynced_pods_.clear();
    for (const auto& [uid, pod] : state_.pods()) unsynced_pods_.insert(uid);
  }

  std::vector<std::string> served;
  if (personality == Personality::kV1Alpha) {
    registration_service_ = std::make_unique<RegistrationV1Alpha>(this);
    served = {"deviceplugin.Registration"};
  } else {
    registration_service_ = std::make_unique<RegistrationV1Beta1>(this);
    served = {"v1beta1.Registration"};
  }
  unknown_handler_ = std::make_unique<GoStyleUnknownHandler>(
      served, [this](const std::string& method, const std::string& error) {
        events_.Emit("unknown_call", {{"socket", kubelet_socket()},
                                      {"method", method},
                                      {"error", error}});
      });
  // A late cleanup is due from the moment kubelet.sock exists: a plugin
  // that registers at once must meet it.
  const absl::Duration late_wipe = [this] {
    absl::MutexLock lock(&mu_);
    return late_wipe_delay_;
  }();
  late_wipe_pending_ = late_wipe > absl::ZeroDuration();
  {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(kubelet_socket()), grpc::InsecureServerCredentials());
    builder.RegisterService(registration_service_.get());
    builder.RegisterCallbackGenericService(unknown_handler_.get());
    registration_server_ = builder.BuildAndStart();
  }
  if (registration_server_ == nullptr) {
    late_wipe_pending_ = false;
    absl::MutexLock lock(&mu_);
    running_ = false;
    return absl::UnavailableError(absl::StrCat("cannot listen on ", kubelet_socket()));
  }
  if (options_.pod_resources) {
    pod_resources_service_ = std::make_unique<PodResources>(this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(pod_resources_socket()),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(pod_resources_service_.get());
    pod_resources_server_ = builder.BuildAndStart();
    if (pod_resources_server_ == nullptr) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", pod_resources_socket()));
    }
  }
  if (options_.container_runtime && runtime_server_ == nullptr) {
    DPP_RETURN_IF_ERROR(MakeDirs(JoinPath(options_.root_dir, "containerd")));
    ::unlink(container_runtime_socket().c_str());
    runtime_service_ = std::make_unique<ContainerRuntime>(this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(UnixAddress(container_runtime_socket()),
                             grpc::InsecureServerCredentials());
    builder.RegisterService(runtime_service_.get());
    runtime_server_ = builder.BuildAndStart();
    if (runtime_server_ == nullptr) {
      Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", container_runtime_socket()));
    }
  }
  {
    absl::MutexLock lock(&stop_mu_);
    stop_housekeeping_ = false;
  }
  housekeeping_ = std::thread([this] { Housekeeping(); });
  if (late_wipe > absl::ZeroDuration()) {
    late_wipe_ = std::thread([this, late_wipe] {
      {
        absl::MutexLock lock(&stop_mu_);
        if (stop_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_), late_wipe)) {
          return;  // stopped first
        }
      }
      LateWipe();
    });
  }
  if (kubelet.plugin_watcher) {
    // Housekeeping runs the manager's reconciler at each watcher_period.
    DPP_RETURN_IF_ERROR(plugin_manager_.Start(
        [this](const std::string& type) { return PluginHandlerFor(type); }));
  }
  int64_t starts;
  {
    absl::MutexLock lock(&mu_);
    starts = starts_;
  }
  events_.Emit("kubelet_started", {{"personality", PersonalityName(personality)},
                                   {"kubelet", kubelet.name},
                                   {"generation", kubelet.GenerationName()},
                                   {"plugin_watcher", kubelet.plugin_watcher},
                                   {"socket", kubelet_socket()},
                                   {"starts", starts},
                                   {"restored_allocations", restored_allocations},
                                   {"restored_resources", restored_resources}});
  return absl::OkStatus();
}

void KubeletSim::Stop() {
  std::vector<std::shared_ptr<PluginClient>> clients;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
    clients.swap(all_clients_);
    clients_.clear();
    endpoints_.clear();
    socket_clients_.clear();
    endpoint_store_.clear();
  }
  plugin_manager_.Stop();
  dra_.Clear();  // drivers register again through the plugin watcher
  for (auto& c : clients) c->Cancel();
  if (registration_server_) {
    registration_server_->Shutdown(std::chrono::system_clock::now());
    registration_server_->Wait();
    registration_server_.reset();
  }
  if (pod_resources_server_) {
    pod_resources_server_->Shutdown(std::chrono::system_clock::now());
    pod_resources_server_->Wait();
    pod_resources_server_.reset();
  }
  for (auto& c : clients) {
    if (c->thread.joinable()) c->thread.join();
  }
  {
    absl::MutexLock lock(&stop_mu_);
    stop_housekeeping_ = true;
  }
  late_wipe_pending_ = false;
  if (housekeeping_.joinable()) housekeeping_.join();
  if (late_wipe_.joinable()) late_wipe_.join();
  events_.Emit("kubelet_stopped", {{"socket", kubelet_socket()}});
}

absl::Status KubeletSim::Restart(std::optional<Personality> personality) {
  Stop();
  if (personality.has_value()) {
    absl::MutexLock lock(&mu_);
    kubelet_ = KubeletVersionOf(*personality);
  }
  return Start();
}

absl::Status KubeletSim::Restart(const KubeletVersion& kubelet) {
  Stop();
  {
    absl::MutexLock lock(&mu_);
    // The per-socket tracking is the simulator's setting, not a release's.
    const bool per_socket = kubelet_.per_socket_clients;
    kubelet_ = kubelet;
    kubelet_.per_socket_clients = per_socket;
  }
  return Start();
}

absl::Status KubeletSim::StartControl(const std::string& socket_path) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  control_service_ = std::make_unique<Control>(this);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path), grpc::InsecureServerCredentials());
  // A node's whole state (every device, pod and allocation) in one answer:
  // 260,000 devices make some 6 MB.
  builder.SetMaxSendMessageSize(kControlMaxMessageBytes);
  builder.SetMaxReceiveMessageSize(kControlMaxMessageBytes);
  builder.RegisterService(control_service_.get());
  control_server_ = builder.BuildAndStart();
  if (control_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path));
  }
  return absl::OkStatus();
}

void KubeletSim::StopControl() {
  if (control_server_) {
    control_server_->Shutdown(std::chrono::system_clock::now() +
                              std::chrono::milliseconds(500));
    control_server_->Wait();
    control_server_.reset();
  }
}

void KubeletSim::LateWipe() {
  if (!late_wipe_pending_.exchange(false)) return;  // once per start
  absl::StatusOr<std::vector<std::string>> removed = RemoveFilesExcept(
      device_plugin_dir(), {std::string(kKubeletCheckpointName), std::string(kKubeletSocketName),
                            std::string(kDeprecationMarkerName)});
  if (removed.ok()) {
    events_.Emit("directory_cleaned",
                 {{"dir", device_plugin_dir()}, {"removed", *removed}, {"late", true}});
  }
}

}  // namespace dpproxy::sim
