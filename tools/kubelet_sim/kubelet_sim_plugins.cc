// KubeletSim's device manager toward plugins: registration through
// kubelet.sock and the plugin watcher, the connection to each plugin and its
// ListAndWatch stream, and what the kubelet does when one ends.
#include "tools/kubelet_sim/kubelet_sim_internal.h"

namespace dpproxy::sim {

using kubelet_sim_internal::DevicesJson;
using kubelet_sim_internal::Dial;

void KubeletSim::StopEndpoint(const std::shared_ptr<PluginClient>& client) {
  auto it = endpoints_.find(client->resource);
  if (it != endpoints_.end() && it->second == client) endpoints_.erase(it);
}

void KubeletSim::InstallClient(std::shared_ptr<PluginClient> client) {
  // A release before 1.19 has no get_preferred_allocation_available field.
  if (!kubelet_.CallsGetPreferredAllocation()) {
    client->options.clear_get_preferred_allocation_available();
  }
  state_.RegisterEndpoint(client->resource, client->socket_path, client->api_version,
                          client->via, client->options, client->generation);
  if (kubelet_.TracksClientsPerSocket()) {
    // Joins the resource's other clients and becomes its endpoint.
    socket_clients_[client->resource][client->socket_path] = client;
    endpoint_store_[client->resource][client->socket_path] = client;
    clients_[client->resource] = client;
    endpoints_[client->resource] = client;
    return;
  }
  auto it = clients_.find(client->resource);
  if (it != clients_.end() && it->second != client) {
    // 1.9 stops the replaced endpoint. From 1.10 the new one simply takes
    // the resource's place and the old one runs until its plugin ends the
    // stream (1.10-1.24: its end is ignored, as it is no longer current;
    // 1.25-1.36 keep the client too, kubernetes#124716, and its end tears
    // down the resource's client by name). (kubernetes#121994).
    const bool keep_old = kubelet_.minor >= 10;
    events_.Emit("endpoint_replaced", {{"resource", client->resource},
                                       {"old_endpoint", it->second->socket_path},
                                       {"new_endpoint", client->socket_path},
                                       {"old_stopped", !keep_old},
                                       {"per_socket", kubelet_.per_socket_clients}});
    if (!keep_old) it->second->Cancel();
  }
  clients_[client->resource] = client;
  endpoints_[client->resource] = client;
}

absl::Status KubeletSim::HandleRegister(const std::string& api_version,
                                        const std::string& version,
                                        const std::string& endpoint,
                                        const std::string& resource,
                                        const v1beta1::DevicePluginOptions* request_options) {
  Personality personality;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is stopping");
    personality = kubelet_.personality;
  }
  LateWipe();  // if one is still to come, it lands now, before the dial
  // Whether the plugin's socket accepts a connection as its Register
  // arrives: an observation only (1.25+ kubelets need it, older ones dial
  // later), for tools that report on plugins.
  const bool listening = SocketAccepts(JoinPath(device_plugin_dir(), endpoint));
  events_.Emit("register_request", {{"resource", resource},
                                    {"version", version},
                                    {"endpoint", endpoint},
                                    {"endpoint_listening", listening},
                                    {"service", api_version == kV1Beta1Version
                                                    ? "v1beta1.Registration"
                                                    : "deviceplugin.Registration"}});
  auto reject = [&](absl::Status s) {
    events_.Emit("registration_rejected",
                 {{"resource", resource}, {"version", version},
                  {"error", std::string(s.message())}});
    return s;
  };
  absl::Status s = api_version == kV1AlphaVersion ? CheckV1AlphaVersion(version)
                                                  : CheckV1Beta1Version(version);
  if (!s.ok()) return reject(s);
  if (s = CheckResourceName(resource); !s.ok()) return reject(s);
  const std::string socket_path = JoinPath(device_plugin_dir(), endpoint);

