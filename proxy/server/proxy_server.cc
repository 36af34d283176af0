#include "proxy/server/proxy_server.h"

#include <malloc.h>
#include <unistd.h>

#include <glog/logging.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "backends/connect.h"
#include "proxy/config/config_file.h"
#include "proxy/server/held_elsewhere.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

// After a handoff, how long a call the kubelet chose this dpproxy for just
// before it moved to the new one may take to arrive: the kubelet picks the
// endpoint and sends at once, so a few milliseconds, with room to spare.
constexpr absl::Duration kHandoffQuiet = absl::Milliseconds(250);

// After a start on a damaged state: how long the checkpoint passes learn
// back what the kubelet lists and the journal lacks.
constexpr absl::Duration kLearnBackWindow = absl::Minutes(10);

namespace {

// Registrations and static connects in parallel; a fixed number, whatever
// the resource count.
constexpr int kWorkers = 4;

}  // namespace

ProxyServer::ProxyServer(ProxyConfig config)
    : config_(std::move(config)), live_config_(config_) {}

ProxyServer::~ProxyServer() { Shutdown(); }

ProxyServer::LockFd::~LockFd() {
  if (fd >= 0) ::close(fd);
}


std::map<std::string, int64_t> ProxyServer::RegistrationRejections() {
  return registration_ ? registration_->Rejections() : std::map<std::string, int64_t>();
}

std::string ProxyServer::backend_registration_socket() const {
  return JoinPath(config_.plugin_dir, kKubeletSocketName);
}

absl::Status ProxyServer::Start() {
  DPP_RETURN_IF_ERROR(ValidateConfig(config_));
  {
    absl::MutexLock lock(&mu_);
    if (running_) return absl::OkStatus();
    running_ = true;
  }
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = false;
  }
  LOG(INFO) << "dpproxy starting: kubelet root " << config_.kubelet.kubelet_root
            << ", plugins register at " << backend_registration_socket();
  events_.Emit("proxy_starting", {{"kubelet_root", config_.kubelet.kubelet_root},
                                  {"plugin_socket", backend_registration_socket()}});
  // Registrations run in parallel, never on the housekeeping thread: a
  // 1.25+ kubelet's 10 s dial must not hold up another resource, a socket
  // that must be served again, or the hold and restore timers.
  workers_ = std::make_unique<WorkQueue>(kWorkers);
  registrar_ = std::make_unique<Registrar>(config_.kubelet, &events_, workers_.get(),
                                           [this] { Wake(); });
  registrar_->SetTelemetry(&telemetry_);
  // State first: remembered resources are served and registered before any
  // backend is back.
  if (!config_.state_dir.empty()) {
    absl::Status s = MakeDirs(config_.state_dir);
    if (s.ok()) s = CheckOwnDirectory(config_.state_dir);
    if (s.ok() && state_lock_.fd < 0) {
      const std::string lock_path = JoinPath(config_.state_dir, "lock");
      absl::StatusOr<int> fd = LockFile(
          lock_path, config_.takeover ? absl::ZeroDuration() : config_.state_lock_wait);
      if (!fd.ok() && config_.takeover) {
        // Held: the running dpproxy hands the state over, then unlocks.
        takeover_ = std::make_unique<Takeover>(
            config_.state_dir, config_.kubelet.backend_timeout + absl::Seconds(10), &events_);
        s = takeover_->AskToRelease();
        if (s.ok()) socket_generation_ = takeover_->socket_generation();
        if (s.ok()) fd = LockFile(lock_path, config_.state_lock_wait);
      }
      if (fd.ok()) {
        state_lock_.fd = *fd;
      } else {
        s = absl::FailedPreconditionError(absl::StrCat(
            fd.status().message(),
            ": another dpproxy is using this state directory, and two must never share one "
            "(their journals would interleave); stop it, or give this one its own "
            "--state_dir"));
      }
    }
    if (s.ok()) {
      keeper_ = std::make_unique<StateKeeper>(JoinPath(config_.state_dir, "state.pb"), &events_);
      keeper_->SetSyncObserver([this](absl::Duration d) { telemetry_.ObserveJournalSync(d); });
      s = RestoreState();
    }
    if (s.ok() && !config_.dra.enabled) {
      // A later dpproxy may take over from this one (--takeover).
      handover_ = std::make_unique<Handover>(
          Handover::Options{config_.state_dir, socket_generation_, config_.handoff_timeout,
                            shared_listener_fd_},
          static_cast<Handover::Host*>(this), &events_, [this] {
            if (handed_over_hook_) handed_over_hook_();
          });
      handover_->Serve();
    }
    if (!s.ok()) {
      start_error_ = absl::StrCat("state directory ", config_.state_dir, ": ", s.message());
      Shutdown();
      return absl::FailedPreconditionError(start_error_);
    }
    // Device-plugin allocations only: DRA mode has none (its claims are
    // the kubelet's to end, with NodeUnprepareResources).
    if (!config_.dra.enabled) {
      reconciler_ = std::make_unique<Reconciler>(
          Reconciler::Options{config_.kubelet, config_.reconcile_interval,
                              config_.reconcile_grace, config_.reconcile_start_grace},
          keeper_.get(), &events_, [this] { Wake(); });
      if (keeper_->damaged_at_load()) {
        // The kubelet's checkpoint still lists what the damaged state
        // lost: learned back for the resources served meanwhile (their
        // plugins register within moments of a start).
        reconciler_->LearnBack(kLearnBackWindow, [this](const std::string& resource) {
          absl::MutexLock lock(&mu_);
          return entries_.count(resource) > 0;
        });
      }
    }
  }
  BackendRegistrationServer::Options reg_options{config_.plugin_dir, config_.dial_timeout,
                                                 config_.backend_max_list_bytes};
  if (!config_.socket_group.empty()) reg_options.socket_gid = *ResolveGroup(config_.socket_group);
  registration_ = std::make_unique<BackendRegistrationServer>(
      reg_options,
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); }, &events_);
  if (absl::Status s = registration_->Start(); !s.ok()) {
    start_error_ = std::string(s.message());
    Shutdown();
    return s;
  }
  for (const StaticBackendConfig& sb : config_.static_backends) {
    Entry* e = EnsureEntry(ServedName(sb.resource));
    absl::MutexLock lock(&mu_);
    e->static_config = sb;
    e->static_backend = true;
  }
  if (config_.dra.enabled) {
    dra_ = std::make_unique<DraSide>(
        DraSide::Options{config_.dra, config_.kubelet.kubelet_root, config_.state_dir,
                         keeper_.get(), config_.kubelet.backend_timeout,
                         config_.api_max_body_bytes},
        [this] {
          std::vector<Allocator*> out;
          for (Entry* e : Entries()) out.push_back(e->allocator.get());
          return out;
        },
        &events_, &losses_);
    if (absl::Status s = dra_->Start(); !s.ok()) {
      start_error_ = std::string(s.message());
      Shutdown();
      return s;
    }
  }
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  saver_ = std::thread([this] { SaverLoop(); });
  if (reconciler_) {
    checkpoint_ = std::thread([this] { CheckpointLoop(); });
    reconciler_->Start();
  }
  const std::string watch_dir =
      config_.kubelet.registration == KubeletRegistration::kPluginWatcher
          ? JoinPath(config_.kubelet.kubelet_root, "plugins_registry")
          : DevicePluginDir(config_.kubelet);
  watcher_ = std::make_unique<DirWatcher>(watch_dir, [this](const DirWatcher::Event& e) {
    if (e.kind != DirWatcher::Event::kTick) Wake();
  });
  if (absl::Status s = watcher_->Start(); !s.ok()) {
    start_error_ = std::string(s.message());
    Shutdown();
    return s;
  }
  Wake();
  events_.Emit("proxy_started", {});
  if (taking_over()) {
    takeover_->StartCompleting(
        {[this] {
           std::vector<KubeletEndpoint*> out;
           for (Entry* e : Entries()) {
             if (e->endpoint) out.push_back(e->endpoint.get());
           }
           return out;
         },
         registrar_.get(), [this] { return stopping(); }, before_finish_hook_});
  }
  return absl::OkStatus();
}

void ProxyServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
  }
  LOG(INFO) << "dpproxy shutting down";
  if (handover_) handover_->StopServing();
  if (watcher_) watcher_->Stop();
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = true;
  }
  if (takeover_) takeover_->Join();
  if (housekeeping_.joinable()) housekeeping_.join();
  if (saver_.joinable()) saver_.join();
  if (checkpoint_.joinable()) checkpoint_.join();
  if (dra_) dra_->Stop();
  if (reconciler_) reconciler_->Stop();
  if (registration_) registration_->Stop();
  std::map<std::string, std::unique_ptr<Entry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries.swap(entries_);
  }
  if (released()) {
    // Handed over, and the kubelet has moved to the new dpproxy. A call it
    // sent here just before may still be on its way: wait until the
    // kubelet ends its streams here (1.9 stops a replaced endpoint; later
    // kubelets keep it until the plugin ends it, so at most
    // kHandoffQuiet), then until the Allocates forwarded to the new
    // dpproxy have their answers, and only then close the sockets.
    const absl::Time quiet_by = absl::Now() + kHandoffQuiet;
    for (auto& [name, e] : entries) {
      if (!e->endpoint) continue;
      (void)e->endpoint->WaitForKubeletGone(std::max(absl::ZeroDuration(), quiet_by - absl::Now()));
    }
    const absl::Duration wait = config_.kubelet.backend_timeout + absl::Seconds(1);
    for (auto& [name, e] : entries) {
      if (e->endpoint && !e->endpoint->WaitForAllocatesServed(wait)) {
        LOG(WARNING) << "resource " << name << ": a forwarded Allocate is still in progress "
                     << "after " << absl::FormatDuration(wait) << "; stopping anyway";
      }
    }
  }
  const bool giving_back = taking_over() && !takeover_->finish_sent();
  if (!released() && !giving_back) {
    // Stopping for good: an endpoint the kubelet no longer lists by name
    // registers once more, so that its end turns the devices unhealthy.
    for (auto& [name, e] : entries) {
      if (e->endpoint) e->endpoint->RelistBeforeStop();
    }
  }
  // Cancel Register calls in flight, then wait for the workers: their jobs
  // point at the entries.
  for (auto& [name, e] : entries) {
    if (e->endpoint) e->endpoint->Stop();
  }
  if (workers_) workers_->Shutdown();
  registrar_.reset();
  for (auto& [name, e] : entries) {
    if (e->endpoint) e->endpoint->Stop();
    e->resource->Shutdown();
  }
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

std::vector<ProxyServer::Entry*> ProxyServer::Entries() {
  std::vector<Entry*> out;
  absl::MutexLock lock(&mu_);
  for (auto& [name, e] : entries_) out.push_back(e.get());
  return out;
}

