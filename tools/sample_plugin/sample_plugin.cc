#include "tools/sample_plugin/sample_plugin_internal.h"

namespace dpproxy::sample {

namespace {

class BetaService final : public v1beta1::DevicePlugin::Service {
 public:
  explicit BetaService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* resp) override {
    if (impl_->panic_on_options()) {
      impl_->events()->Emit("panicked", {{"call", "GetDevicePluginOptions"}});
      impl_->on_panic();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the plugin panicked");
    }
    if (impl_->options_only_in_register()) {
      impl_->events()->Emit("get_device_plugin_options_failed", {});
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "grpc: error while marshaling: proto: Marshal called with nil");
    }
    impl_->NoteOptionsAsked();
    *resp = impl_->Options();
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* w) override {
    return impl_->Stream(ctx, [w](const std::vector<v1beta1::Device>& devices) {
      v1beta1::ListAndWatchResponse r;
      for (const auto& d : devices) *r.add_devices() = d;
      return w->Write(r);
    });
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* req,
                                      v1beta1::PreferredAllocationResponse* resp) override {
    if (!impl_->o_.preferred) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "GetPreferredAllocation is not offered by this plugin (--preferred=false)");
    }
    ++impl_->preferred_calls_;
    for (const auto& cr : req->container_requests()) {
      std::vector<std::string> chosen = impl_->Prefer(
          {cr.available_deviceids().begin(), cr.available_deviceids().end()},
          {cr.must_include_deviceids().begin(), cr.must_include_deviceids().end()},
          cr.allocation_size());
      if (impl_->o_.fault == "preferred-wrong-size") {
        chosen.assign(cr.available_deviceids().begin(), cr.available_deviceids().end());
      }
      impl_->events_->Emit("preferred_allocation",
                           {{"available", std::vector<std::string>(
                                              cr.available_deviceids().begin(),
                                              cr.available_deviceids().end())},
                            {"size", cr.allocation_size()},
                            {"preferred", chosen}});
      auto* out = resp->add_container_responses();
      for (const std::string& id : chosen) out->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext* ctx, const v1beta1::AllocateRequest* req,
                        v1beta1::AllocateResponse* resp) override {
    std::vector<std::vector<std::string>> requests;
    for (const auto& cr : req->container_requests()) {
      requests.emplace_back(cr.devices_ids().begin(), cr.devices_ids().end());
    }
    std::vector<v1beta1::ContainerAllocateResponse> out;
    grpc::Status st = impl_->Allocate(ctx, requests, &out);
    if (!st.ok()) return st;
    for (auto& r : out) *resp->add_container_responses() = std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* req,
                                 v1beta1::PreStartContainerResponse*) override {
    ++impl_->pre_start_calls_;
    std::vector<std::string> ids(req->devices_ids().begin(), req->devices_ids().end());
    if (absl::Status s = impl_->CheckKnown(ids); !s.ok()) return ToGrpcStatus(s);
    if (impl_->o_.fault == "prestart-fails") {
      return grpc::Status(grpc::StatusCode::INTERNAL, "device reset failed (injected fault)");
    }
    impl_->events_->Emit("pre_start", {{"devices", ids}});
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class AlphaService final : public deviceplugin::DevicePlugin::Service {
 public:
  explicit AlphaService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const deviceplugin::Empty*,
                            grpc::ServerWriter<deviceplugin::ListAndWatchResponse>* w) override {
    return impl_->Stream(ctx, [w](const std::vector<v1beta1::Device>& devices) {
      deviceplugin::ListAndWatchResponse r;
      for (const auto& d : devices) {
        auto* a = r.add_devices();
        a->set_id(d.id());
        a->set_health(d.health());
      }
      return w->Write(r);
    });
  }

  grpc::Status Allocate(grpc::ServerContext* ctx, const deviceplugin::AllocateRequest* req,
                        deviceplugin::AllocateResponse* resp) override {
    std::vector<v1beta1::ContainerAllocateResponse> out;
    grpc::Status st =
        impl_->Allocate(ctx, {{req->devicesids().begin(), req->devicesids().end()}}, &out);
    if (!st.ok()) return st;
    // Same field numbers for envs, mounts and devices: copy through the wire.
    std::string bytes;
    out[0].SerializeToString(&bytes);
    resp->ParseFromString(bytes);
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class WatcherService final : public pluginregistration::Registration::Service {
 public:
  explicit WatcherService(SamplePlugin::Impl* impl) : impl_(impl) {}

  grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                       pluginregistration::PluginInfo* info) override {
    info->set_type(impl_->o_.fault == "watcher-wrong-type" ? "CSIPlugin"
                                                           : std::string(kDevicePluginType));
    info->set_name(impl_->o_.resource);
    info->set_endpoint(impl_->socket_path_);
    info->add_supported_versions(impl_->o_.api == ApiVersion::kV1Alpha
                                     ? std::string(kV1AlphaVersion)
                                     : std::string(kV1Beta1Version));
    impl_->events_->Emit("get_info", {{"socket", impl_->socket_path_}});
    return grpc::Status::OK;
  }

  grpc::Status NotifyRegistrationStatus(grpc::ServerContext*,
                                        const pluginregistration::RegistrationStatus* st,
                                        pluginregistration::RegistrationStatusResponse*) override {
    impl_->NoteRegistration(st->plugin_registered() ? absl::OkStatus()
                                                    : absl::UnknownError(st->error()));
    impl_->events_->Emit(st->plugin_registered() ? "registered" : "registration_failed",
                         {{"via", "plugin-watcher"}, {"error", st->error()}});
    return grpc::Status::OK;
  }

 private:
  SamplePlugin::Impl* const impl_;
};

class ControlService final : public PluginControl::Service {
 public:
  explicit ControlService(SamplePlugin* plugin) : plugin_(plugin) {}
  grpc::Status SetHealth(grpc::ServerContext*, const SetHealthRequest* req,
                         PluginStatus* resp) override {
    if (absl::Status s = plugin_->SetHealth(req->device_id(), req->health()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    *resp = plugin_->Status();
    return grpc::Status::OK;
  }
  grpc::Status SetDeviceCount(grpc::ServerContext*, const SetDeviceCountRequest* req,
                              SetDeviceCountResponse* resp) override {
    if (absl::Status s = plugin_->SetDeviceCount(req->devices()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    resp->set_devices(req->devices());
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const GetStatusRequest*,
                         PluginStatus* resp) override {
    *resp = plugin_->Status();
    return grpc::Status::OK;
  }

 private:
  SamplePlugin* const plugin_;
};

}  // namespace

// Services outlive the servers, which are rebuilt when the socket is recreated.
struct SamplePlugin::Services {
  std::unique_ptr<BetaService> beta;
  std::unique_ptr<AlphaService> alpha;
  std::unique_ptr<WatcherService> watcher;
  // A callback generic service can serve only one server in its life, so
  // each server gets its own; it is replaced after the old server is gone.
  std::unique_ptr<GoStyleUnknownHandler> unknown;
  std::vector<std::string> served;
  std::unique_ptr<ControlService> control;
};

// --- SamplePlugin -------------------------------------------------------------------

SamplePlugin::SamplePlugin(SamplePluginOptions options)
    : options_(std::move(options)), socket_path_(SocketPathFor(options_)) {
  impl_ = std::make_unique<Impl>(options_, &events_, socket_path_);
  impl_->on_panic = [this] { Die(); };
  services_ = std::make_unique<Services>();
  std::vector<std::string> served;
  if (options_.api == ApiVersion::kV1Beta1) {
    services_->beta = std::make_unique<BetaService>(impl_.get());
    served.push_back("v1beta1.DevicePlugin");
  } else {
    services_->alpha = std::make_unique<AlphaService>(impl_.get());
    served.push_back("deviceplugin.DevicePlugin");
  }
  if (options_.registration == RegistrationMode::kPluginWatcher) {
    services_->watcher = std::make_unique<WatcherService>(impl_.get());
    served.push_back("pluginregistration.Registration");
  }
  services_->served = served;
  services_->control = std::make_unique<ControlService>(this);
}

SamplePlugin::~SamplePlugin() {
  StopControl();
  Stop();
}

void SamplePlugin::ServeLocked() {
  Services* svc = services_.get();
  server_.reset();
  svc->unknown = std::make_unique<GoStyleUnknownHandler>(svc->served);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path_), grpc::InsecureServerCredentials());
  if (svc->beta) builder.RegisterService(svc->beta.get());
  if (svc->alpha) builder.RegisterService(svc->alpha.get());
  if (svc->watcher) builder.RegisterService(svc->watcher.get());
  builder.RegisterCallbackGenericService(svc->unknown.get());
  server_ = builder.BuildAndStart();
}

absl::Status SamplePlugin::WriteCdiSpec() {
  const std::string domain = ResourceDomain(options_.resource);
  const std::string name = ResourceShortName(options_.resource);
  nlohmann::json devices = nlohmann::json::array();
  for (const std::string& id : DeviceIds(options_)) {
    const std::string node = absl::StrCat("/dev/sample-cdi/", id);
    devices.push_back(
        {{"name", id},
         {"containerEdits",
          {{"deviceNodes", {{{"path", node}, {"hostPath", node}, {"permissions", "rw"}}}}}}});
  }
  const nlohmann::json spec = {{"cdiVersion", "0.6.0"},
                               {"kind", absl::StrCat(domain, "/", name)},
                               {"devices", devices}};
  const std::string path =
      JoinPath(options_.cdi_dir, absl::StrCat("sample-plugin-", domain, "-", name, ".json"));
  DPP_RETURN_IF_ERROR(MakeDirs(options_.cdi_dir));
  DPP_RETURN_IF_ERROR(WriteFileAtomic(path, spec.dump(1)));
  events_.Emit("cdi_spec_written", {{"path", path}});
  return absl::OkStatus();
}

absl::Status SamplePlugin::Start() {
  DPP_RETURN_IF_ERROR(ValidateOptions(options_));
  DPP_RETURN_IF_ERROR(MakeDirs(DirName(socket_path_)));
  if (Faulty("register-before-serve") && options_.registration == RegistrationMode::kKubelet) {
    // The bug: one Register before the socket is served. A 1.25+ kubelet
    // dials back inside Register and fails; this plugin does not try again
    // until the kubelet restarts.
    absl::MutexLock lock(&check_mu_);
    std::optional<FileId> id = StatFileId(options_.kubelet_socket);
    if (id.has_value()) {
      std::optional<FileId> reached;
      absl::Status s = RegisterOnce(&reached);
      last_registration_ = s;
      impl_->NoteRegistration(s);
      if (s.ok()) {
        registered_kubelet_ = reached.value_or(*id);
      } else {
        failed_kubelet_ = id;
      }
    }
  }
  if (Faulty("stale-socket-blocks") && ::access(socket_path_.c_str(), F_OK) == 0) {
    // The bug: binding without removing what a killed instance left, as
    // Go's net.Listen("unix", ...) does (gRPC's own listener removes it).
    return absl::UnavailableError(
        absl::StrCat("listen unix ", socket_path_, ": bind: address already in use"));
  }
  {
    absl::MutexLock lock(&server_mu_);
    ServeLocked();
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path_));
    }
  }
  if (!options_.cdi_dir.empty() && options_.api == ApiVersion::kV1Beta1) {
    DPP_RETURN_IF_ERROR(WriteCdiSpec());
  }
  started_ = true;
  // The count and the first few IDs: a line per device ID would be
  // megabytes at 100,000 devices.
  std::vector<std::string> ids = DeviceIds(options_);
  const size_t count = ids.size();
  if (ids.size() > 8) ids.resize(8);
  events_.Emit("serving", {{"socket", socket_path_},
                           {"resource", options_.resource},
                           {"api", options_.api == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1"},
                           {"devices", count},
                           {"first_devices", ids}});
  // Our socket's directory (device-plugins/, beside kubelet.sock, or
  // plugins_registry/) is watched before the first Register: a kubelet
  // that wipes our socket as that Register arrives dials the socket served
  // again.
  watcher_ = std::make_unique<DirWatcher>(
      DirName(socket_path_), [this](const DirWatcher::Event&) { OnDirEvent(); });
  DPP_RETURN_IF_ERROR(watcher_->Start());
  // Register now (CheckKubelet), then on every change of the directory.
  CheckKubelet();
  {
    absl::MutexLock lock(&wake_mu_);
    stop_registrar_ = false;
  }
  registrar_ = std::thread([this] { RegistrarLoop(); });
  if (!options_.flip_device.empty()) flipper_ = std::thread([this] { FlipLoop(); });
  return absl::OkStatus();
}

