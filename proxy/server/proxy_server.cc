#include "proxy/rpc/grpc_util.h"
#include "proxy/state/state_dir.h"
#include "proxy/server/proxy_server.h"

#include <unistd.h>

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/config/config_file.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/kubelet_side/split_side.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

namespace {

// After a start on a damaged state: how long the checkpoint passes learn
// back what the kubelet lists and the journal lacks.
constexpr absl::Duration kLearnBackWindow = absl::Minutes(10);

// Registrations and static connects in parallel; a fixed number, whatever
// the resource count. Eight: a GPU node's resources register in one round
// after a reboot (each Register waits on the kubelet's dial-back).
constexpr int kWorkers = 8;

}  // namespace

ProxyServer::ProxyServer(ProxyConfig config) : config_(std::move(config)) {}

ProxyServer::~ProxyServer() {
  Shutdown();
  // The side's sockets point at the resources: it goes first.
  side_.reset();
  retired_.clear();
}

ProxyServer::LockFd::~LockFd() {
  if (fd >= 0) ::close(fd);
}

std::map<std::string, int64_t> ProxyServer::RegistrationRejections() {
  return registration_ ? registration_->Rejections() : std::map<std::string, int64_t>();
}

std::string ProxyServer::backend_registration_socket() const {
  return JoinPath(config_.plugin_dir, kKubeletSocketName);
}

ProxyStatus ProxyServer::Status(bool with_devices) {
  return reporter_ ? reporter_->Status(with_devices) : ProxyStatus();
}

std::vector<HealthCheck> ProxyServer::Readiness() {
  return reporter_ ? reporter_->Readiness() : std::vector<HealthCheck>();
}

absl::Status ProxyServer::Start() {
  DPP_RETURN_IF_ERROR(ValidateConfig(config_));
  KeepGrpcForProcess();  // (once per process; main has called it already)
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::OkStatus();
    running_ = true;
  }
  stopping_ = false;
  LOG(INFO) << "dpproxy starting: kubelet root " << config_.kubelet.kubelet_root
            << ", plugins register at " << backend_registration_socket();
  events_.Emit("proxy_starting", {{"kubelet_root", config_.kubelet.kubelet_root},
                                  {"plugin_socket", backend_registration_socket()}});
  // Registrations run in parallel, never on the housekeeping thread: a
  // 1.25+ kubelet's 10 s dial must not hold up another resource, a socket
  // that must be served again, or the hold and restore timers.
  workers_ = std::make_unique<WorkQueue>(kWorkers);
  statics_ = std::make_unique<StaticBackends>(
      StaticBackends::Options{config_.backend_max_list_bytes}, workers_.get(), &events_,
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); });
  // State first: remembered resources are served and registered before any
  // backend is back.
  if (!config_.state_dir.empty()) {
    if (absl::Status s = OpenState(); !s.ok()) {
      return FailStart(absl::FailedPreconditionError(
          absl::StrCat("state directory ", config_.state_dir, ": ", s.message())));
    }
  }
  if (absl::Status s = StartServing(); !s.ok()) return FailStart(s);
  if (!config_.state_dir.empty()) {
    if (absl::Status s = NoteStateDirInUse(config_.plugin_dir, config_.state_dir); !s.ok()) {
      LOG(WARNING) << "cannot note the state directory in " << config_.plugin_dir
                   << " (were every state file lost, the next start would take it for a "
                      "first start): "
                   << s.message();
    }
  }
  Wake();
  events_.Emit("proxy_started", {});
  if (taking_over()) {
    takeover_->StartCompleting(
        {side_.get(), [this] { return stopping(); }, before_finish_hook_,
         [this](absl::Duration timeout) { return redialer_->WaitSettled(timeout); }});
  }
  return absl::OkStatus();
}

void ProxyServer::CancelStart() {
  start_cancelled_.store(true);
  if (DraSide* d = dra_live_.load(); d != nullptr) d->CancelApiCalls();
}

absl::Status ProxyServer::FailStart(absl::Status s) {
  start_error_ = std::string(s.message());
  Shutdown();
  return s;
}