ProxyServer::Entry* ProxyServer::EnsureEntry(const std::string& name,
                                             std::shared_ptr<Backend> attach) {
  absl::ReleasableMutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    Entry* found = it->second.get();
    if (attach) {
      found->backend_resource = attach->resource();
      found->static_removed = false;  // a plugin serves it again
    }
    lock.Release();
    if (attach) {
      // What it must not show free is known before its first list.
      ++served_version_;
      ApplyQuarantine();
      (void)found->resource->AttachBackend(std::move(attach));
    }
    return found;
  }
  auto e = std::make_unique<Entry>();
  if (attach) e->backend_resource = attach->resource();
  // As a reload left them.
  ResourcePolicy policy = config_.policy;
  policy.loss_policy = live_config_.policy.loss_policy;
  policy.hold = live_config_.policy.hold;
  auto m = live_config_.id_maps.find(name);
  if (m != live_config_.id_maps.end()) policy.id_map = m->second;
  policy.compact_ids = live_config_.compact_ids.count(name) > 0;
  ResourceHooks hooks;
  hooks.on_change = [this] { Wake(); };
  StateKeeper* keeper = keeper_.get();
  hooks.is_allocated = [keeper, name](const std::string& id) {
    return keeper != nullptr && keeper->HoldsDevice(name, id);
  };
  if (reconciler_) {
    Reconciler* reconciler = reconciler_.get();
    hooks.check_forgotten = [reconciler, name](
                                const std::vector<std::vector<std::string>>& per_container,
                                bool readmission) {
      return reconciler->CheckForgotten(name, per_container, readmission);
    };
    hooks.still_forgotten = [reconciler, name](const std::vector<std::string>& ids) {
      return reconciler->StillForgotten(name, ids);
    };
    hooks.readmission_pick = [reconciler, name](int size, const std::set<std::string>& available) {
      return reconciler->ReadmissionPick(name, size, available);
    };
  }
  e->resource = std::make_unique<Resource>(name, policy, &events_, std::move(hooks));
  KubeletSideOptions kubelet = config_.kubelet;
  kubelet.socket_generation = socket_generation_;
  e->allocator = std::make_unique<Allocator>(e->resource.get(), keeper_.get(), &telemetry_);
  // In DRA mode the kubelet learns of devices from ResourceSlices: no
  // device-plugin socket (it would win over DRA).
  if (!config_.dra.enabled) {
    e->endpoint = std::make_unique<KubeletEndpoint>(e->resource.get(), kubelet, &losses_,
                                                    &events_, e->allocator.get(), &telemetry_);
    // As a reload left them.
    e->endpoint->SetCallSettings(live_config_.kubelet.backend_timeout,
                                 live_config_.kubelet.cdi_annotations);
  }
  Entry* raw = e.get();
  entries_[name] = std::move(e);
  lock.Release();
  ++served_version_;
  if (attach) {
    ApplyQuarantine();
    (void)raw->resource->AttachBackend(std::move(attach));
  }
  if (!raw->endpoint) {
    LOG(INFO) << "resource " << name << ": published as DRA devices of driver "
              << config_.dra.driver << " (no device-plugin socket for the kubelet)";
  } else {
    registrar_->Add(raw->resource.get(), raw->endpoint.get());
    LOG(INFO) << "resource " << name << ": kubelet-facing socket " << raw->endpoint->socket_path();
  }
  Wake();
  return raw;
}

absl::Status ProxyServer::AttachBackend(std::shared_ptr<Backend> backend) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("dpproxy is stopping");
  }
  const std::string name = ServedName(backend->resource());
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

std::string ProxyServer::ServedName(const std::string& backend_resource) {
  absl::MutexLock lock(&mu_);
  return KubeletResourceName(live_config_, backend_resource);
}

void ProxyServer::Wake() {
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
  if (dra_) dra_->Wake();
}

void ProxyServer::HousekeepingLoop() {
  for (;;) {
    // Once a second at most without a wake-up (the stat fallback), sooner
    // when a registration is due for a retry.
    const absl::Duration wait =
        std::min(absl::Seconds(1), std::max(absl::ZeroDuration(), next_retry_ - absl::Now()));
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool {
        return wake_ || stop_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (stop_) return;
      wake_ = false;
    }
    const absl::Time now = absl::Now();
    TickResources(now);
    // Before a new resource is registered: its first list already shows
    // what it must not hand out.
    ApplyQuarantine();
    const Registrar::PassResult pass = registrar_->Pass(now);
    next_retry_ = pass.next_retry;
    std::optional<Reconciler::RestartSeen> seen;
    if (reconciler_ && pass.kubelet_restarted) {
      seen = reconciler_->NoteKubeletRestart(*pass.kubelet_restarted);
    }
    if (handover_) handover_->CheckProgress(now);
    {
      absl::MutexLock lock(&wake_mu_);
      save_wake_ = true;
      checkpoint_wake_ = true;
      if (seen.has_value()) restarts_seen_.push_back(*std::move(seen));
    }
    ++housekeeping_passes_;
    housekeeping_at_ns_ = absl::ToUnixNanos(absl::Now());
    if (housekeeping_hook_) housekeeping_hook_();
  }
}

std::vector<HealthCheck> ProxyServer::Liveness() {
  constexpr absl::Duration kStuck = absl::Seconds(30);
  HealthCheck c;
  c.name = "housekeeping";
  const int64_t at = housekeeping_at_ns_.load();
  const absl::Duration since = absl::Now() - absl::FromUnixNanos(at);
  c.ok = at != 0 && since < kStuck;
  if (!c.ok) {
    c.reason = at == 0 ? "the housekeeping thread has not completed a pass"
                       : absl::StrCat("the housekeeping thread last completed a pass ",
                                      absl::FormatDuration(absl::Trunc(since, absl::Seconds(1))),
                                      " ago (it runs at least once a second)");
  }
  return {c};
}

