#include "proxy/server/proxy_server.h"

#include <unistd.h>

#include <grpcpp/client_context.h>
#include <glog/logging.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/str_join.h"
#include "proto/podresources/api.grpc.pb.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
#include "proxy/util/work_queue.h"
#include "proxy/kubelet/kubelet_checkpoint.h"

namespace dpproxy {
namespace {

// Registrations in parallel; a fixed number, whatever the resource count.
constexpr int kRegistrationWorkers = 4;

}  // namespace

ProxyServer::ProxyServer(ProxyConfig config) : config_(std::move(config)) {}

ProxyServer::~ProxyServer() { Shutdown(); }

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
  LOG(INFO) << "dpproxy starting: kubelet root " << config_.kubelet.kubelet_root
            << ", plugins register at " << backend_registration_socket();
  events_.Emit("proxy_starting", {{"kubelet_root", config_.kubelet.kubelet_root},
                                  {"plugin_socket", backend_registration_socket()}});
  // State first: remembered resources are served and registered before any
  // backend is back.
  if (!config_.state_dir.empty()) {
    absl::Status s = MakeDirs(config_.state_dir);
    if (s.ok()) s = CheckOwnDirectory(config_.state_dir);
    if (s.ok()) {
      keeper_ = std::make_unique<StateKeeper>(JoinPath(config_.state_dir, "state.pb"), &events_);
      s = RestoreState();
    }
    if (!s.ok()) {
      Shutdown();
      return absl::FailedPreconditionError(
          absl::StrCat("state directory ", config_.state_dir, ": ", s.message()));
    }
  }
  BackendRegistrationServer::Options reg_options{config_.plugin_dir, config_.dial_timeout,
                                                 config_.backend_max_list_bytes};
  if (!config_.socket_group.empty()) reg_options.socket_gid = *ResolveGroup(config_.socket_group);
  registration_ = std::make_unique<BackendRegistrationServer>(
      reg_options,
      [this](std::shared_ptr<Backend> b) { return AttachBackend(std::move(b)); }, &events_);
  if (absl::Status s = registration_->Start(); !s.ok()) {
    Shutdown();
    return s;
  }
  for (const StaticBackendConfig& sb : config_.static_backends) {
    std::string name = sb.resource;
    auto r = config_.renames.find(name);
    if (r != config_.renames.end()) name = r->second;
    Entry* e = EnsureEntry(name);
    absl::MutexLock lock(&mu_);
    e->static_backend = true;
    e->static_config = sb;
  }
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = false;
  }
  // Registrations run in parallel, never on the registrar thread: a 1.25+
  // kubelet's 10 s dial must not hold up another resource, a socket that
  // must be served again, or the hold and restore timers.
  workers_ = std::make_unique<WorkQueue>(kRegistrationWorkers);
  registrar_ = std::thread([this] { RegistrarLoop(); });
  if (keeper_ && config_.reconcile_interval > absl::ZeroDuration()) {
    reconciler_ = std::thread([this] { ReconcileLoop(); });
  }
  const std::string watch_dir =
      config_.kubelet.registration == KubeletRegistration::kPluginWatcher
          ? JoinPath(config_.kubelet.kubelet_root, "plugins_registry")
          : DevicePluginDir(config_.kubelet);
  watcher_ = std::make_unique<DirWatcher>(watch_dir, [this](const DirWatcher::Event& e) {
    if (e.kind != DirWatcher::Event::kTick) WakeRegistrar();
  });
  DPP_RETURN_IF_ERROR(watcher_->Start());
  WakeRegistrar();
  events_.Emit("proxy_started", {});
  return absl::OkStatus();
}

void ProxyServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    running_ = false;
  }
  LOG(INFO) << "dpproxy shutting down";
  if (watcher_) watcher_->Stop();
  {
    absl::MutexLock lock(&wake_mu_);
    stop_ = true;
  }
  if (registrar_.joinable()) registrar_.join();
  if (reconciler_.joinable()) reconciler_.join();
  if (registration_) registration_->Stop();
  std::map<std::string, std::unique_ptr<Entry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries.swap(entries_);
  }
  // Cancel Register calls in flight, then wait for the workers: their jobs
  // point at the entries.
  for (auto& [name, e] : entries) e->endpoint->Stop();
  if (workers_) workers_->Shutdown();
  for (auto& [name, e] : entries) {
    e->endpoint->Stop();
    e->resource->Shutdown();
  }
  if (!config_.status_file.empty()) ::unlink(config_.status_file.c_str());
  events_.Emit("proxy_stopped", {});
}