absl::Status ProxyServer::LockState() {
  DPP_RETURN_IF_ERROR(MakeDirs(config_.state_dir));
  DPP_RETURN_IF_ERROR(CheckOwnDirectory(config_.state_dir));
  if (state_lock_.fd >= 0) return absl::OkStatus();
  const std::string lock_path = JoinPath(config_.state_dir, "lock");
  absl::StatusOr<int> fd =
      LockFile(lock_path, config_.takeover ? absl::ZeroDuration() : config_.state_lock_wait);
  const auto held = [&fd] { return fd.status().code() == absl::StatusCode::kUnavailable; };
  if (!fd.ok() && held() && config_.takeover) {
    // Held: the running dpproxy hands the state over, then unlocks.
    takeover_ = std::make_unique<Takeover>(
        config_.state_dir, config_.kubelet.backend_timeout + absl::Seconds(10), &events_);
    if (absl::Status asked = takeover_->AskToRelease(); !asked.ok()) {
      // The running dpproxy may have died while it was asked (the kernel
      // freed its lock): then this is a start after a crash, and the node
      // must not be left without a dpproxy.
      absl::StatusOr<int> free = LockFile(lock_path, absl::ZeroDuration());
      if (!free.ok()) return asked;
      LOG(WARNING) << "takeover: " << asked.message()
                   << "; the running dpproxy is gone (its lock is free): starting as after a "
                      "crash";
      events_.Emit("takeover_predecessor_gone", {{"error", std::string(asked.message())}});
      takeover_.reset();
      state_lock_.fd = *free;
      return absl::OkStatus();
    }
    socket_generation_ = takeover_->socket_generation();
    fd = LockFile(lock_path, config_.state_lock_wait);
  }
  if (!fd.ok() && held()) {
    return absl::FailedPreconditionError(absl::StrCat(
        fd.status().message(),
        ": another dpproxy is using this state directory, and two must never share one "
        "(their journals would interleave); stop it, or give this one its own --state_dir"));
  }
  if (!fd.ok()) {
    // Not another dpproxy: the lock file itself (a read-only file system, a
    // directory in its place).
    return absl::FailedPreconditionError(absl::StrCat(
        fd.status().message(), "; dpproxy needs its state directory writable"));
  }
  state_lock_.fd = *fd;
  // A marker left by an earlier takeover says nothing about this one.
  ::unlink(SuccessorRegisteredMarker().c_str());
  return absl::OkStatus();
}

std::string ProxyServer::SuccessorRegisteredMarker() const {
  return JoinPath(config_.state_dir, "handoff.registered");
}

void ProxyServer::NoteRegisteringWhileTakingOver() {
  // Once, and only while the takeover runs, before the first registration
  // is sent (a process stopped right after the kubelet accepted one would
  // leave no note): a running dpproxy that takes the state back reads it
  // (ResumeWriting).
  if (!taking_over() || takeover_->finish_sent() || marked_registered_.exchange(true)) return;
  if (absl::Status s = WriteFileAtomic(SuccessorRegisteredMarker(),
                                       absl::StrCat(::getpid(), "\n"));
      !s.ok()) {
    LOG(WARNING) << "takeover: cannot note in the state directory that this dpproxy "
                 << "registers (" << s.message() << "); should it fail, the running one "
                 << "would not know to register again";
  }
}