void SamplePlugin::Stop() {
  if (!started_) return;
  started_ = false;
  impl_->EndStreams(/*stopping=*/true);
  if (watcher_) {
    watcher_->Stop();
    watcher_.reset();
  }
  {
    absl::MutexLock lock(&wake_mu_);
    stop_registrar_ = true;
  }
  if (registrar_.joinable()) registrar_.join();
  if (flipper_.joinable()) flipper_.join();
  if (death_.joinable()) death_.join();
  {
    absl::MutexLock lock(&server_mu_);
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
  }
  ::unlink(socket_path_.c_str());
  events_.Emit("stopped", {{"socket", socket_path_}});
}

void SamplePlugin::FlipLoop() {
  for (int flips = 0; options_.flip_count == 0 || flips < options_.flip_count; ++flips) {
    absl::Time until = absl::Now() + options_.flip_interval;
    while (absl::Now() < until) {
      if (!started_) return;
      absl::SleepFor(std::min(absl::Milliseconds(100), until - absl::Now()));
    }
    if (!started_) return;
    std::string h = impl_->Health(options_.flip_device);
    (void)SetHealth(options_.flip_device,
                    h == kHealthy ? std::string(kUnhealthy) : std::string(kHealthy));
  }
}

absl::Status SamplePlugin::SetHealth(const std::string& id, const std::string& health) {
  return impl_->SetHealth(id, health);
}