std::vector<HealthCheck> ProxyServer::Readiness() {
  std::vector<HealthCheck> checks = registrar_->RegistrationChecks();
  if (dra_) {
    HealthCheck c;
    c.name = "dra-registered";
    c.ok = dra_->registered();
    if (!c.ok) {
      c.reason = absl::StrCat("the kubelet has not registered DRA driver ", config_.dra.driver,
                              " (its plugin watcher reads ", dra_->registration_socket(),
                              ")");
    }
    checks.push_back(std::move(c));
    HealthCheck api;
    api.name = "dra-api-server";
    api.reason = dra_->api_error();
    api.ok = api.reason.empty();
    checks.push_back(std::move(api));
  }
  // A resource whose plugin's last list was refused: named until a list
  // is taken.
  for (Entry* e : Entries()) {
    std::string refused = e->resource->list_refused();
    if (refused.empty()) continue;
    checks.push_back({absl::StrCat("device-list:", e->resource->name()), false,
                      absl::StrCat("the plugin's device list was refused: ", refused)});
  }
  if (keeper_) {
    HealthCheck c;
    c.name = "state-writable";
    c.ok = keeper_->writable();
    if (!c.ok) {
      c.reason = absl::StrCat("the last write to ", keeper_->path(),
                              " failed: ", keeper_->last_write_error(),
                              "; an Allocate is refused when its journal record cannot be written");
    }
    checks.push_back(std::move(c));
  }
  return checks;
}

// The kubelet-checkpoint checks cost O(allocations) and the kubelet
// rewrites its checkpoint after every allocation: they run here, so that
// detecting and serving a kubelet restart never waits behind one. Changes
// that arrive during a pass are taken by the next one, together.
void ProxyServer::CheckpointLoop() {
  for (;;) {
    std::vector<Reconciler::RestartSeen> restarts;
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool {
        return checkpoint_wake_ || stop_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_) return;
      checkpoint_wake_ = false;
      restarts.swap(restarts_seen_);
    }
    for (const Reconciler::RestartSeen& seen : restarts) reconciler_->OnKubeletRestart(seen);
    reconciler_->CheckCheckpoint();
  }
}

// The resources and the status file are saved here, not on the
// housekeeping thread: their writes wait for the disk, and serving and
// registering after a kubelet restart must never wait behind them.
void ProxyServer::SaverLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool {
        return save_wake_ || stop_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_) return;
      save_wake_ = false;
    }
    absl::MutexLock saving(&saver_mu_);
    if (released()) continue;  // the new dpproxy's to write now
    // Nothing below costs more than O(resources) unless something changed.
    const std::string fingerprint = Fingerprint();
    const bool persisted = PersistResources(fingerprint);
    if (WriteStatusIfChanged(fingerprint) || persisted) {
      // Those build and drop copies as large as every device list (the
      // saved resources, the status JSON); glibc keeps freed memory in its
      // arenas, so hand it back, once per change, not per tick.
      ::malloc_trim(0);
    }
    ++save_passes_;
  }
}

void ProxyServer::TickResources(absl::Time now) {
  for (Entry* e : Entries()) {
    e->resource->Tick(now);
    if (!e->static_backend.load() || e->resource->backend_connected()) continue;
    {
      absl::MutexLock lock(&mu_);
      if (e->connecting) continue;
      e->connecting = true;
    }
    workers_->Submit([this, e] {
      ConnectStatic(e);
      absl::MutexLock lock(&mu_);
      e->connecting = false;
    });
  }
}

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

void ProxyServer::ApplyQuarantine() {
  if (!keeper_) return;
  absl::MutexLock guard(&quarantine_mu_);
  // DRA mode has no reconciler: nothing forgotten, the rest applies.
  const uint64_t version = reconciler_ ? reconciler_->quarantine_version() : 0;
  const uint64_t released = keeper_->released_version();
  const uint64_t served = served_version_.load();
  if (version == applied_quarantine_ && released == applied_released_ &&
      served == applied_served_) {
    return;
  }
  applied_quarantine_ = version;
  applied_released_ = released;
  applied_served_ = served;
  std::vector<ForgottenStatus> rows;
  // Held by containers the kubelet forgot: real health, steered around.
  const std::map<std::string, std::map<std::string, std::string>> forgotten =
      reconciler_ ? reconciler_->ForgottenDevices(&rows)
                  : std::map<std::string, std::map<std::string, std::string>>();
  // Shown Unhealthy: held under another name or ID.
  std::map<std::string, std::set<std::string>> devices;
  // A renamed or re-mapped resource while pods held its devices: the
  // kubelet knows those allocations by their old name and ID only.
  std::map<std::string, ServedAs> served_as;
  std::map<std::string, std::string> backend_of;
  std::map<std::string, std::string> renamed;  // old name -> name now
  std::set<std::string> removed;               // static backends removed
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : entries_) {
      if (!e->backend_resource.empty()) backend_of[name] = e->backend_resource;
      if (e->static_removed) {
        removed.insert(name);
        continue;
      }
      if (e->backend_resource.empty()) continue;
      const std::string now = KubeletResourceName(live_config_, e->backend_resource);
      if (now != name) {
        renamed[name] = now;
        continue;
      }
      Resource* r = e->resource.get();
      ServedAs as{name, nullptr};
      if (r->maps_ids()) as.kubelet_id = [r](const std::string& id) { return r->ToKubeletId(id); };
      served_as[e->backend_resource] = std::move(as);
    }
  }
  // Read in place: at 50,000 allocations a copy would cost more than the
  // pass, which skips every record made under the name and IDs shown now.
  HeldElsewhereFinder finder(served_as, backend_of);
  keeper_->ForEachAllocation([&finder](const state::Allocation& a) { finder.Add(a); });
  const auto held = finder.Take();
  std::vector<HeldElsewhereStatus> held_rows;
  for (const auto& [resource, by_id] : held) {
    for (const auto& [id, h] : by_id) {
      devices[resource].insert(id);
      held_rows.push_back(HeldElsewhereStatus{resource, id, h.held_as_resource, h.held_as_device,
                                              h.allocation, h.pod});
    }
  }
  // The resources first: once the status shows a hold, Allocates see it.
  for (Entry* e : Entries()) {
    const std::string& name = e->resource->name();
    if (renamed.count(name) > 0 || removed.count(name) > 0) {
      // No new pod gets a device under a name no longer served.
      const Resource::Snapshot snap = e->resource->Current();
      std::set<std::string> all;
      for (int i = 0; i < snap.list->size(); ++i) all.insert(std::string(snap.list->device(i).id));
      e->resource->SetShownUnhealthy(std::move(all));
      e->resource->SetForgotten({});
      continue;
    }
    auto it = devices.find(name);
    e->resource->SetShownUnhealthy(it == devices.end() ? std::set<std::string>() : it->second);
    auto f = forgotten.find(name);
    e->resource->SetForgotten(f == forgotten.end() ? Resource::Forgotten() : f->second);
  }
  {
    absl::MutexLock lock(&mu_);
    forgotten_rows_ = std::move(rows);
    ++rows_version_;  // the status shows them: written again
    if (held_rows.size() != held_elsewhere_rows_.size()) {
      LOG(WARNING) << held_rows.size()
                   << " device(s) are held under another name or ID than they are served as "
                      "now (renames, ID maps or compact IDs changed while pods held them); "
                      "reported Unhealthy until their pods are gone";
      events_.Emit("devices_held_elsewhere", {{"devices", held_rows.size()}});
    }
    held_elsewhere_rows_ = std::move(held_rows);
    renamed_ = renamed;
  }
}