absl::Status ProxyServer::OpenState() {
  DPP_RETURN_IF_ERROR(LockState());
  keeper_ = std::make_unique<StateKeeper>(JoinPath(config_.state_dir, "state.pb"), &events_);
  keeper_->SetSyncObserver([this](absl::Duration d) { telemetry_.ObserveJournalSync(d); });
  // Not one state file, while the plugin directory's note names this state
  // directory: its files were lost (removed, a wiped volume), which is not
  // a first start.
  std::optional<std::string> lost_since;
  if (StateDirEmpty(config_.state_dir)) {
    lost_since = StateDirNotedSince(config_.plugin_dir, config_.state_dir);
  }
  DPP_RETURN_IF_ERROR(MakeSide());
  DPP_RETURN_IF_ERROR(RestoreState());
  if (lost_since.has_value()) ReportStateLost(*lost_since);
  const bool plugin_pods = ShareDevicesAcrossPaths();
  // A later dpproxy may take over from this one (--takeover).
  handover_ = std::make_unique<Handover>(
      Handover::Options{config_.state_dir, socket_generation_, config_.handoff_timeout,
                        shared_listener_fd_},
      static_cast<Handover::Host*>(this), &events_, [this] {
        if (handed_over_hook_) handed_over_hook_();
      });
  handover_->Serve();
  // Only device-plugin allocations are reconciled: DRA claims are the
  // kubelet's to end, with NodeUnprepareResources.
  if (plugin_pods) MakeReconciler();
  DPP_RETURN_IF_ERROR(OpenCordons());
  withheld_ = std::make_unique<Withheld>(&table_, statics_.get(), keeper_.get(),
                                         reconciler_.get(), cordon_book_.get(), &events_);
  if (reconciler_ && keeper_->damaged_at_load()) {
    // The kubelet's checkpoint still lists what the damaged state lost:
    // learned back for the resources served meanwhile (their plugins
    // register within moments of a start).
    reconciler_->LearnBack(kLearnBackWindow, [this](const std::string& resource) {
      return table_.Find(resource) != nullptr;
    });
  }
  return absl::OkStatus();
}

absl::Status ProxyServer::OpenCordons() {
  DPP_ASSIGN_OR_RETURN(cordon_book_,
                       CordonBook::Open(JoinPath(config_.state_dir, CordonBook::kFileName)));
  cordon_control_ = std::make_unique<CordonControl>(
      cordon_book_.get(),
      [this](const std::string& resource) -> std::optional<std::vector<std::string>> {
        ServedResource* e = table_.Find(resource);
        if (e == nullptr) return std::nullopt;
        const Resource::Snapshot snap = e->resource->Current();
        std::vector<std::string> ids;
        ids.reserve(static_cast<size_t>(snap.list->size()));
        for (int i = 0; i < snap.list->size(); ++i) ids.emplace_back(snap.list->device(i).id);
        return ids;
      },
      &events_,
      [this] {
        // Shown to the kubelet before the caller hears it was taken.
        ApplyWithheld();
        Wake();
      });
  if (const size_t n = cordon_book_->List().size(); n > 0) {
    LOG(WARNING) << n << " device(s) are cordoned (" << cordon_book_->path()
                 << "): reported Unhealthy until dpctl uncordon";
  }
  return absl::OkStatus();
}

void ProxyServer::StartControl() {
  absl::StatusOr<std::unique_ptr<ControlServer>> control = ControlServer::Start(
      JoinPath(config_.state_dir, kControlSocketName), cordon_control_.get());
  if (!control.ok()) {
    LOG(ERROR) << control.status().message() << "; dpctl cordon and uncordon cannot reach this "
               << "dpproxy (the kubelet is served as usual)";
    events_.Emit("control_socket_failed", {{"error", std::string(control.status().message())}});
    return;
  }
  control_ = *std::move(control);
}

void ProxyServer::ReportStateLost(const std::string& in_use_since) {
  keeper_->MarkDamagedAtLoad();
  LOG(ERROR) << "state directory " << config_.state_dir << " has none of its files, and "
             << JoinPath(config_.plugin_dir, kStateNoteName) << " says dpproxy has used it "
             << "since " << in_use_since << ": the state was lost, this is not a first start; "
             << "dpproxy learns back from the kubelet the allocations it lists";
  events_.Emit("state_lost", {{"path", config_.state_dir},
                              {"in_use_since", in_use_since},
                              {"note", JoinPath(config_.plugin_dir, kStateNoteName)}});
}