absl::Status SamplePlugin::SetDeviceCount(int count) { return impl_->SetDeviceCount(count); }

PluginStatus SamplePlugin::Status() { return impl_->Status(); }

absl::Status SamplePlugin::last_registration() {
  absl::MutexLock lock(&check_mu_);
  return last_registration_;
}

std::optional<FileId> SamplePlugin::registered_kubelet() {
  absl::MutexLock lock(&check_mu_);
  return registered_kubelet_;
}

bool SamplePlugin::ServeAgainIfRemoved() {
  absl::MutexLock slock(&server_mu_);
  if (dead_) return false;
  // This plugin never looks at its own socket.
  if (options_.restart_signal == RestartSignal::kKubeletSocket) return false;
  if (Faulty("late-wipe-blind")) {
    // The bug: look at our socket only when kubelet.sock changed, so a
    // wipe the kubelet finishes after its new socket appears goes unseen.
    std::optional<FileId> kubelet = StatFileId(options_.kubelet_socket);
    if (kubelet == blind_kubelet_) return false;
    blind_kubelet_ = kubelet;
  }
  if (PathExists(socket_path_)) {
    gone_since_.reset();
    return false;
  }
  if (Faulty("slow-reserve")) {
    // Not a bug: a plugin that polls for its socket serves it again a
    // while after it was removed, and registers at once on a new
    // kubelet.sock, so its first Register after a kubelet start names a
    // socket that is not there yet. It recovers on the next poll.
    if (!gone_since_.has_value()) gone_since_ = absl::Now();
    if (absl::Now() - *gone_since_ < absl::Milliseconds(1500)) return false;
    gone_since_.reset();
  }
  // Counted first: a Register that ends from here on ended during the
  // serve (CheckKubelet).
  ++served_again_;
  ServeAnewLocked();
  return true;
}