absl::Status ProxyServer::RestoreState() {
  absl::StatusOr<state::State> loaded = keeper_->Load();
  if (!loaded.ok()) return loaded.status();
  const state::State& st = *loaded;
  const absl::Duration trust =
      config_.restore_policy == RestorePolicy::kTrust ? config_.restore_hold
                                                      : absl::ZeroDuration();
  std::set<std::string> holding;  // names allocations hold devices under
  for (const state::Allocation& a : st.allocations()) holding.insert(a.resource());
  for (const state::Resource& r : st.resources()) {
    const std::string& plugin = r.backend().backend_resource();
    const std::string now = plugin.empty() ? r.name() : ServedName(plugin);
    // A static backend the configuration no longer has.
    bool static_removed = r.backend().static_backend();
    for (const StaticBackendConfig& sb : config_.static_backends) {
      if (ServedName(sb.resource) == r.name()) static_removed = false;
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
    Entry* e = EnsureEntry(r.name());
    e->resource->Restore(DeviceList::FromDevices({r.devices().begin(), r.devices().end()}), trust,
                         r.backend().endpoint(), r.backend().api_version());
    {
      absl::MutexLock lock(&mu_);
      e->restored_kubelet_api = r.kubelet_api();
      e->backend_resource = plugin;
      e->static_removed = static_removed;
    }
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

std::string ProxyServer::Fingerprint() {
  std::string fp;
  std::vector<Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : entries_) {
      entries.push_back(e.get());
      // Whether a static backend fails, and why; not its count of
      // attempts (one a second: the status file would be written as often).
      absl::StrAppend(&fp, name, "|", e->restored_kubelet_api, "|", e->static_backend.load(), "|",
                      e->static_error, "|");
    }
  }
  // The rows derived from the keeper's state (forgotten, held elsewhere),
  // as last applied: the status is written again once they are.
  absl::StrAppend(&fp, rows_version_.load(), "|");
  if (reconciler_) {
    absl::StrAppend(&fp, reconciler_->devices_held_twice(), "|",
                    reconciler_->forgotten_released(), "|",
                    reconciler_->allocations_recovered(), "|");
  }
  for (Entry* e : entries) {
    const KubeletEndpoint::SteeringCounts steering = SteeringOf(e);
    absl::StrAppend(&fp, e->resource->changes(), "|", e->endpoint ? e->endpoint->negotiated() : "", "|",
                    steering.avoided, "|", steering.held_named, "|", steering.refused, "|");
  }
  absl::StrAppend(&fp, losses_.Total(), "|");
  if (dra_) {
    absl::StrAppend(&fp, dra_->registered(), "|", dra_->api_version(), "|", dra_->api_error(),
                    "|", dra_->prepared_claims(), "|");
  }
  if (keeper_) {
    absl::StrAppend(&fp, keeper_->AllocationCount(), "|", keeper_->save_failures(), "|",
                    keeper_->writable(), "|", keeper_->quarantine_version());
  }
  return fp;
}

bool ProxyServer::PersistResources(const std::string& fingerprint) {
  if (!keeper_) return false;
  // Saved resources change only with what the fingerprint counts; a failed
  // save counts a failure, which changes it, so it is tried again.
  if (fingerprint == persisted_fingerprint_) return false;
  // Entries() is in order of name, as the keeper wants them. Each list is
  // serialized straight from the published one: no copy of every device.
  std::vector<std::string> out;
  for (Entry* e : Entries()) {
    state::Resource r;
    r.set_name(e->resource->name());
    std::string api = e->endpoint ? e->endpoint->negotiated() : std::string();
    if (api.empty()) {
      absl::MutexLock lock(&mu_);
      api = e->restored_kubelet_api;
    }
    r.set_kubelet_api(api);
    auto [endpoint, backend_api] = e->resource->last_backend();
    r.mutable_backend()->set_endpoint(endpoint);
    r.mutable_backend()->set_api_version(backend_api);
    {
      absl::MutexLock lock(&mu_);
      r.mutable_backend()->set_backend_resource(e->backend_resource);
      // A removed one too: the next start knows it is no longer wanted.
      r.mutable_backend()->set_static_backend(e->static_backend.load() || e->static_removed);
    }
    std::string bytes = r.SerializeAsString();
    e->resource->ReportedDevices()->AppendAsField(state::Resource::kDevicesFieldNumber, &bytes);
    out.push_back(std::move(bytes));
  }
  // Failures are logged and counted.
  if (keeper_->SetSerializedResources(std::move(out)).ok()) {
    persisted_fingerprint_ = fingerprint;
  }
  return true;
}

bool ProxyServer::WriteStatusIfChanged(const std::string& fingerprint) {
  if (config_.status_file.empty()) return false;
  // Device health changes are in the file too; housekeeping runs at least
  // once a second, so the file is at most a second behind.
  if (fingerprint == written_fingerprint_) return false;
  // A file that cannot be written is tried again once a minute, not at
  // every change: building it costs a pass over every device.
  const absl::Time now = absl::Now();
  if (status_failing_ && now < status_retry_at_) return false;
  // Built from values at least as new as `fingerprint`: a change after it
  // was taken changes the next one, so nothing is missed.
  const std::string text = StatusFileText(Status());
  if (absl::Status s = WriteFileAtomic(config_.status_file, text, 0640); !s.ok()) {
    LOG(WARNING) << "cannot write the status file " << config_.status_file << ": "
                 << s.message() << "; trying again in a minute";
    if (!status_failing_) {
      events_.Emit("status_write_failed",
                   {{"path", config_.status_file}, {"error", std::string(s.message())}});
    }
    status_failing_ = true;
    status_retry_at_ = now + absl::Minutes(1);
    return true;
  }
  if (status_failing_) {
    LOG(INFO) << "the status file " << config_.status_file << " is written again";
    status_failing_ = false;
  }
  written_fingerprint_ = fingerprint;
  return true;
}

void ProxyServer::ConnectStatic(Entry* e) {
  StaticBackendConfig sb;
  {
    absl::MutexLock lock(&mu_);
    sb = e->static_config;
  }
  absl::StatusOr<ApiVersion> api =
      sb.api ? absl::StatusOr<ApiVersion>(*sb.api) : ProbeBackendApi(sb.endpoint, absl::Milliseconds(500));
  if (!api.ok()) return NoteStaticDial(e, sb, api.status());
  absl::StatusOr<std::shared_ptr<Backend>> b =
      ConnectBackend(sb.resource, sb.endpoint, *api, absl::Milliseconds(500),
                     config_.backend_max_list_bytes);
  NoteStaticDial(e, sb, b.status());
  if (!b.ok()) return;
  if (!e->static_backend.load()) {  // a reload dropped it meanwhile
    (*b)->Stop();
    return;
  }
  (void)AttachBackend(*b);
}

void ProxyServer::NoteStaticDial(Entry* e, const StaticBackendConfig& sb, const absl::Status& s) {
  constexpr absl::Duration kLogEvery = absl::Minutes(1);
  int64_t failures;
  bool log;
  {
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      failures = e->static_failures;
      e->static_failures = 0;
      e->static_error.clear();
      e->static_logged_at = absl::InfinitePast();
      log = failures > 0;
    } else {
      failures = ++e->static_failures;
      e->static_error = std::string(s.message());
      const absl::Time now = absl::Now();
      log = now - e->static_logged_at >= kLogEvery;
      if (log) e->static_logged_at = now;
    }
  }
  if (!log) return;
  if (s.ok()) {
    LOG(INFO) << "static backend " << sb.endpoint << " of " << sb.resource
              << " dialled after " << failures << " failed attempt(s)";
    return;
  }
  LOG(WARNING) << "static backend " << sb.endpoint << " of " << sb.resource
               << " cannot be dialled: " << s.message() << " (" << failures
               << " attempt(s); tried again every second, logged once a minute)";
  if (failures == 1) {
    events_.Emit("static_backend_unreachable", {{"resource", sb.resource},
                                                {"endpoint", sb.endpoint},
                                                {"error", std::string(s.message())}});
  }
}