bool ProxyServer::ShareDevicesAcrossPaths() {
  // Pods of the extended resource and DRA claims may both hold devices:
  // both sides serve, or the journal holds the other path's allocations (a
  // path changed while pods ran). Each device then has one holder, and
  // pods of the extended resource are reconciled whichever side serves.
  const StateKeeper::Kinds kinds = keeper_->AllocationKinds();
  const bool plugin_pods = ServesDevicePlugins(config_) || kinds.others > 0;
  const bool claims = ServesDra(config_) || kinds.claims > 0;
  if (!plugin_pods || !claims) return plugin_pods;
  keeper_->SetOneHolderAcrossPaths(true);
  // The other side stops offering what one path took: soon, not at the
  // next second's pass. And a reconciliation pass names a new pod of the
  // device plugin while it runs, so that its end returns its device to the
  // pool at the pass after (Reconciler::Nudge).
  keeper_->SetHeldAcrossObserver([this] {
    housekeeping_.Wake();
    if (Reconciler* r = reconciler_.get()) r->Nudge();
  });
  if (config_.reconcile_start_grace < absl::Seconds(2)) {
    LOG(WARNING) << "reconcile.start_grace is "
                 << absl::FormatDuration(config_.reconcile_start_grace)
                 << ": right after a kubelet start its pod list is empty for a moment, and "
                 << "a pod found missing then has its devices released to DRA claims while "
                 << "it runs; keep it at a few seconds (default 10s)";
  }
  if (!ServesDra(config_) && kinds.claims > 0) {
    LOG(WARNING) << kinds.claims << " allocation(s) of DRA claims are in the journal, and no "
                 << "resource is served through DRA: their devices are shown Unhealthy to "
                 << "the kubelet's device manager until the claims are unprepared, which "
                 << "needs the DRA side (paths: both) until their pods end";
  }
  return plugin_pods;
}

void ProxyServer::MakeReconciler() {
  Reconciler::Options o{
      config_.kubelet, config_.reconcile_interval, config_.reconcile_grace,
      config_.reconcile_start_grace, config_.container_runtime_endpoint,
      // A resource served through DRA whose pool lacks devices pods of
      // the device plugin hold: claims may wait for them.
      [this] {
        for (const auto& [resource, held] : keeper_->HeldAcrossPaths()) {
          if (!held.by_pods.empty() && table_.PathOf(resource) != KubeletPath::kDevicePlugin) {
            return true;
          }
        }
        return false;
      }};
  // A checkpoint's parse dropped: handed back once things settle (the
  // saver is made before the reconciler starts, and outlives its passes).
  o.freed = [this] {
    if (saver_) saver_->NoteFreed();
  };
  reconciler_ =
      std::make_unique<Reconciler>(std::move(o), keeper_.get(), &events_, [this] { Wake(); });
}

std::unique_ptr<DraSide> ProxyServer::MakeDraSide() {
  return std::make_unique<DraSide>(
      DraSide::Options{config_.dra, config_.kubelet.kubelet_root, config_.state_dir,
                       keeper_.get(), config_.kubelet.backend_timeout,
                       config_.api_max_body_bytes, socket_generation_,
                       [this](const std::string& resource) {
                         std::map<std::string, std::string> out;
                         if (cordon_book_ == nullptr) return out;
                         auto all = cordon_book_->ByResource();
                         if (auto it = all.find(resource); it != all.end()) out = it->second;
                         return out;
                       }},
      [this] {
        // The resources whose path goes through DRA, as the last reload
        // left them.
        std::vector<Allocator*> out;
        for (ServedResource* e : table_.All()) {
          if (table_.PathOf(e->resource->name()) != KubeletPath::kDevicePlugin) {
            out.push_back(e->allocator.get());
          }
        }
        return out;
      },
      &events_, &losses_);
}

std::unique_ptr<SplitSide> ProxyServer::MakeSplitSide(std::unique_ptr<KubeletSide> device_plugins,
                                                      std::unique_ptr<DraSide> dra) {
  SplitSide::Fence fence;
  if (MoveFence* f = dra->move_fence(); f != nullptr) {
    fence.fence = [f](const std::string& resource, std::function<void()> withdraw) {
      f->Fence(resource, std::move(withdraw));
    };
    fence.cancel = [f](const std::string& resource) { f->Cancel(resource); };
  }
  return std::make_unique<SplitSide>(
      std::move(device_plugins), std::move(dra),
      [this](const std::string& resource) { return table_.PathOf(resource); },
      [this](const std::string& resource) {
        bool held = false;
        keeper_->ForEachAllocation([&](const state::Allocation& a) {
          held |= !a.has_claim() && a.resource() == resource;
        });
        return held;
      },
      std::move(fence));
}