ProxyServer::Entry* ProxyServer::EnsureEntry(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) return it->second.get();
  auto e = std::make_unique<Entry>();
  ResourcePolicy policy = config_.policy;
  auto m = config_.id_maps.find(name);
  if (m != config_.id_maps.end()) policy.id_map = m->second;
  ResourceHooks hooks;
  hooks.on_change = [this] { WakeRegistrar(); };
  StateKeeper* keeper = keeper_.get();
  hooks.is_allocated = [keeper, name](const std::string& id) {
    return keeper != nullptr && keeper->HoldsDevice(name, id);
  };
  e->resource = std::make_unique<Resource>(name, policy, &events_, std::move(hooks));
  e->endpoint = std::make_unique<KubeletEndpoint>(e->resource.get(), config_.kubelet, &losses_,
                                                  &events_, keeper_.get());
  Entry* raw = e.get();
  entries_[name] = std::move(e);
  LOG(INFO) << "resource " << name << ": kubelet-facing socket " << raw->endpoint->socket_path();
  WakeRegistrar();
  return raw;
}

absl::Status ProxyServer::AttachBackend(std::shared_ptr<Backend> backend) {
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return absl::UnavailableError("dpproxy is stopping");
  }
  std::string name = backend->resource();
  auto r = config_.renames.find(name);
  if (r != config_.renames.end()) {
    name = r->second;
    LOG(INFO) << "backend resource " << backend->resource() << " is served to the kubelet as "
              << name;
  }
  Entry* e = EnsureEntry(name);
  // Options may change: the registrar compares them with those it
  // registered (kubelets up to 1.24 only read them at registration).
  (void)e->resource->AttachBackend(std::move(backend));
  WakeRegistrar();
  return absl::OkStatus();
}

void ProxyServer::WakeRegistrar() {
  absl::MutexLock lock(&wake_mu_);
  wake_ = true;
}

void ProxyServer::RegistrarLoop() {
  for (;;) {
    // Once a second at most without a wake-up (the stat fallback), sooner
    // when a registration is due for a retry. (mu_ is never taken while
    // wake_mu_ is held: WakeRegistrar() is called under mu_.)
    absl::Duration wait = absl::Seconds(1);
    {
      absl::MutexLock lock(&mu_);
      wait = std::min(wait, std::max(absl::ZeroDuration(), next_check_ - absl::Now()));
    }
    {
      absl::MutexLock lock(&wake_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool {
        return wake_ || stop_;
      };
      wake_mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (stop_) return;
      wake_ = false;
    }
    CheckKubelet();
    CheckKubeletCheckpoint();
    ApplyQuarantine();
    // Nothing below costs more than O(resources) unless something changed.
    const std::string fingerprint = Fingerprint();
    PersistResources(fingerprint);
    WriteStatusIfChanged(fingerprint);
    ++registrar_ticks_;
  }
}

void ProxyServer::ReconcileLoop() {
  // First pass soon after start (the kubelet may be starting too), then
  // every interval.
  absl::Duration wait = std::min(absl::Seconds(10), config_.reconcile_interval);
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) -> bool { return stop_; };
      if (wake_mu_.AwaitWithTimeout(absl::Condition(&stopping), wait)) return;
    }
    absl::Status s = ReconcileOnce();
    if (!s.ok()) VLOG(1) << "reconciliation skipped: " << s.message();
    wait = config_.reconcile_interval;
  }
}

std::string ProxyServer::PodResourcesSocket() const {
  return JoinPath(JoinPath(config_.kubelet.kubelet_root, "pod-resources"), "kubelet.sock");
}