  const bool sync = personality == Personality::kV1Beta1Sync ||
                    personality == Personality::kPluginWatcher;
  if (sync) {
    absl::StatusOr<std::shared_ptr<PluginClient>> c =
        ConnectSync(resource, socket_path, "kubelet.sock", "");
    if (!c.ok()) return reject(c.status());
  } else {
    auto client = std::make_shared<PluginClient>();
    client->resource = resource;
    client->socket_path = socket_path;
    client->api_version = version;
    client->via = "kubelet.sock";
    if (request_options != nullptr) client->options = *request_options;
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("kubelet is stopping");
    client->generation = next_generation_++;
    all_clients_.push_back(client);
    client->thread = std::thread([this, client] { RunClient(client); });
  }
  events_.Emit("registered", {{"resource", resource},
                              {"endpoint", socket_path},
                              {"api_version", version},
                              {"via", "kubelet.sock"},
                              {"mode", sync ? "sync" : "async"}});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<KubeletSim::PluginClient>> KubeletSim::ConnectSync(
    const std::string& resource, const std::string& socket_path, const std::string& via,
    const std::string& watch_socket) {
  absl::StatusOr<std::shared_ptr<PluginClient>> c =
      TryConnectSync(resource, socket_path, via, watch_socket);
  if (!c.ok()) ForgetClientAfterFailedConnect(resource, socket_path);
  return c;
}

void KubeletSim::ForgetClientAfterFailedConnect(const std::string& resource,
                                                const std::string& socket_path) {
  // 1.25+ enter the new client under the resource name before they dial it
  // and delete the name's entry when the dial or GetDevicePluginOptions
  // fails: whatever client held the name is no longer listed. It keeps
  // running (its stream still feeds the devices, its endpoint still takes
  // Allocates), but when its stream ends no client of that name is found
  // and nothing is disconnected (handler.go connectClient/deregisterClient).
  // With clients tracked per socket, only an entry at the failed socket
  // goes.
  absl::MutexLock lock(&mu_);
  if (kubelet_.TracksClientsPerSocket()) {
    // Every entry of the failed socket goes, a connected client there too.
    auto clients = socket_clients_.find(resource);
    if (clients == socket_clients_.end()) return;
    auto c = clients->second.find(socket_path);
    if (c == clients->second.end()) return;
    events_.Emit("client_forgotten", {{"resource", resource},
                                      {"endpoint", socket_path},
                                      {"failed_endpoint", socket_path}});
    clients->second.erase(c);
    if (clients->second.empty()) socket_clients_.erase(clients);
    return;
  }
  auto it = clients_.find(resource);
  if (it == clients_.end()) return;
  if (kubelet_.per_socket_clients && it->second->socket_path != socket_path) return;
  events_.Emit("client_forgotten", {{"resource", resource},
                                    {"endpoint", it->second->socket_path},
                                    {"failed_endpoint", socket_path}});
  clients_.erase(it);
}

absl::StatusOr<std::shared_ptr<KubeletSim::PluginClient>> KubeletSim::TryConnectSync(
    const std::string& resource, const std::string& socket_path, const std::string& via,
    const std::string& watch_socket) {
  if (absl::Status s = ValidateSocketPath(socket_path); !s.ok()) {
    return absl::UnknownError(absl::StrCat("failed to dial device plugin: ", s.message()));
  }
  auto client = std::make_shared<PluginClient>();
  client->resource = resource;
  client->socket_path = socket_path;
  client->api_version = std::string(kV1Beta1Version);
  client->via = via;
  client->watch_socket = watch_socket;
  client->dialled = true;
  DialBackHook hook;
  {
    absl::MutexLock lock(&mu_);
    hook = before_dial_back_;
  }
  if (hook) hook(socket_path);
  client->channel = MakeUnixChannel(socket_path);
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return !running_;
  };
  if (absl::Status s = Dial(client->channel.get(), options_.dial_timeout, stopping);
      !s.ok()) {
    return absl::UnknownError(absl::StrCat("failed to dial device plugin: ", s.message()));
  }
  client->beta = v1beta1::DevicePlugin::NewStub(client->channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.dial_timeout));
  grpc::Status st = client->beta->GetDevicePluginOptions(&ctx, v1beta1::Empty(),
                                                         &client->options);
  if (!st.ok()) {
    return absl::UnknownError(
        absl::StrCat("failed to get device plugin options: ", GoRpcError(st)));
  }
  absl::MutexLock lock(&mu_);
  if (!running_) return absl::UnavailableError("kubelet is stopping");
  if (kubelet_.TracksClientsPerSocket()) {
    auto store = endpoint_store_.find(resource);
    if (store != endpoint_store_.end() && store->second.count(socket_path) > 0) {
      return absl::UnknownError(
          absl::StrCat("device plugin already connected: ", socket_path));
    }
  }
  client->generation = next_generation_++;
  InstallClient(client);
  all_clients_.push_back(client);
  client->thread = std::thread([this, client] { RunClient(client); });
  return client;
}