absl::Status ProxyServer::MakeSide() {
  if (side_) return absl::OkStatus();
  std::unique_ptr<KubeletSide> device_plugins;
  if (ServesDevicePlugins(config_)) {
    KubeletSideOptions kubelet = table_.live().kubelet;  // as a reload left it
    kubelet.socket_generation = socket_generation_;
    auto side = std::make_unique<DevicePluginSide>(
        kubelet, DevicePluginSide::Parts{&events_, &losses_, &telemetry_, workers_.get(),
                                         [this] { Wake(); }});
    const bool taking_over_notes = !config_.state_dir.empty();
    if (taking_over_notes || before_register_hook_) {
      side->SetBeforeRegisterHook([this, taking_over_notes] {
        if (taking_over_notes) NoteRegisteringWhileTakingOver();
        if (before_register_hook_) before_register_hook_();
      });
    }
    if (after_served_again_hook_) side->SetAfterServedAgainHook(after_served_again_hook_);
    device_plugins = std::move(side);
  }
  if (!ServesDra(config_)) {
    side_ = std::move(device_plugins);
    return absl::OkStatus();
  }
  std::unique_ptr<DraSide> dra = MakeDraSide();
  dra_ = dra.get();
  dra_live_.store(dra_);
  if (start_cancelled_.load()) dra_->CancelApiCalls();
  if (device_plugins == nullptr) {
    side_ = std::move(dra);
    return absl::OkStatus();
  }
  std::unique_ptr<SplitSide> split = MakeSplitSide(std::move(device_plugins), std::move(dra));
  split_ = split.get();
  side_ = std::move(split);
  return absl::OkStatus();
}

absl::Status ProxyServer::StartPluginRegistrations() {
  BackendRegistrationServer::Options reg_options{config_.plugin_dir, config_.dial_timeout,
                                                 config_.backend_max_list_bytes};
  if (!config_.socket_group.empty()) reg_options.socket_gid = *ResolveGroup(config_.socket_group);
  registration_ = std::make_unique<BackendRegistrationServer>(
      reg_options,
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); }, &events_);
  DPP_RETURN_IF_ERROR(registration_->Start());
  // Plugins that served before this start, where they still listen: one
  // that watches only its own socket never registers again by itself.
  redialer_ = std::make_unique<Redialer>(
      Redialer::Options{config_.plugin_dir, config_.dial_timeout,
                        config_.backend_max_list_bytes},
      workers_.get(), &events_,
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); },
      [this](const std::string& name) {
        ServedResource* e = table_.Find(name);
        return e != nullptr && e->resource->backend_connected();
      });
  redialer_->Start(std::move(remembered_));
  remembered_.clear();
  for (const StaticBackendConfig& sb : config_.static_backends) {
    const std::string name = table_.ServedName(sb.resource);
    (void)EnsureEntry(name);
    statics_->Dial(name, sb);
  }
  return absl::OkStatus();
}

absl::Status ProxyServer::StartPodResourcesView() {
  if (config_.pod_resources_socket.empty()) return absl::OkStatus();
  pod_resources_view_ = std::make_unique<PodResourcesView>(
      PodResourcesView::Options{
          config_.pod_resources_socket,
          KubeletPodResourcesSocket(config_.kubelet),
          ServesDra(config_) ? config_.dra.driver : std::string(), config_.dra.node_name,
          [this] {
            DraResources out;
            if (!ServesDra(config_)) return out;
            // Every resource: one whose path moved to the device plugin
            // may still have claims holding devices (Unhealthy to it).
            for (ServedResource* e : table_.All()) {
              out.emplace_back(e->resource->name(), e->resource->Current().list);
            }
            return out;
          }},
      keeper_.get());
  return pod_resources_view_->Start();
}