absl::Status ProxyServer::ReconcileOnce() {
  if (!keeper_) return absl::FailedPreconditionError("no state directory");
  const std::string socket = PodResourcesSocket();
  if (!PathExists(socket)) {
    return absl::UnavailableError(absl::StrCat("no pod-resources API at ", socket));
  }
  auto stub = v1::PodResourcesLister::NewStub(MakeUnixChannel(socket));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListPodResourcesResponse list;
  grpc::Status st = stub->List(&ctx, v1::ListPodResourcesRequest(), &list);
  if (!st.ok()) {
    return absl::UnavailableError(
        absl::StrCat("pod-resources List failed: ", DescribeGrpcStatus(st)));
  }
  Holdings holdings;
  for (const auto& pod : list.pod_resources()) {
    holdings.AddPod(pod.namespace_(), pod.name());
    for (const auto& c : pod.containers()) {
      const size_t index = holdings.AddHolder({pod.namespace_(), pod.name(), c.name(), ""});
      for (const auto& d : c.devices()) {
        for (const std::string& id : d.device_ids()) {
          holdings.AddDevice(index, d.resource_name(), id);
        }
      }
    }
  }
  const state::State st_now = keeper_->AllocationsSnapshot();
  const std::map<uint64_t, size_t> matched = holdings.Match(st_now);
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::vector<StateKeeper::Holder> annotate;
  std::vector<uint64_t> release, contradicted;
  std::vector<std::string> contradicted_pods;
  std::set<uint64_t> missing;
  for (const state::Allocation& a : st_now.allocations()) {
    auto m = matched.find(a.id());
    if (m != matched.end()) {
      const PodHolder& h = holdings.holder(m->second);
      annotate.push_back({a.id(), h.pod_namespace, h.pod_name, h.container, ""});
      continue;
    }
    const bool pod_listed =
        !a.pod_name().empty() && holdings.HasPod(a.pod_namespace(), a.pod_name());
    if (a.quarantined() && (a.pod_name().empty() || pod_listed)) {
      // Its pod may still run: the devices stay away from new pods.
      continue;
    }
    const bool old_enough =
        now_ms - a.allocated_unix_ms() >= absl::ToInt64Milliseconds(config_.reconcile_grace);
    if (!old_enough && !pod_listed) continue;
    if (missing_once_.count(a.id()) == 0) {
      missing.insert(a.id());
      continue;
    }
    if (pod_listed) {
      // The kubelet lists the pod as running but no longer these devices:
      // it lost track of them (e.g. it restarted without its checkpoint).
      contradicted.push_back(a.id());
      contradicted_pods.push_back(absl::StrCat(a.pod_namespace(), "/", a.pod_name()));
    } else {
      release.push_back(a.id());
    }
  }
  missing_once_ = std::move(missing);
  if (!release.empty()) {
    LOG(INFO) << "reconciliation: releasing " << release.size()
              << " journal entries whose pods are gone";
  }
  absl::StatusOr<int> annotated = keeper_->Reconcile(annotate, release);
  if (!annotated.ok()) return annotated.status();
  if (!contradicted.empty()) {
    QuarantineAllocations(contradicted,
                          absl::StrCat("the kubelet's pod-resources API lists ",
                                       absl::StrJoin(contradicted_pods, ", "),
                                       " without the devices dpproxy allocated to it"));
  }
  events_.Emit("reconciled", {{"pods", list.pod_resources_size()},
                              {"annotated", *annotated},
                              {"released", release.size()},
                              {"contradicted", contradicted.size()},
                              {"missing_once", missing_once_.size()}});
  return absl::OkStatus();
}

void ProxyServer::QuarantineAllocations(const std::vector<uint64_t>& ids,
                                        const std::string& reason) {
  absl::StatusOr<int> added = keeper_->Quarantine(ids, reason);
  if (!added.ok()) {
    LOG(ERROR) << "cannot persist the quarantine of " << ids.size()
               << " allocation(s) (kept in memory): " << added.status().message();
  }
  if (added.ok() && *added == 0) return;
  const state::State st = keeper_->AllocationsSnapshot();
  const std::set<uint64_t> wanted(ids.begin(), ids.end());
  // Which live allocations hold each device, to report a device held twice.
  std::map<std::pair<std::string, std::string>, std::vector<const state::Allocation*>> by_device;
  for (const state::Allocation& a : st.allocations()) {
    for (const std::string& d : a.device_ids()) by_device[{a.resource(), d}].push_back(&a);
  }
  auto who = [](const state::Allocation& a) {
    return a.pod_name().empty()
               ? absl::StrCat("allocation ", a.id(),
                              a.pod_uid().empty() ? "" : absl::StrCat(" (pod UID ", a.pod_uid(), ")"),
                              " of an unknown pod")
               : absl::StrCat(a.pod_namespace(), "/", a.pod_name(), "/", a.container());
  };
  for (const state::Allocation& a : st.allocations()) {
    if (wanted.count(a.id()) == 0) continue;
    LOG(ERROR) << "resource " << a.resource() << ": devices "
               << absl::StrJoin(a.device_ids(), ",") << " of " << who(a)
               << " are quarantined (reported Unhealthy until the pod is gone): " << reason;
    events_.Emit("devices_quarantined", {{"resource", a.resource()},
                                         {"allocation", a.id()},
                                         {"devices", std::vector<std::string>(
                                                         a.device_ids().begin(),
                                                         a.device_ids().end())},
                                         {"holder", who(a)},
                                         {"reason", reason}});
    for (const std::string& d : a.device_ids()) {
      for (const state::Allocation* other : by_device[{a.resource(), d}]) {
        if (other->id() <= a.id() || other->quarantined()) continue;
        {
          absl::MutexLock lock(&mu_);
          ++devices_held_twice_;
        }
        LOG(ERROR) << "resource " << a.resource() << ": device " << d
                   << " is held twice: by " << who(a) << " and, allocated since, by "
                   << who(*other) << " (the kubelet handed it out again)";
        events_.Emit("device_held_twice", {{"resource", a.resource()},
                                           {"device", d},
                                           {"first", who(a)},
                                           {"second", who(*other)}});
      }
    }
  }
  WakeRegistrar();
}