ProxyServer::ReloadResult ProxyServer::Reload(const ProxyConfig& next) {
  ProxyConfig running;
  {
    absl::MutexLock lock(&mu_);
    running = live_config_;
  }
  ReloadResult result = reloader_.Reload(running, next);
  Wake();
  return result;
}

void ProxyServer::ApplyLossPolicy(const ProxyConfig& next) {
  {
    absl::MutexLock lock(&mu_);
    live_config_.policy.loss_policy = next.policy.loss_policy;
    live_config_.policy.hold = next.policy.hold;
  }
  for (Entry* e : Entries()) e->resource->SetLossPolicy(next.policy.loss_policy, next.policy.hold);
}

void ProxyServer::ApplyCallSettings(const ProxyConfig& next) {
  {
    absl::MutexLock lock(&mu_);
    live_config_.kubelet.backend_timeout = next.kubelet.backend_timeout;
    live_config_.kubelet.cdi_annotations = next.kubelet.cdi_annotations;
    live_config_.dial_timeout = next.dial_timeout;
  }
  for (Entry* e : Entries()) {
    if (e->endpoint) {
      e->endpoint->SetCallSettings(next.kubelet.backend_timeout, next.kubelet.cdi_annotations);
    }
  }
  if (registration_) registration_->SetDialTimeout(next.dial_timeout);
  if (dra_) dra_->SetBackendTimeout(next.kubelet.backend_timeout);
}