void KubeletSim::RunClient(std::shared_ptr<PluginClient> client) {
  if (!client->dialled) {
    // Asynchronous registration: the kubelet dials after Register returned,
    // and a plugin it cannot reach is simply not registered.
    if (absl::Status s = ValidateSocketPath(client->socket_path); !s.ok()) {
      events_.Emit("plugin_dial_failed", {{"resource", client->resource},
                                          {"endpoint", client->socket_path},
                                          {"error", std::string(s.message())}});
      return;
    }
    client->channel = MakeUnixChannel(client->socket_path);
    absl::Status s = Dial(client->channel.get(), options_.dial_timeout,
                          [&] { return client->IsCancelled(); });
    if (!s.ok()) {
      if (!client->IsCancelled()) {
        events_.Emit("plugin_dial_failed",
                     {{"resource", client->resource},
                      {"endpoint", client->socket_path},
                      {"error", absl::StrCat("failed to dial device plugin: ", s.message())}});
      }
      return;
    }
    if (client->api_version == kV1AlphaVersion) {
      client->alpha = deviceplugin::DevicePlugin::NewStub(client->channel);
    } else {
      client->beta = v1beta1::DevicePlugin::NewStub(client->channel);
    }
    absl::MutexLock lock(&mu_);
    if (!running_ || client->IsCancelled()) return;
    InstallClient(client);
  }
  events_.Emit("plugin_connected", {{"resource", client->resource},
                                    {"endpoint", client->socket_path},
                                    {"api_version", client->api_version},
                                    {"pre_start_required", client->options.pre_start_required()},
                                    {"get_preferred_allocation_available",
                                     client->options.get_preferred_allocation_available()}});
  grpc::ClientContext ctx;
  {
    absl::MutexLock lock(&client->mu);
    if (client->cancelled) return;
    client->stream_ctx = &ctx;
  }
  grpc::Status status;
  if (client->beta) {
    auto reader = client->beta->ListAndWatch(&ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      OnDevices(client, {resp.devices().begin(), resp.devices().end()});
    }
    status = reader->Finish();
  } else {
    auto reader = client->alpha->ListAndWatch(&ctx, deviceplugin::Empty());
    deviceplugin::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      std::vector<v1beta1::Device> devices;
      for (const auto& d : resp.devices()) {
        v1beta1::Device b;
        b.set_id(d.id());
        b.set_health(d.health());
        devices.push_back(std::move(b));
      }
      OnDevices(client, devices);
    }
    status = reader->Finish();
  }
  {
    absl::MutexLock lock(&client->mu);
    client->stream_ctx = nullptr;
  }
  OnClientLost(client, DescribeGrpcStatus(status));
}

void KubeletSim::OnDevices(const std::shared_ptr<PluginClient>& client,
                           const std::vector<v1beta1::Device>& devices) {
  // Before 1.16 Device had no topology field: the kubelet never saw it.
  std::vector<v1beta1::Device> without_topology;
  const std::vector<v1beta1::Device>* read = &devices;
  int64_t capacity = 0, allocatable = 0;
  CheckpointFiles files;
  ListHook hook;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    if (!kubelet_.ReadsTopology()) {
      without_topology = devices;
      for (v1beta1::Device& d : without_topology) d.clear_topology();
      read = &without_topology;
    }
    // From 1.10 a replaced client keeps running (InstallClient), and its
    // lists reach the device manager by the resource's name (on a real
    // 1.36.3 node a list from the old dpproxy's stream, after the new one's
    // client had died, turned the devices Healthy again while every
    // Allocate failed on the stopped endpoint).
    const bool by_name = kubelet_.minor >= 10;
    if (!state_.UpdateDevices(client->resource, client->generation, by_name, *read)) return;
    capacity = state_.Capacity(client->resource);
    allocatable = state_.Allocatable(client->resource);
    files = CheckpointFilesLocked();
    hook = before_list_checkpoint_;
  }
  // As genericDeviceUpdateCallback: the sets are replaced under the device
  // manager's lock, the checkpoint is written once it is released.
  if (hook) hook(client->resource);
  WriteCheckpoint(files);
  events_.Emit("devices", {{"resource", client->resource},
                           {"devices", DevicesJson(*read)},
                           {"capacity", capacity},
                           {"allocatable", allocatable}});
}