void ProxyServer::ApplyQuarantine() {
  if (!keeper_) return;
  const uint64_t version = keeper_->quarantine_version();
  if (version == applied_quarantine_) return;
  applied_quarantine_ = version;
  std::map<std::string, std::set<std::string>> devices;
  Json list = Json::array();
  const state::State st = keeper_->AllocationsSnapshot();
  for (const state::Allocation& a : st.allocations()) {
    if (!a.quarantined()) continue;
    devices[a.resource()].insert(a.device_ids().begin(), a.device_ids().end());
    list.push_back({{"resource", a.resource()},
                    {"allocation", a.id()},
                    {"devices", std::vector<std::string>(a.device_ids().begin(),
                                                         a.device_ids().end())},
                    {"pod", a.pod_name().empty()
                                ? std::string()
                                : absl::StrCat(a.pod_namespace(), "/", a.pod_name())},
                    {"container", a.container()},
                    {"pod_uid", a.pod_uid()},
                    {"reason", a.quarantine_reason()},
                    {"since_unix_ms", a.quarantined_unix_ms()}});
  }
  std::vector<Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : entries_) entries.push_back(e.get());
    quarantine_status_ = list;
  }
  for (Entry* e : entries) {
    auto it = devices.find(e->resource->name());
    e->resource->SetQuarantined(it == devices.end() ? std::set<std::string>() : it->second);
  }
}

void ProxyServer::CheckKubeletCheckpoint() {
  if (!keeper_) return;
  const std::string path = JoinPath(DevicePluginDir(config_.kubelet), kKubeletCheckpointName);
  const std::optional<FileId> id = StatFileId(path);
  const absl::Time now = absl::Now();
  if (restart_check_.has_value()) {
    // Wait until the restarted kubelet wrote its checkpoint (it does at its
    // first device-list update), or for the deadline.
    if (id == restart_check_->checkpoint_before && now < restart_check_->deadline) return;
    RestartCheck check = *std::move(restart_check_);
    restart_check_.reset();
    std::string why;
    absl::StatusOr<KubeletCheckpoint> ckpt = absl::NotFoundError("missing");
    if (!id.has_value()) {
      why = absl::StrCat("the kubelet restarted and has no checkpoint at ", path);
    } else if (absl::StatusOr<std::string> text = ReadFile(path); !text.ok()) {
      why = absl::StrCat("the kubelet restarted and its checkpoint cannot be read: ",
                         text.status().message());
    } else if (ckpt = ParseKubeletCheckpoint(*text); !ckpt.ok()) {
      why = absl::StrCat("the kubelet restarted with an unreadable checkpoint (",
                         ckpt.status().message(), ")");
    }
    std::vector<uint64_t> lost;
    const state::State st = keeper_->AllocationsSnapshot();
    std::map<uint64_t, size_t> matched;
    if (ckpt.ok()) matched = CheckpointHoldings(*ckpt).Match(st);
    int kept = 0;
    for (const state::Allocation& a : st.allocations()) {
      if (check.live.count(a.id()) == 0 || a.quarantined()) continue;
      if (ckpt.ok() && matched.count(a.id()) > 0) {
        ++kept;
        continue;
      }
      lost.push_back(a.id());
    }
    // A kubelet reads its checkpoint whole or discards it whole: if it still
    // lists any allocation that was live before the restart, it kept them,
    // and those missing are pods that ended meanwhile (released as usual).
    if (kept > 0 && !lost.empty()) {
      LOG(INFO) << "the restarted kubelet kept its checkpoint; " << lost.size()
                << " allocation(s) it no longer lists belong to pods that ended";
      lost.clear();
    }
    if (why.empty()) {
      why = "the kubelet restarted and its checkpoint no longer lists these devices (it lost "
            "them: deleted, corrupt, or written by a release it cannot read)";
    }
    if (!lost.empty()) QuarantineAllocations(lost, why);
    events_.Emit("kubelet_checkpoint_checked", {{"lost", lost.size()},
                                                {"live", check.live.size()}});
    last_checkpoint_ = id;
    return;
  }
  // Release journal entries the kubelet no longer holds (every release
  // writes its checkpoint; 1.9 kubelets have no pod-resources API): parsed
  // whenever it changes, so that at a kubelet restart dpproxy knows what the
  // kubelet held a moment before.
  // When it changed, and on the reconcile interval
  // (a quiet node writes no new checkpoint, and "missing twice" needs two
  // passes).
  const bool due = config_.reconcile_interval > absl::ZeroDuration() &&
                   now - last_checkpoint_parse_ >= config_.reconcile_interval;
  if (!id.has_value() || (id == last_checkpoint_ && !due)) return;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return;
  absl::StatusOr<KubeletCheckpoint> ckpt = ParseKubeletCheckpoint(*text);
  last_checkpoint_ = id;
  last_checkpoint_parse_ = now;
  if (!ckpt.ok()) {
    VLOG(1) << "kubelet checkpoint not used: " << ckpt.status().message();
    return;
  }
  absl::MutexLock lock(&checkpoint_mu_);
  (void)CheckpointPass(*ckpt);
}