void SamplePlugin::ServeAnewLocked() {
  impl_->EndStreams(/*stopping=*/false);
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  impl_->NoteServe();
  ServeLocked();
  events_.Emit("socket_recreated", {{"socket", socket_path_}, {"ok", server_ != nullptr}});
}

void SamplePlugin::RestartServer() {
  absl::MutexLock slock(&server_mu_);
  if (!dead_) ServeAnewLocked();
}

void SamplePlugin::Die() {
  if (dead_.exchange(true)) return;
  if (options_.exit_on_panic) {
    // What a Go program prints and does on an unrecovered panic.
    static const char kPanic[] =
        "panic: runtime error: invalid memory address or nil pointer dereference\n";
    (void)!::write(2, kPanic, sizeof(kPanic) - 1);
    ::_exit(2);
  }
  // Not from the handler's thread: the server waits for its handlers.
  death_ = std::thread([this] {
    absl::MutexLock slock(&server_mu_);
    impl_->EndStreams(/*stopping=*/true);
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
      server_.reset();
    }
    ::unlink(socket_path_.c_str());
    events_.Emit("died", {{"socket", socket_path_}});
  });
}

void SamplePlugin::OnDirEvent() {
  if (!started_) return;
  // The kubelet removes our socket when it restarts: serve again at once,
  // even while a registration is in flight (its dial then finds the
  // socket); registering is the registrar thread's job.
  ServeAgainIfRemoved();
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

void SamplePlugin::RegistrarLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
        return wake_ || stop_registrar_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_registrar_) return;
      wake_ = false;
    }
    CheckKubelet();
  }
}