absl::Status ProxyServer::StartServing() {
  DPP_RETURN_IF_ERROR(MakeSide());
  DPP_RETURN_IF_ERROR(StartPluginRegistrations());
  DPP_RETURN_IF_ERROR(side_->Start());
  reporter_ = std::make_unique<Reporter>(Reporter::Parts{
      &config_, &table_, statics_.get(), &losses_, side_.get(), registration_.get(),
      keeper_.get(), reconciler_.get(), withheld_.get(), dra_, redialer_.get()});
  reload_actions_.SetParts(ReloadActions::Parts{
      &table_, statics_.get(), workers_.get(), registration_.get(), side_.get(), split_, &events_,
      config_.backend_max_list_bytes, [this](const std::string& name) { return EnsureEntry(name); },
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); }});
  saver_ = std::make_unique<Saver>(Saver::Options{config_.status_file}, keeper_.get(),
                                   reporter_.get(), &events_, [this] { return released(); });
  housekeeping_.Start({&table_, statics_.get(), withheld_.get(), side_.get(),
                       reconciler_.get(), handover_.get(), saver_.get(), &shared_ids_,
                       housekeeping_hook_});
  saver_->Start();
  if (cordon_control_) StartControl();
  if (reconciler_) reconciler_->Start();
  return StartPodResourcesView();
}

void ProxyServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
  }
  LOG(INFO) << "dpproxy shutting down";
  control_.reset();
  if (handover_) handover_->StopServing();
  if (pod_resources_view_) pod_resources_view_->Stop();
  stopping_ = true;
  if (takeover_) takeover_->Join();
  housekeeping_.Stop();
  if (saver_) saver_->Stop();
  if (reconciler_) reconciler_->Stop();
  if (redialer_) redialer_->Stop();
  if (registration_) registration_->Stop();
  retired_ = table_.TakeAll();
  const bool giving_back = taking_over() && !takeover_->finish_sent();
  if (side_) {
    side_->Stop(released()    ? KubeletSide::Ending::kHandedOver
                : giving_back ? KubeletSide::Ending::kGivenBack
                              : KubeletSide::Ending::kForGood);
  }
  // The workers' jobs (registrations, static dials) point at the entries.
  if (workers_) workers_->Shutdown();
  for (auto& [name, e] : retired_) e->resource->Shutdown();
  // After a handoff the status file is the new dpproxy's; given back, the
  // predecessor's.
  if (!config_.status_file.empty() && !released() && !giving_back) {
    ::unlink(config_.status_file.c_str());
  }
  if (giving_back) {
    // Taking over, and not done: the predecessor still serves the kubelet
    // and must have its state back, or nothing could write the journal.
    GiveStateBack(start_error_.empty()
                      ? std::string("it was stopped before it was registered with the kubelet")
                      : absl::StrCat("it could not start: ", start_error_));
  }
  events_.Emit("proxy_stopped", {});
}

std::unique_ptr<ServedResource> ProxyServer::MakeEntry(const std::string& name) {
  const ProxyConfig live = table_.live();
  // As a reload left them.
  ResourcePolicy policy = config_.policy;
  policy.loss_policy = live.policy.loss_policy;
  policy.hold = live.policy.hold;
  policy.grace = live.policy.grace;
  policy.probe = live.policy.probe;
  policy.flap_damping = live.policy.flap_damping;
  auto m = live.id_maps.find(name);
  if (m != live.id_maps.end()) policy.id_map = m->second;
  policy.compact_ids = live.compact_ids.count(name) > 0;
  ResourceHooks hooks;
  hooks.on_change = [this] { Wake(); };
  StateKeeper* keeper = keeper_.get();
  hooks.is_allocated = [keeper, name](const std::string& id) {
    return keeper != nullptr && keeper->HoldsDevice(name, id);
  };
  if (reconciler_) hooks.forgotten = reconciler_->forgotten();
  auto e = std::make_unique<ServedResource>();
  e->resource = std::make_unique<Resource>(name, policy, &events_, std::move(hooks));
  e->allocator = std::make_unique<Allocator>(e->resource.get(), keeper_.get(), &telemetry_);
  return e;
}