absl::Status ProxyServer::ReconcileCheckpointOnce() {
  if (!keeper_) return absl::FailedPreconditionError("no state directory");
  const std::string path = JoinPath(DevicePluginDir(config_.kubelet), kKubeletCheckpointName);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::UnavailableError(text.status().message());
  absl::StatusOr<KubeletCheckpoint> ckpt = ParseKubeletCheckpoint(*text);
  if (!ckpt.ok()) return absl::UnavailableError(ckpt.status().message());
  absl::MutexLock lock(&checkpoint_mu_);
  return CheckpointPass(*ckpt);
}

Holdings ProxyServer::CheckpointHoldings(const KubeletCheckpoint& ckpt) {
  Holdings holdings;
  std::map<std::pair<std::string, std::string>, size_t> by_container;
  for (const KubeletCheckpoint::Entry& e : ckpt.entries) {
    auto [it, fresh] = by_container.try_emplace({e.pod_uid, e.container}, 0);
    if (fresh) it->second = holdings.AddHolder({"", "", e.container, e.pod_uid});
    for (const std::string& id : e.device_ids) holdings.AddDevice(it->second, e.resource, id);
  }
  return holdings;
}

absl::Status ProxyServer::CheckpointPass(const KubeletCheckpoint& ckpt) {
  const state::State st = keeper_->AllocationsSnapshot();
  const Holdings holdings = CheckpointHoldings(ckpt);
  const std::map<uint64_t, size_t> matched = holdings.Match(st);
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  const bool pod_resources = PathExists(PodResourcesSocket());
  checkpoint_seen_ = true;
  checkpoint_read_ms_ = now_ms;
  checkpoint_live_.clear();
  std::vector<StateKeeper::Holder> annotate;
  std::vector<uint64_t> release;
  std::set<uint64_t> missing;
  for (const state::Allocation& a : st.allocations()) {
    auto m = matched.find(a.id());
    if (m != matched.end()) {
      checkpoint_live_.insert(a.id());
      const PodHolder& h = holdings.holder(m->second);
      annotate.push_back({a.id(), "", "", h.container, h.pod_uid});
      continue;
    }
    // Quarantined: absent from the checkpoint is the symptom, not proof.
    // Where pod-resources exists it decides (it can tell a pod that is gone
    // from one whose devices the kubelet lost); the checkpoint only names.
    if (a.quarantined() || pod_resources) continue;
    if (now_ms - a.allocated_unix_ms() < absl::ToInt64Milliseconds(config_.reconcile_grace)) {
      continue;
    }
    if (checkpoint_missing_once_.count(a.id()) > 0) {
      release.push_back(a.id());
    } else {
      missing.insert(a.id());
    }
  }
  checkpoint_missing_once_ = std::move(missing);
  // The kubelet rewrites its checkpoint after every allocation: naming pod
  // UIDs must not cost a snapshot write each time (only releases save).
  absl::StatusOr<int> annotated =
      keeper_->Reconcile(annotate, release, /*persist_names=*/false);
  if (!annotated.ok()) return annotated.status();
  if (!release.empty()) {
    LOG(INFO) << "kubelet checkpoint: released " << release.size()
              << " journal entries no kubelet container holds any more";
  }
  events_.Emit("checkpoint_reconciled", {{"entries", ckpt.entries.size()},
                                         {"layout", LayoutWriters(ckpt.layout)},
                                         {"released", release.size()},
                                         {"missing_once", checkpoint_missing_once_.size()}});
  return absl::OkStatus();
}