void ProxyServer::RemoveStaticBackend(const StaticBackendConfig& b) {
  const std::string name = ServedName(b.resource);
  Entry* removed = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it != entries_.end() && it->second->static_config.endpoint == b.endpoint) {
      removed = it->second.get();
      removed->static_backend = false;
      removed->static_removed = true;
    }
  }
  // Not used any more: its connection ends now, and its devices are
  // shown Unhealthy (ApplyQuarantine) unless it is added back.
  std::shared_ptr<Backend> open = removed ? removed->resource->attached_backend() : nullptr;
  if (open != nullptr && open->endpoint() == b.endpoint) {
    removed->resource->DetachBackend("static backend removed from the configuration");
  }
  LOG(INFO) << "reload: static backend " << b.endpoint << " of " << b.resource
            << " is no longer dialled; " << name << " shows its devices Unhealthy";
  events_.Emit("static_backend_removed", {{"resource", name}, {"endpoint", b.endpoint}});
}

void ProxyServer::AddStaticBackend(const StaticBackendConfig& b) {
  const std::string name = ServedName(b.resource);
  Entry* e = EnsureEntry(name);
  {
    absl::MutexLock lock(&mu_);
    e->static_config = b;
    e->static_backend = true;
    e->static_removed = false;
  }
  LOG(INFO) << "reload: static backend " << b.endpoint << " of " << b.resource
            << " is dialled from now on";
  events_.Emit("static_backend_added", {{"resource", name}, {"endpoint", b.endpoint}});
}

void ProxyServer::StaticBackendsApplied(const ProxyConfig& next) {
  {
    absl::MutexLock lock(&mu_);
    live_config_.static_backends = next.static_backends;
  }
  ++served_version_;
}

namespace {

std::map<std::string, std::string> IdMapOf(const ProxyConfig& c, const std::string& resource) {
  auto it = c.id_maps.find(resource);
  return it == c.id_maps.end() ? std::map<std::string, std::string>() : it->second;
}

}  // namespace

void ProxyServer::ApplyServedNames(const ProxyConfig& next) {
  struct Change {
    Entry* entry;
    std::string to;  // the name served as from now on
    bool ids;        // the same name with other IDs
  };
  std::vector<Change> changes;
  absl::Duration dial_timeout;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : entries_) {
      if (e->backend_resource.empty()) continue;
      if (KubeletResourceName(live_config_, e->backend_resource) != name) continue;  // renamed
      const std::string to = KubeletResourceName(next, e->backend_resource);
      const bool ids = to == name && (IdMapOf(live_config_, name) != IdMapOf(next, name) ||
                                      live_config_.compact_ids.count(name) !=
                                          next.compact_ids.count(name));
      if (to != name || ids) changes.push_back({e.get(), to, ids});
    }
    live_config_.renames = next.renames;
    live_config_.id_maps = next.id_maps;
    live_config_.compact_ids = next.compact_ids;
    dial_timeout = live_config_.dial_timeout;
  }
  for (const Change& c : changes) {
    Resource* r = c.entry->resource.get();
    const std::string& from = r->name();
    const bool dialled_by_dpproxy = c.entry->static_backend.load();
    if (c.ids) {
      r->SetIdPolicy(IdMapOf(next, from), next.compact_ids.count(from) > 0);
      LOG(INFO) << "reload: resource " << from << " shows the kubelet other device IDs from "
                << "its plugin's next list (ID map or compact IDs changed)";
      events_.Emit("resource_ids_changed", {{"resource", from}});
    } else {
      LOG(INFO) << "reload: resource " << from << " is served as " << c.to
                << " from now on; under " << from << " its devices are shown Unhealthy";
      events_.Emit("resource_renamed", {{"resource", from}, {"served_as", c.to}});
      Entry* to = EnsureEntry(c.to);
      if (dialled_by_dpproxy) {
        absl::MutexLock lock(&mu_);
        c.entry->static_backend = false;
        to->static_config = c.entry->static_config;
        to->static_backend = true;
      }
    }
    // The plugin's next list must come to the new name, or with the new
    // IDs, and complete: it is dialled again, as a restart would.
    std::shared_ptr<Backend> b = r->backend();
    if (b == nullptr) continue;  // its next registration comes as configured now
    if (!c.ids || dialled_by_dpproxy) {
      r->DetachBackend(c.ids ? "dialled again for its new device IDs"
                             : absl::StrCat("served as ", c.to, " from now on"));
    }
    if (dialled_by_dpproxy) continue;  // the static backends' timer dials it
    const std::string plugin = b->resource(), endpoint = b->endpoint();
    const ApiVersion api = b->api();
    const int max_bytes = config_.backend_max_list_bytes;
    workers_->Submit([this, plugin, endpoint, api, dial_timeout, max_bytes] {
      absl::StatusOr<std::shared_ptr<Backend>> nb =
          ConnectBackend(plugin, endpoint, api, dial_timeout, max_bytes);
      if (!nb.ok()) {
        LOG(WARNING) << "reload: cannot dial " << endpoint << " again for " << plugin << ": "
                     << nb.status().message() << "; its next registration brings it back";
        return;
      }
      (void)AttachBackend(*nb);
    });
  }
  ++served_version_;  // renamed names and new IDs are known: shown at once
  Wake();
}

std::string ProxyServer::KubeletSocketOf(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(resource);
  return it == entries_.end() || !it->second->endpoint ? ""
                                                         : it->second->endpoint->socket_path();
}