void SamplePlugin::CheckKubelet() {
  CheckKubeletOnce();
  kubelet_checks_.Add();
}

void SamplePlugin::CheckKubeletOnce() {
  if (!started_) return;
  ServeAgainIfRemoved();
  absl::MutexLock lock(&check_mu_);
  if (const uint64_t serves = served_again_.load(); serves != answered_serves_) {
    answered_serves_ = serves;
    // Only a kubelet start removes our socket: whatever kubelet.sock is
    // there now belongs to a new kubelet.
    registered_kubelet_.reset();
    failed_kubelet_.reset();
  }
  if (options_.registration != RegistrationMode::kKubelet || dead_) return;
  std::optional<FileId> id = StatFileId(options_.kubelet_socket);
  if (!id.has_value()) return;  // no kubelet yet: wait for it
  if (registered_kubelet_ == id || failed_kubelet_ == id) return;
  // Registered, and its own socket still there: a new kubelet.sock alone
  // goes unseen.
  if (options_.restart_signal == RestartSignal::kOwnSocket && registered_kubelet_.has_value()) {
    return;
  }
  if (options_.restart_signal == RestartSignal::kKubeletSocket &&
      (registered_kubelet_.has_value() || failed_kubelet_.has_value())) {
    RestartServer();
  }
  if (Faulty("no-reregister") && impl_->registrations_ > 0) return;
  if (registered_kubelet_.has_value()) {
    events_.Emit("kubelet_restart_detected", {{"kubelet_socket", options_.kubelet_socket}});
  }
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  absl::Status s;
  std::optional<FileId> reached;
  uint64_t attempt_serves = 0;
  int64_t attempt_asks = 0;
  for (;;) {
    if (options_.before_register_attempt) options_.before_register_attempt();
    // Never ask a kubelet to dial a socket that is not served: a kubelet
    // that (re)started while we retried may have wiped it. This attempt
    // answers every serve before it, here or on the watcher's thread.
    ServeAgainIfRemoved();
    attempt_serves = served_again_.load();
    attempt_asks = impl_->options_asks();
    reached.reset();
    s = RegisterOnce(&reached);
    if (s.ok() || s.code() != absl::StatusCode::kUnavailable || absl::Now() >= deadline ||
        !started_) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  last_registration_ = s;
  impl_->NoteRegistration(s);
  if (s.ok()) {
    // The kubelet.sock connected to: one made anew since `id` was read (a
    // kubelet that started while the first attempts failed) is the one
    // registered with. Noting `id` had the next check take it for another
    // restart and register again, which a 1.37 kubelet refuses ("device
    // plugin already connected") and then never lets the socket go.
    registered_kubelet_ = reached.value_or(*id);
    // Served again while the kubelet answered: if its dial-back asked the
    // new server for the options, the kubelet holds that server, and a
    // 1.37 kubelet refuses another registration there. Otherwise the
    // serve still asks for one. Judged between serves, never during one.
    absl::MutexLock slock(&server_mu_);
    const uint64_t serves = served_again_.load();
    answered_serves_ = serves != attempt_serves && impl_->options_asks() != attempt_asks &&
                               impl_->OptionsAskedOfCurrentServer()
                           ? serves
                           : attempt_serves;
    failed_kubelet_.reset();
  } else {
    failed_kubelet_ = id;
  }
}

absl::Status SamplePlugin::RegisterOnce(std::optional<FileId>* reached) {
  auto channel = MakeUnixChannel(options_.kubelet_socket);
  if (!WaitForConnected(channel.get(), absl::Seconds(1)).ok()) {
    return absl::UnavailableError(
        absl::StrCat("kubelet socket ", options_.kubelet_socket, " is not accepting connections"));
  }
  *reached = StatFileId(options_.kubelet_socket);
  grpc::ClientContext ctx;
  // A 1.25+ kubelet dials back and may take up to 10 s to give up.
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(15)));
  const std::string endpoint = DefaultSocketName(options_);
  grpc::Status st;
  std::string version;
  if (options_.api == ApiVersion::kV1Beta1) {
    v1beta1::RegisterRequest req;
    version = !options_.register_version.empty() ? options_.register_version
              : Faulty("wrong-version")          ? "v1"
                                                 : std::string(kV1Beta1Version);
    req.set_version(version);
    req.set_endpoint(endpoint);
    req.set_resource_name(options_.resource);
    if (!options_.panic_on_options) *req.mutable_options() = impl_->Options();
    v1beta1::Empty resp;
    st = v1beta1::Registration::NewStub(channel)->Register(&ctx, req, &resp);
  } else {
    deviceplugin::RegisterRequest req;
    version = !options_.register_version.empty() ? options_.register_version
              : Faulty("wrong-version")          ? "v1alpha1"
                                                 : std::string(kV1AlphaVersion);
    req.set_version(version);
    req.set_endpoint(endpoint);
    req.set_resource_name(options_.resource);
    deviceplugin::Empty resp;
    st = deviceplugin::Registration::NewStub(channel)->Register(&ctx, req, &resp);
  }
  if (!st.ok()) {
    events_.Emit("registration_failed", {{"kubelet_socket", options_.kubelet_socket},
                                         {"version", version},
                                         {"code", GrpcCodeName(st.error_code())},
                                         {"error", st.error_message()}});
    // A connection that broke mid-call is worth retrying; an answer is not.
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(DescribeGrpcStatus(st));
    }
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        DescribeGrpcStatus(st));
  }
  events_.Emit("registered", {{"kubelet_socket", options_.kubelet_socket},
                              {"version", version},
                              {"endpoint", endpoint},
                              {"resource", options_.resource}});
  return absl::OkStatus();
}

absl::Status SamplePlugin::StartControl(const std::string& socket_path) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  ControlService* svc = services_->control.get();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(socket_path), grpc::InsecureServerCredentials());
  builder.RegisterService(svc);
  control_server_ = builder.BuildAndStart();
  if (control_server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", socket_path));
  }
  return absl::OkStatus();
}

void SamplePlugin::StopControl() {
  if (control_server_) {
    control_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    control_server_->Wait();
    control_server_.reset();
  }
}

}  // namespace dpproxy::sample