absl::Status ProxyServer::RestoreState() {
  absl::StatusOr<state::State> loaded = keeper_->Load();
  if (!loaded.ok()) return loaded.status();
  const state::State& st = *loaded;
  const absl::Duration trust =
      config_.restore_policy == RestorePolicy::kTrust ? config_.restore_hold : absl::ZeroDuration();
  for (const state::Resource& r : st.resources()) {
    Entry* e = EnsureEntry(r.name());
    e->resource->Restore({r.devices().begin(), r.devices().end()}, trust,
                         r.backend().endpoint(), r.backend().api_version());
    {
      absl::MutexLock lock(&mu_);
      e->restored_kubelet_api = r.kubelet_api();
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
      absl::StrAppend(&fp, name, "|", e->restored_kubelet_api, "|", e->static_backend, "|");
    }
    // (The quarantine list is derived from the keeper's quarantine version,
    // counted below.)
    absl::StrAppend(&fp, devices_held_twice_, "|");
  }
  for (Entry* e : entries) {
    absl::StrAppend(&fp, e->resource->changes(), "|", e->endpoint->negotiated(), "|");
  }
  absl::StrAppend(&fp, losses_.Total(), "|");
  if (keeper_) {
    absl::StrAppend(&fp, keeper_->AllocationCount(), "|", keeper_->save_failures(), "|",
                    keeper_->writable(), "|", keeper_->quarantine_version());
  }
  return fp;
}

void ProxyServer::PersistResources(const std::string& fingerprint) {
  if (!keeper_) return;
  // Saved resources change only with what the fingerprint counts; a failed
  // save counts a failure, which changes it, so it is tried again.
  if (fingerprint == persisted_fingerprint_) return;
  std::vector<Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    for (auto& [name, e] : entries_) entries.push_back(e.get());
  }
  std::vector<state::Resource> out;
  for (Entry* e : entries) {
    state::Resource r;
    r.set_name(e->resource->name());
    std::string api = e->endpoint->negotiated();
    if (api.empty()) {
      absl::MutexLock lock(&mu_);
      api = e->restored_kubelet_api;
    }
    r.set_kubelet_api(api);
    auto [endpoint, backend_api] = e->resource->last_backend();
    r.mutable_backend()->set_endpoint(endpoint);
    r.mutable_backend()->set_api_version(backend_api);
    r.mutable_backend()->set_static_backend(e->static_backend);
    std::shared_ptr<Backend> b = e->resource->backend();
    if (b) r.mutable_backend()->set_backend_resource(b->resource());
    for (const auto& d : e->resource->ReportedDevices()) *r.add_devices() = d;
    out.push_back(std::move(r));
  }
  // Failures are logged and counted.
  if (keeper_->SetResources(std::move(out)).ok()) persisted_fingerprint_ = fingerprint;
}

void ProxyServer::WriteStatusIfChanged(const std::string& fingerprint) {
  if (config_.status_file.empty()) return;
  // Device health changes are in the file too; the registrar wakes at least
  // once a second, so the file is at most a second behind.
  if (fingerprint == written_fingerprint_) return;
  // Built from values at least as new as `fingerprint`: a change after it
  // was taken changes the next one, so nothing is missed.
  const std::string text = Status().dump(1);
  if (absl::Status s = WriteFileAtomic(config_.status_file, text + "\n", 0640); !s.ok()) {
    LOG(WARNING) << "cannot write status file: " << s.message();
    return;
  }
  written_fingerprint_ = fingerprint;
}

void ProxyServer::ConnectStatic(Entry* e) {
  const StaticBackendConfig& sb = e->static_config;
  absl::StatusOr<ApiVersion> api =
      sb.api ? absl::StatusOr<ApiVersion>(*sb.api) : ProbeBackendApi(sb.endpoint, absl::Milliseconds(500));
  if (!api.ok()) return;
  absl::StatusOr<std::shared_ptr<Backend>> b =
      ConnectBackend(sb.resource, sb.endpoint, *api, absl::Milliseconds(500),
                     config_.backend_max_list_bytes);
  if (!b.ok()) return;
  (void)AttachBackend(*b);
}