ServedResource* ProxyServer::EnsureEntry(const std::string& name, std::shared_ptr<Backend> attach) {
  ServedResource* e = table_.Find(name);
  bool made = false;
  if (e == nullptr) std::tie(e, made) = table_.Add(name, MakeEntry(name));  // one wins a race
  if (attach) {
    table_.SetBackendResource(e, attach->resource());
    statics_->PluginServes(name);  // a plugin serves it again
  }
  if (made || attach) table_.NoteServedChange();
  if (attach) {
    // What it must not show free is known before its first list.
    ApplyWithheld();
    (void)e->resource->AttachBackend(std::move(attach));
  }
  if (!made) return e;
  side_->AddResource(e->allocator.get());
  Wake();
  return e;
}

absl::Status ProxyServer::AttachBackend(std::shared_ptr<Backend> backend) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("dpproxy is stopping");
  }
  const std::string name = table_.ServedName(backend->resource());
  if (name != backend->resource()) {
    LOG(INFO) << "backend resource " << backend->resource() << " is served to the kubelet as "
              << name;
  }
  // Options may change: the registrar compares them with those it
  // registered (kubelets up to 1.24 only read them at registration).
  (void)EnsureEntry(name, std::move(backend));
  Wake();
  return absl::OkStatus();
}

void ProxyServer::Wake() {
  housekeeping_.Wake();
  if (side_) side_->Wake();
}

std::vector<HealthCheck> ProxyServer::Liveness() { return {housekeeping_.Liveness()}; }

absl::Status ProxyServer::ReconcileOnce() {
  if (!reconciler_) {
    return absl::FailedPreconditionError("no reconciliation (no state directory, or DRA mode)");
  }
  return reconciler_->ReconcileOnce();
}

absl::Status ProxyServer::ReconcileCheckpointOnce() {
  if (!reconciler_) {
    return absl::FailedPreconditionError("no reconciliation (no state directory, or DRA mode)");
  }
  return reconciler_->ReconcileCheckpointOnce();
}

absl::Status ProxyServer::RestoreState() {
  // Its resources, and which names allocations hold devices under.
  absl::StatusOr<state::State> loaded = keeper_->Load(/*summary=*/true);
  if (!loaded.ok()) return loaded.status();
  const state::State& st = *loaded;
  const absl::Duration trust =
      config_.restore_policy == RestorePolicy::kTrust ? config_.restore_hold
                                                      : absl::ZeroDuration();
  std::set<std::string> holding;  // names allocations hold devices under
  for (const state::Allocation& a : st.allocations()) holding.insert(a.resource());
  for (const state::Resource& r : st.resources()) {
    const std::string& plugin = r.backend().backend_resource();
    const std::string now = plugin.empty() ? r.name() : table_.ServedName(plugin);
    // A static backend the configuration no longer has.
    bool static_removed = r.backend().static_backend();
    for (const StaticBackendConfig& sb : config_.static_backends) {
      if (table_.ServedName(sb.resource) == r.name()) static_removed = false;
    }
    if ((now != r.name() || static_removed) && holding.count(r.name()) == 0) {
      // Renamed or removed, and no pod holds its devices under this name:
      // nothing to keep it for.
      LOG(INFO) << "resource " << r.name() << ": not served any more: "
                << (now != r.name() ? absl::StrCat("its plugin's resource ", plugin,
                                                   " is served as ", now, " (renames)")
                                    : std::string("its static backend was removed from the "
                                                  "configuration"));
      events_.Emit("resource_retired",
                   {{"resource", r.name()}, {"served_as", now != r.name() ? now : ""}});
      continue;
    }
    ServedResource* e = EnsureEntry(r.name());
    std::optional<v1beta1::DevicePluginOptions> options;
    if (r.backend().has_options()) options = r.backend().options();
    if (r.compact_ids()) e->resource->KeepCompactIds();
    e->resource->Restore(DeviceList::FromDevices({r.devices().begin(), r.devices().end()}), trust,
                         r.backend().endpoint(), r.backend().api_version(), options);
    absl::StatusOr<std::optional<ApiVersion>> api =
        ParseApiVersion(r.backend().api_version(), /*allow_auto=*/false);
    if (!r.backend().static_backend() && !r.backend().endpoint().empty() && api.ok() &&
        api->has_value()) {
      remembered_.push_back({r.name(), plugin.empty() ? r.name() : plugin, r.backend().endpoint(),
                             **api, options});
    }
    table_.SetRestored(e, {plugin, r.kubelet_api()});
    if (static_removed) statics_->MarkRemoved(r.name());
    LOG(INFO) << "resource " << r.name() << ": restored " << r.devices_size()
              << " devices from the state file; "
              << (trust > absl::ZeroDuration()
                      ? "trusted at their remembered health for " + absl::FormatDuration(trust)
                      : std::string("reported Unhealthy"))
              << " until backend " << r.backend().endpoint() << " ("
              << r.backend().api_version() << ") is back";
    events_.Emit("resource_restored", {{"resource", r.name()},
                                       {"devices", r.devices_size()},
                                       {"trusted_seconds", absl::ToInt64Seconds(trust)}});
  }
  return absl::OkStatus();
}