ProxyStatus ProxyServer::Status(bool with_devices) {
  if (with_devices) ++status_builds_;
  ProxyStatus st;
  st.pid = ::getpid();
  if (dra_) {
    st.dra = DraStatus{config_.dra.driver,       config_.dra.node_name,
                       dra_->api_version(),      dra_->registration_socket(),
                       dra_->registered(),       dra_->api_error(),
                       dra_->prepared_claims()};
  }
  st.kubelet_root = config_.kubelet.kubelet_root;
  st.plugin_socket = backend_registration_socket();
  for (Entry* e : Entries()) {
    const Resource::Snapshot snap = e->resource->Current();
    const v1beta1::DevicePluginOptions opts = e->resource->options();
    const auto [endpoint, backend_api] = e->resource->last_backend();
    ResourceStatus r;
    r.resource = e->resource->name();
    // In DRA mode the kubelet sees DRA devices, not a device plugin: the
    // resource is served once the kubelet registered the driver.
    if (dra_) {
      r.kubelet_api = dra_->registered()
                          ? absl::StrCat("dra (", config_.dra.driver, ")")
                          : std::string();
    } else {
      r.kubelet_api = e->endpoint->negotiated();
    }
    // In DRA mode there is no device-plugin socket to name.
    r.kubelet_socket = e->endpoint ? e->endpoint->socket_path() : std::string();
    r.backend_connected = e->resource->backend_connected();
    r.backend_api = backend_api;
    r.backend_endpoint = endpoint;
    r.static_backend = e->static_backend.load();
    r.pre_start_required = opts.pre_start_required();
    r.get_preferred_allocation_available = opts.get_preferred_allocation_available();
    r.devices_total = snap.list->size();
    r.devices_healthy = snap.list->healthy();
    r.device_list_bytes = static_cast<int64_t>(snap.list->bytes());
    r.device_list_too_large = snap.list->bytes() > kKubeletMaxListBytes;
    r.device_list_refused = e->resource->list_refused();
    r.device_ids_mapped = e->resource->ids_mapped();
    const KubeletEndpoint::SteeringCounts steering = SteeringOf(e);
    r.forgotten_avoided = steering.avoided;
    r.forgotten_named = steering.held_named;
    r.forgotten_refused = steering.refused;
    if (with_devices) r.device_list = snap.list;  // shared, not copied
    st.resources.push_back(std::move(r));
  }
  st.lossy_translations = losses_.Snapshot();
  if (keeper_) {
    StateStatus s;
    s.path = keeper_->path();
    s.allocations = keeper_->AllocationCount();
    s.save_failures = keeper_->save_failures();
    s.writable = keeper_->writable();
    if (!s.writable) s.last_write_error = keeper_->last_write_error();
    s.journal_writes = keeper_->journal_writes();
    s.journal_records = keeper_->journal_records();
    s.compactions = keeper_->compactions();
    s.journal_bytes = keeper_->journal_bytes();
    s.snapshot_bytes = keeper_->snapshot_bytes();
    st.state = std::move(s);
  }
  {
    absl::MutexLock lock(&mu_);
    st.forgotten = forgotten_rows_;
    st.held_elsewhere = held_elsewhere_rows_;
    for (ResourceStatus& r : st.resources) {
      auto it = renamed_.find(r.resource);
      if (it != renamed_.end()) r.now_served_as = it->second;
      // From the entry, not from the last ApplyQuarantine: a reload that
      // removed the static backend shows at once.
      auto e = entries_.find(r.resource);
      r.removed = e != entries_.end() && e->second->static_removed;
      if (e != entries_.end() && e->second->static_backend.load()) {
        r.backend_error = e->second->static_error;
        r.backend_dial_failures = e->second->static_failures;
      }
    }
  }
  if (reconciler_) {
    st.devices_held_twice = reconciler_->devices_held_twice();
    st.forgotten_released = reconciler_->forgotten_released();
    st.allocations_recovered = reconciler_->allocations_recovered();
  }
  st.registrations_rejected = RegistrationRejections();
  return st;
}

// --- DRA mode -------------------------------------------------------------------

}  // namespace dpproxy

// --- Handoff ---------------------------------------------------------------------

namespace dpproxy {

KubeletEndpoint::SteeringCounts ProxyServer::SteeringOf(Entry* e) {
  if (e->endpoint) return e->endpoint->steering();
  KubeletEndpoint::SteeringCounts c;
  c.refused = e->allocator->refused_held();
  return c;
}

std::vector<KubeletEndpoint*> ProxyServer::HandoverEndpoints() {
  std::vector<KubeletEndpoint*> out;
  for (Entry* e : Entries()) {
    if (e->endpoint) out.push_back(e->endpoint.get());
  }
  return out;
}

absl::Duration ProxyServer::AllocateWait() {
  absl::MutexLock lock(&mu_);
  return live_config_.kubelet.backend_timeout + absl::Seconds(1);
}

void ProxyServer::StopWriting() {
  registrar_->Hold();
  for (Entry* e : Entries()) e->resource->KeepHealthOnLoss();
  if (reconciler_) reconciler_->Stop();
  {
    absl::MutexLock saving(&saver_mu_);
    persisted_fingerprint_.clear();  // save the newest lists, changed or not
    (void)PersistResources(Fingerprint());
  }
  // The plugins' socket is the new one's to serve (and a server that
  // stopped later would unlink it under the new one).
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
  for (Entry* e : Entries()) e->resource->KeepHealthOnLoss(false);
  if (reconciler_) reconciler_->Start();
  // The kubelet may have switched to the new one's sockets: every
  // resource registers again.
  registrar_->Resume();
  {
    absl::MutexLock saving(&saver_mu_);
    persisted_fingerprint_.clear();
    written_fingerprint_.clear();
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

bool ProxyServer::stopping() {
  absl::MutexLock lock(&wake_mu_);
  return stop_;
}

bool ProxyServer::WaitForTakeover(absl::Duration timeout) {
  return takeover_ != nullptr && takeover_->WaitForDone(timeout);
}

}  // namespace dpproxy