void ProxyServer::RegisterOnWorker(Entry* e, FileId kubelet, std::string options,
                                   uint64_t served) {
  absl::Status s;
  if (!e->endpoint->SocketPresent()) {
    // Never ask a kubelet to dial a socket that is not serving (a kubelet's
    // wipe removed it): the registrar serves it again, then registers.
    s = absl::UnavailableError("our socket is not serving");
  } else {
    s = e->endpoint->Register();
  }
  {
    absl::MutexLock lock(&mu_);
    e->registering = false;
    if (s.ok() && e->served != served) {
      // Served again while the kubelet was answering: register once more,
      // toward the new server.
      LOG(INFO) << "resource " << e->resource->name()
                << ": served again during registration; registering again";
    } else if (s.ok()) {
      e->registered_with = kubelet;
      e->registered_options = std::move(options);
      e->backoff = absl::ZeroDuration();
      e->retry_at = absl::InfinitePast();
    } else {
      // Retried soon, with backoff: not only at the next kubelet restart.
      const absl::Duration cap = s.code() == absl::StatusCode::kUnavailable ||
                                         s.code() == absl::StatusCode::kDeadlineExceeded
                                     ? absl::Seconds(5)
                                     : absl::Seconds(30);
      e->backoff = std::min(cap, std::max(absl::Milliseconds(100), e->backoff * 2));
      e->retry_at = absl::Now() + e->backoff;
      next_check_ = std::min(next_check_, e->retry_at);
      LOG(INFO) << "resource " << e->resource->name() << ": registration failed ("
                << s.message() << "); retrying in " << absl::FormatDuration(e->backoff);
    }
  }
  WakeRegistrar();
}

// Runs on the registrar thread only: detection, serving and timers, none of
// which blocks. Registrations and static connects run on the workers.
void ProxyServer::CheckKubelet() {
  std::vector<Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    if (!running_) return;
    for (auto& [name, e] : entries_) entries.push_back(e.get());
    next_check_ = absl::InfiniteFuture();
  }
  const absl::Time now = absl::Now();
  for (Entry* e : entries) {
    e->resource->Tick(now);
    if (!e->static_backend || e->resource->backend_connected()) continue;
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
  // Our sockets: a kubelet start removes every file in device-plugins/.
  // Serving again is quick and happens here, even while a Register of the
  // same resource waits on the kubelet's dial: that dial then finds the
  // socket again.
  for (Entry* e : entries) {
    if (e->endpoint->SocketPresent()) continue;
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !e->registered_with.has_value() && e->endpoint->negotiated().empty();
    }
    if (absl::Status s = e->endpoint->Serve(); !s.ok()) {
      LOG(ERROR) << "resource " << e->resource->name() << ": " << s.message();
      continue;
    }
    if (!first) {
      LOG(INFO) << "resource " << e->resource->name()
                << ": kubelet restart detected (our socket was removed); serving again";
      events_.Emit("kubelet_restart_detected",
                   {{"resource", e->resource->name()}, {"signal", "socket removed"}});
    }
    absl::MutexLock lock(&mu_);
    ++e->served;
    e->registered_with.reset();
    e->backoff = absl::ZeroDuration();
    e->retry_at = absl::InfinitePast();
  }
  std::optional<FileId> kubelet = StatFileId(KubeletSocketPath(config_.kubelet));
  if (kubelet.has_value() && last_kubelet_.has_value() && kubelet != last_kubelet_ && keeper_) {
    // A kubelet restart while dpproxy runs: check that it kept the
    // allocations live now, once it has written its checkpoint again.
    RestartCheck check;
    const std::string ckpt_path =
        JoinPath(DevicePluginDir(config_.kubelet), kKubeletCheckpointName);
    check.checkpoint_before = StatFileId(ckpt_path);
    check.deadline = now + absl::Seconds(30);
    const state::State st = keeper_->AllocationsSnapshot();
    // Live for the kubelet that stopped: the checkpoint still on disk is its
    // final view if it predates the new kubelet.sock (a new kubelet writes
    // only after devices register). Otherwise, what the last read listed
    // and anything allocated since. Entries of pods that ended before the
    // restart are thereby never quarantined. Never read at all: every entry.
    std::optional<KubeletCheckpoint> current;
    if (check.checkpoint_before.has_value()) {
      if (absl::StatusOr<std::string> text = ReadFile(ckpt_path); text.ok()) {
        if (absl::StatusOr<KubeletCheckpoint> k = ParseKubeletCheckpoint(*text); k.ok()) {
          current = *std::move(k);
        }
      }
    }
    const bool final_view = current.has_value() && check.checkpoint_before->ctime_ns <=
                                                       kubelet->ctime_ns;
    if (final_view) {
      for (const auto& [id, holder] : CheckpointHoldings(*current).Match(st)) {
        check.live.insert(id);
      }
      for (const state::Allocation& a : st.allocations()) {
        if (a.quarantined()) check.live.erase(a.id());
      }
    } else {
      // (The last read is fresh: the checkpoint is read whenever it
      // changes. Allocations since then count only if the file cannot be
      // read now, i.e. the kubelet lost it.)
      absl::MutexLock lock(&checkpoint_mu_);
      for (const state::Allocation& a : st.allocations()) {
        if (a.quarantined()) continue;
        if (!checkpoint_seen_ || checkpoint_live_.count(a.id()) > 0 ||
            (!current.has_value() && a.allocated_unix_ms() >= checkpoint_read_ms_)) {
          check.live.insert(a.id());
        }
      }
    }
    restart_check_ = std::move(check);  // checked (and reported) even if none is live
  }
  if (kubelet.has_value()) last_kubelet_ = kubelet;
  if (config_.kubelet.registration == KubeletRegistration::kPluginWatcher) return;
  if (!kubelet.has_value()) return;  // no kubelet yet; the watcher wakes us
  for (Entry* e : entries) {
    std::string options = e->resource->options().SerializeAsString();
    uint64_t served;
    {
      absl::MutexLock lock(&mu_);
      if (e->registering) continue;
      served = e->served;
      if (e->registered_with == kubelet) {
        if (e->registered_options == options) continue;
        LOG(INFO) << "resource " << e->resource->name() << ": options changed; registering again";
      } else if (e->registered_with.has_value()) {
        LOG(INFO) << "resource " << e->resource->name()
                  << ": kubelet restart detected (new kubelet.sock); registering again";
        events_.Emit("kubelet_restart_detected",
                     {{"resource", e->resource->name()}, {"signal", "kubelet.sock recreated"}});
        e->registered_with.reset();
        e->backoff = absl::ZeroDuration();
        e->retry_at = absl::InfinitePast();
      }
      if (now < e->retry_at) {
        next_check_ = std::min(next_check_, e->retry_at);
        continue;
      }
      e->registering = true;
    }
    if (!workers_->Submit([this, e, k = *kubelet, o = std::move(options), served]() mutable {
          RegisterOnWorker(e, k, std::move(o), served);
        })) {
      absl::MutexLock lock(&mu_);
      e->registering = false;
    }
  }
}