ProxyServer::ReloadResult ProxyServer::Reload(const ProxyConfig& next) {
  ReloadResult result = reloader_.Reload(table_.live(), next);
  Wake();
  return result;
}

std::string ProxyServer::KubeletSocketOf(const std::string& resource) {
  return side_ && table_.Find(resource) != nullptr ? side_->ViewOf(resource).socket : "";
}

// --- Handoff ---------------------------------------------------------------------

std::vector<KubeletGate*> ProxyServer::HandoverGates() { return side_->Gates(); }

absl::Duration ProxyServer::AllocateWait() {
  return table_.live().kubelet.backend_timeout + absl::Seconds(1);
}

void ProxyServer::StopWriting() {
  // The new one serves the control socket, and keeps the cordons.
  control_.reset();
  side_->Hold();
  for (ServedResource* e : table_.All()) e->resource->KeepHealthOnLoss();
  if (reconciler_) reconciler_->Stop();
  saver_->SaveNow();  // the newest lists, changed or not
  // The plugins' socket is the new one's to serve (and a server that
  // stopped later would unlink it under the new one).
  if (redialer_) redialer_->Stop();
  if (registration_) registration_->Stop();
  keeper_->HandOver();
  ::close(state_lock_.fd);
  state_lock_.fd = -1;
}

absl::StatusOr<int> ProxyServer::ResumeWriting() {
  absl::StatusOr<int> fd = LockFile(JoinPath(config_.state_dir, "lock"), absl::Seconds(5));
  if (!fd.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the state directory is still locked: ", fd.status().message()));
  }
  state_lock_.fd = *fd;
  // Whatever the new one wrote (the Allocates it answered) is read back.
  absl::StatusOr<state::State> loaded = keeper_->TakeBack();
  if (!loaded.ok()) {
    ::close(state_lock_.fd);
    state_lock_.fd = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the state again: ", loaded.status().message()));
  }
  if (registration_) {
    if (absl::Status s = registration_->Start(); !s.ok()) {
      LOG(ERROR) << "handoff: taking the state back: " << s.message()
                 << "; plugins cannot register until this is fixed";
    }
  }
  for (ServedResource* e : table_.All()) e->resource->KeepHealthOnLoss(false);
  if (reconciler_) reconciler_->Start();
  // The kubelet may have switched to the new one's sockets: every
  // resource registers again (Registrar::Resume: how, depends on whether
  // the new one had registered).
  const std::string marker = SuccessorRegisteredMarker();
  const bool successor_registered = PathExists(marker);
  ::unlink(marker.c_str());
  side_->Resume(successor_registered);
  saver_->Forget();
  if (cordon_book_) {
    // The new one may have cordoned or uncordoned meanwhile.
    if (absl::Status s = cordon_book_->Reload(); !s.ok()) {
      LOG(ERROR) << "handoff: taking the state back: " << s.message()
                 << "; the cordons are kept as they were before the handoff";
    }
    StartControl();
  }
  Wake();
  return loaded->allocations_size();
}

void ProxyServer::GiveStateBack(const std::string& why) {
  if (keeper_) keeper_->HandOver();
  if (state_lock_.fd >= 0) {
    ::close(state_lock_.fd);
    state_lock_.fd = -1;
  }
  takeover_->HandBack(why);
}

bool ProxyServer::WaitForTakeover(absl::Duration timeout) {
  return takeover_ != nullptr && takeover_->WaitForDone(timeout);
}

}  // namespace dpproxy