void KubeletSim::OnClientLost(const std::shared_ptr<PluginClient>& client,
                              const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!running_) return;
  if (kubelet_.TracksClientsPerSocket()) return OnSocketClientLostLocked(client, why);
  auto it = clients_.find(client->resource);
  if (it == clients_.end()) {
    // A client no longer listed under its name (a failed registration
    // deleted the entry): its end disconnects nothing.
    events_.Emit("unlisted_client_ended",
                 {{"resource", client->resource}, {"endpoint", client->socket_path}});
    return;
  }
  std::shared_ptr<PluginClient> lost = client;
  std::string reason = why;
  if (it->second != client) {
    // A replaced client's end, recorded whatever it does: tools wait for it.
    auto ended = [&](const char* outcome) {
      events_.Emit("replaced_client_ended", {{"resource", client->resource},
                                             {"endpoint", client->socket_path},
                                             {"outcome", outcome}});
    };
    if (!kubelet_.TearsDownByName()) return ended("ignored");  // no longer current
    // #135437: the ended client's socket names what to disconnect.
    if (kubelet_.per_socket_clients && it->second->socket_path != client->socket_path) {
      return ended("ignored (another socket)");
    }
    ended("disconnected the resource's client by name");
    // 1.25-1.36: the ended client's goroutine looks the client up by
    // resource name and disconnects whatever it finds: the new one.
    lost = it->second;
    reason = absl::StrCat("the replaced client at ", client->socket_path,
                          " ended, and the kubelet disconnected the resource's client by "
                          "name (kubernetes#121994)");
    lost->Cancel();
  }
  clients_.erase(it);
  LoseEndpointLocked(lost, reason);
}

void KubeletSim::LoseEndpointLocked(const std::shared_ptr<PluginClient>& lost,
                                    const std::string& reason) {
  StopEndpoint(lost);
  if (!state_.EndpointLost(lost->resource, lost->generation, absl::Now())) return;
  events_.Emit("plugin_lost", {{"resource", lost->resource},
                               {"endpoint", lost->socket_path},
                               {"reason", reason},
                               {"grace_seconds", absl::ToInt64Seconds(Grace())}});
  for (const std::string& r : state_.ExpireResources(absl::Now(), Grace())) {
    events_.Emit("resource_removed", {{"resource", r}, {"reason", "plugin lost"}});
  }
  WriteCheckpointLocked();
}

void KubeletSim::OnSocketClientLostLocked(const std::shared_ptr<PluginClient>& client,
                                          const std::string& why) {
  auto clients = socket_clients_.find(client->resource);
  if (clients == socket_clients_.end() || clients->second.count(client->socket_path) == 0 ||
      clients->second.at(client->socket_path) != client) {
    // Not in the handler's list (a refused registration at its socket
    // deleted it): its end disconnects nothing, and the device manager
    // keeps its endpoint.
    events_.Emit("unlisted_client_ended",
                 {{"resource", client->resource}, {"endpoint", client->socket_path}});
    return;
  }
  clients->second.erase(client->socket_path);
  if (clients->second.empty()) socket_clients_.erase(clients);
  if (auto c = clients_.find(client->resource); c != clients_.end() && c->second == client) {
    clients_.erase(c);
  }
  DisconnectSocketLocked(client->resource, client->socket_path, why);
}

void KubeletSim::DisconnectSocketLocked(const std::string& resource,
                                        const std::string& socket_path,
                                        const std::string& why) {
  // PluginDisconnected: this socket's endpoint leaves the store; the last
  // one marks the resource unhealthy, else a remaining one, whichever,
  // becomes the endpoint (even one whose client has ended).
  auto store = endpoint_store_.find(resource);
  if (store == endpoint_store_.end() || store->second.count(socket_path) == 0) return;
  std::shared_ptr<PluginClient> lost = store->second.at(socket_path);
  store->second.erase(socket_path);
  if (!store->second.empty()) {
    std::shared_ptr<PluginClient> next = store->second.begin()->second;
    endpoints_[resource] = next;
    state_.RegisterEndpoint(resource, next->socket_path, next->api_version, next->via,
                            next->options, next->generation);
    events_.Emit("endpoint_promoted", {{"resource", resource},
                                       {"lost_endpoint", socket_path},
                                       {"endpoint", next->socket_path}});
    return;
  }
  endpoint_store_.erase(store);
  LoseEndpointLocked(lost, why);
}

// The device manager's handler of the plugin watcher's device plugins
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go).
class KubeletSim::DevicePluginHandler final : public PluginManager::Handler {
 public:
  explicit DevicePluginHandler(KubeletSim* sim) : sim_(sim) {}