std::string ProxyServer::KubeletSocketOf(const std::string& resource) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(resource);
  return it == entries_.end() ? "" : it->second->endpoint->socket_path();
}

Json ProxyServer::Status(bool with_devices) {
  if (with_devices) ++status_builds_;
  Json resources = Json::array();
  std::vector<Entry*> entries;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, e] : entries_) entries.push_back(e.get());
  }
  for (Entry* e : entries) {
    Resource::Snapshot snap = e->resource->Current();
    const int healthy = snap.healthy;
    Json devices = Json::array();
    if (with_devices) {
      for (const auto& d : snap.list->devices()) {
        devices.push_back({{"id", d.id()}, {"health", d.health()}});
      }
    }
    std::shared_ptr<Backend> b = e->resource->backend();
    v1beta1::DevicePluginOptions opts = e->resource->options();
    resources.push_back({{"resource", e->resource->name()},
                         {"kubelet_api", e->endpoint->negotiated()},
                         {"kubelet_socket", e->endpoint->socket_path()},
                         {"backend_connected", b != nullptr},
                         {"backend_api", e->resource->last_backend().second},
                         {"backend_endpoint", e->resource->last_backend().first},
                         {"static_backend", e->static_backend},
                         {"pre_start_required", opts.pre_start_required()},
                         {"get_preferred_allocation_available",
                          opts.get_preferred_allocation_available()},
                         {"devices_total", snap.list->devices_size()},
                         {"devices_healthy", healthy},
                         {"device_list_bytes", snap.bytes},
                         {"device_list_too_large", snap.bytes > Resource::kKubeletMaxListBytes},
                         {"devices", devices}});
  }
  Json quarantined = Json::array();
  int64_t held_twice = 0;
  {
    absl::MutexLock lock(&mu_);
    quarantined = quarantine_status_;
    held_twice = devices_held_twice_;
  }
  Json state = nullptr;
  if (keeper_) {
    state = {{"path", keeper_->path()},
             {"allocations", keeper_->AllocationCount()},
             {"save_failures", keeper_->save_failures()},
             {"writable", keeper_->writable()},
             {"last_write_error", keeper_->writable() ? std::string()
                                                      : keeper_->last_write_error()}};
  }
  Json losses = Json::object();
  for (const auto& [res, kinds] : losses_.Snapshot()) {
    for (const auto& [kind, n] : kinds) losses[res][kind] = n;
  }
  return {{"pid", static_cast<int64_t>(::getpid())},
          {"resources", resources},
          {"lossy_translations", losses},
          {"state", state},
          {"quarantined", quarantined},
          {"devices_held_twice", held_twice},
          {"plugin_socket", backend_registration_socket()},
          {"kubelet_root", config_.kubelet.kubelet_root}};
}

}  // namespace dpproxy
