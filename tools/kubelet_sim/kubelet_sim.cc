// KubeletSim (kubelet_sim.h): start and stop, and the servers of the
// kubelet's gRPC services (kubelet_sim_services.cc).
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {

using kubelet_sim_internal::kPodsFileName;
using kubelet_sim_internal::NewContainerRuntimeService;
using kubelet_sim_internal::NewControlService;
using kubelet_sim_internal::NewPodResourcesService;
using kubelet_sim_internal::NewRegistrationService;

namespace {

Wipe WipeOf(const KubeletVersion& k) {
  return k.WipesOnlySockets() ? Wipe::kSocketsOnly : Wipe::kEveryFile;
}

}  // namespace

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

void KubeletSim::SetBeforeAllocate(AllocateHook hook) {
  absl::MutexLock lock(&mu_);
  before_allocate_ = std::move(hook);
}

void KubeletSim::SetBeforeDialBack(DialBackHook hook) {
  absl::MutexLock lock(&mu_);
  before_dial_back_ = std::move(hook);
}

void KubeletSim::SetBeforeListCheckpoint(ListHook hook) {
  absl::MutexLock lock(&mu_);
  before_list_checkpoint_ = std::move(hook);
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

  // Remove the sockets (up to 1.32: every non-directory entry) but the
  // checkpoint: plugins see their sockets vanish and know the kubelet
  // restarted.
  absl::StatusOr<std::vector<std::string>> removed =
      RemoveFilesExcept(device_plugin_dir(), {std::string(kKubeletCheckpointName)},
                        WipeOf(kubelet));
  if (!removed.ok()) return removed.status();
  events_.Emit("directory_cleaned", {{"dir", device_plugin_dir()}, {"removed", *removed}});
  const Personality personality = kubelet.personality;
  // The marker comes with the device manager's watcher handler up to 1.24;
  // from 1.25 (the device manager's refactor, kubernetes#109016) the
  // handler is the plugin server itself and nothing writes it. Plugins
  // built on the kubelet's own stub (its e2e sample plugin) skip their
  // kubelet.sock registration where they find it.
  if (kubelet.plugin_watcher && kubelet.minor < 25) {
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
    pods_synced_said_ = false;
    unsynced_pods_.clear();
    for (const auto& [uid, pod] : state_.pods()) unsynced_pods_.insert(uid);
  }

  std::vector<std::string> served;
  registration_service_ = NewRegistrationService(this, personality);
  if (personality == Personality::kV1Alpha) {
    served = {"deviceplugin.Registration"};
  } else {
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
    pod_resources_service_ = NewPodResourcesService(this);
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
    runtime_service_ = NewContainerRuntimeService(this);
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
  control_service_ = NewControlService(this);
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
      device_plugin_dir(),
      {std::string(kKubeletCheckpointName), std::string(kKubeletSocketName),
       std::string(kDeprecationMarkerName)},
      WipeOf(kubelet()));
  if (removed.ok()) {
    events_.Emit("directory_cleaned",
                 {{"dir", device_plugin_dir()}, {"removed", *removed}, {"late", true}});
  }
}

}  // namespace dpproxy::sim