  std::string RegisterPlugin(const pluginregistration::PluginInfo& info,
                             const std::string& socket_path) override {
    std::vector<std::string> versions(info.supported_versions().begin(),
                                      info.supported_versions().end());
    absl::Status s = CheckWatcherVersions(versions);
    if (s.ok()) s = CheckResourceName(info.name());
    const std::string endpoint = info.endpoint().empty() ? socket_path : info.endpoint();
    if (s.ok()) s = sim_->ConnectSync(info.name(), endpoint, "plugin-watcher", socket_path).status();
    if (!s.ok()) {
      sim_->events_.Emit("registration_rejected", {{"resource", info.name()},
                                                  {"socket", socket_path},
                                                  {"via", "plugin-watcher"},
                                                  {"error", std::string(s.message())}});
      return std::string(s.message());
    }
    sim_->events_.Emit("registered", {{"resource", info.name()},
                                     {"endpoint", endpoint},
                                     {"api_version", std::string(kV1Beta1Version)},
                                     {"via", "plugin-watcher"},
                                     {"mode", "sync"}});
    return "";
  }

  void DeregisterPlugin(const std::string& name, const std::string& socket_path) override {
    absl::MutexLock lock(&sim_->mu_);
    if (sim_->running_) sim_->DeregisterWatcherPluginLocked(name, socket_path);
  }

 private:
  KubeletSim* const sim_;
};

// The kubelet's plugin watcher in turn hands DRA plugins to the DRA manager.
class KubeletSim::DraPluginHandler final : public PluginManager::Handler {
 public:
  explicit DraPluginHandler(DraManager* dra, EventLog* events) : dra_(dra), events_(events) {}

  std::string RegisterPlugin(const pluginregistration::PluginInfo& info,
                             const std::string& socket_path) override {
    const std::string endpoint = info.endpoint().empty() ? socket_path : info.endpoint();
    std::string error = dra_->Register(info, endpoint, socket_path);
    if (!error.empty()) {
      events_->Emit("registration_rejected", {{"driver", info.name()},
                                              {"socket", socket_path},
                                              {"via", "plugin-watcher"},
                                              {"error", error}});
    }
    return error;
  }
  void DeregisterPlugin(const std::string& name, const std::string& socket_path) override {
    dra_->SocketRemoved(socket_path, name);
  }

 private:
  DraManager* const dra_;
  EventLog* const events_;
};

std::unique_ptr<PluginManager::Handler> KubeletSim::MakeDevicePluginHandler() {
  return std::make_unique<DevicePluginHandler>(this);
}

std::unique_ptr<PluginManager::Handler> KubeletSim::MakeDraPluginHandler() {
  return std::make_unique<DraPluginHandler>(&dra_, &events_);
}

PluginManager::Handler* KubeletSim::PluginHandlerFor(const std::string& type) {
  int minor = 0;
  {
    absl::MutexLock lock(&mu_);
    minor = kubelet_.minor;
  }
  if (type == kDevicePluginType) return device_plugin_handler_.get();
  if (type == "DRAPlugin" && minor >= 32) return dra_plugin_handler_.get();
  return nullptr;
}

void KubeletSim::DeregisterWatcherPluginLocked(const std::string& resource,
                                               const std::string& path) {
  // The plugin's stream may already have ended (then its devices are
  // unhealthy already); the watcher reports it anyway.
  events_.Emit("plugin_deregistered", {{"resource", resource}, {"socket", path}});
  if (kubelet_.TracksClientsPerSocket()) {
    // DeRegisterPlugin: the client of that registration, by socket.
    auto clients = socket_clients_.find(resource);
    if (clients == socket_clients_.end()) return;
    std::shared_ptr<PluginClient> client;
    for (const auto& [socket, c] : clients->second) {
      if (c->watch_socket == path) client = c;
    }
    if (client == nullptr) return;
    clients->second.erase(client->socket_path);
    if (clients->second.empty()) socket_clients_.erase(clients);
    client->Cancel();
    DisconnectSocketLocked(client->resource, client->socket_path,
                           "its registration socket was removed");
    return;
  }
  auto c = clients_.find(resource);
  if (c == clients_.end() || c->second->watch_socket != path) return;
  std::shared_ptr<PluginClient> client = c->second;
  clients_.erase(c);
  StopEndpoint(client);
  client->Cancel();
  if (state_.EndpointLost(client->resource, client->generation, absl::Now())) {
    for (const std::string& r : state_.ExpireResources(absl::Now(), Grace())) {
      events_.Emit("resource_removed", {{"resource", r}, {"reason", "plugin lost"}});
    }
    WriteCheckpointLocked();
  }
}

}  // namespace dpproxy::sim
