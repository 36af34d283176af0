#include "proxy/core/resource.h"

#include "absl/container/flat_hash_set.h"
#include "proxy/util/encoding.h"

#include <glog/logging.h>

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proxy/kubelet_rules/kubelet_rules.h"

namespace dpproxy {

Resource::Resource(std::string name, ResourcePolicy policy, EventLog* events,
                   ResourceHooks hooks)
    : name_(std::move(name)), policy_(std::move(policy)), events_(events),
      hooks_(std::move(hooks)), loss_policy_(policy_.loss_policy), hold_(policy_.hold),
      grace_(policy_.grace),
      ids_(std::make_shared<const IdPolicy>(IdPolicy{policy_.id_map, policy_.compact_ids})),
      damper_(policy_.flap_damping),
      watchdog_({[this](uint64_t generation, absl::Duration silent_for) {
                   OnSilent(generation, silent_for);
                 },
                 [this](uint64_t generation, absl::Duration silent_for) {
                   OnAnswering(generation, silent_for);
                 }}) {
  watchdog_.SetSettings(policy_.probe);
}

void Resource::SetIdPolicy(std::map<std::string, std::string> id_map, bool compact_ids) {
  absl::MutexLock lock(&mu_);
  const bool by_itself = ids_->compact_by_itself;
  ids_ = std::make_shared<const IdPolicy>(
      IdPolicy{std::move(id_map), compact_ids || by_itself, by_itself && !compact_ids});
}

void Resource::KeepCompactIds() {
  absl::MutexLock lock(&mu_);
  if (ids_->compact_ids) return;
  auto next = std::make_shared<IdPolicy>(*ids_);
  next->compact_ids = next->compact_by_itself = true;
  ids_ = std::move(next);
}

std::string Resource::compact_ids_mode() {
  absl::MutexLock lock(&mu_);
  if (!ids_->compact_ids) return "";
  return ids_->compact_by_itself ? "on by itself" : "configured";
}

bool Resource::maps_ids() {
  absl::MutexLock lock(&mu_);
  return !ids_->id_map.empty() || ids_->compact_ids;
}

Resource::~Resource() { Shutdown(); }

void Resource::SetLossPolicy(LossPolicy policy, absl::Duration hold, absl::Duration grace) {
  {
    ChangeLock lock(this);
    loss_policy_ = policy;
    hold_ = hold;
    grace_ = grace;
    // A backend lost and held now: Unhealthy at once if the new policy
    // would have marked it by now (Tick sees to a longer hold).
    if (!connected_ && lost_at_.has_value() && !hold_override_.has_value() && !keep_health_ &&
        absl::Now() - *lost_at_ >= LossHoldLocked()) {
      MarkAllLocked(std::string(kUnhealthy));
    }
  }
}

bool Resource::AttachBackend(std::shared_ptr<Backend> backend) {
  std::shared_ptr<Backend> old;
  uint64_t generation;
  bool options_changed;
  {
    ChangeLock lock(this);
    old = std::move(backend_);
    backend_ = backend;
    generation = ++generation_;
    connected_ = true;
    listed_ = false;  // calls wait for its first device list
    silent_ = false;
    lost_at_.reset();
    hold_override_.reset();
    last_endpoint_ = backend->endpoint();
    last_api_ = std::string(ApiWireVersion(backend->api()));
    v1beta1::DevicePluginOptions opts = backend->options();
    last_options_ = opts;
    options_changed = opts.SerializeAsString() != options_.SerializeAsString();
    options_ = opts;
    ++changes_;
  }
  if (old != nullptr) {
    LOG(INFO) << "resource " << name_ << ": backend " << old->endpoint() << " ("
              << ApiWireVersion(old->api()) << ") replaced by " << backend->endpoint() << " ("
              << std::string(ApiWireVersion(backend->api())) << ")";
    old->Stop();
  }
  LOG(INFO) << "resource " << name_ << ": backend up at " << backend->endpoint() << " ("
            << std::string(ApiWireVersion(backend->api())) << ")";
  events_->Emit("backend_up", {{"resource", name_},
                               {"backend_resource", backend->resource()},
                               {"endpoint", backend->endpoint()},
                               {"api_version", std::string(ApiWireVersion(backend->api()))},
                               {"replaced", old != nullptr}});
  if (hooks_.on_change) hooks_.on_change();
  backend->Start(BackendCallbacks{
      [this, generation](std::shared_ptr<const DeviceList> d) {
        OnDevices(generation, std::move(d));
      },
      [this, generation](const std::string& why) { OnLost(generation, why); }});
  return options_changed;
}

std::shared_ptr<Backend> Resource::backend() {
  absl::MutexLock lock(&mu_);
  return connected_ && listed_ ? backend_ : nullptr;
}

std::shared_ptr<Backend> Resource::attached_backend() {
  absl::MutexLock lock(&mu_);
  return connected_ ? backend_ : nullptr;
}

std::shared_ptr<Backend> Resource::WaitForBackend(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connected_ && listed_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return connected_ && listed_ ? backend_ : nullptr;
}

bool Resource::backend_connected() {
  absl::MutexLock lock(&mu_);
  return connected_;
}

v1beta1::DevicePluginOptions Resource::options() {
  absl::MutexLock lock(&mu_);
  v1beta1::DevicePluginOptions opts = options_;
  // dpproxy answers GetPreferredAllocation for every backend (for one
  // without it, from the available devices), so that new pods are
  // steered away from devices held by containers the kubelet forgot.
  opts.set_get_preferred_allocation_available(true);
  return opts;
}

Resource::Snapshot Resource::Current() {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

uint64_t Resource::AddWatcher(std::function<void(const Snapshot&)> on_publish) {
  absl::MutexLock lock(&watch_mu_);
  watchers_.emplace(++next_watcher_, std::move(on_publish));
  return next_watcher_;
}

void Resource::RemoveWatcher(uint64_t id) {
  absl::MutexLock lock(&watch_mu_);
  watchers_.erase(id);
}

Resource::ChangeLock::ChangeLock(Resource* r) : r_(r) {
  r_->mu_.Lock();
  before_ = r_->snapshot_.version;
}

Resource::ChangeLock::~ChangeLock() {
  std::optional<Snapshot> published;
  if (r_->snapshot_.version != before_) published = r_->snapshot_;
  r_->mu_.Unlock();
  if (published.has_value()) ++r_->changes_;
  if (!published.has_value()) return;
  absl::MutexLock lock(&r_->watch_mu_);
  for (auto& [id, on_publish] : r_->watchers_) on_publish(*published);
}

bool Resource::HasDevice(const std::string& id) { return DeviceHealth(id).has_value(); }

std::optional<std::string> Resource::DeviceHealth(const std::string& id) {
  Snapshot snap = Current();
  std::optional<int> i = snap.list->Find(id);
  if (!i.has_value()) return std::nullopt;
  return std::string(snap.list->device(*i).health);
}

void Resource::PublishBaseLocked(std::shared_ptr<const DeviceList> base) {
  base_ = std::move(base);
  // The kubelet sees the base list itself (one copy held) unless an
  // override (a rename, a device held under another ID) sets the health
  // of a device in it.
  std::shared_ptr<const DeviceList> shown = base_;
  const std::set<std::string> damped = damper_.Damped();
  if (!shown_unhealthy_.empty() || !damped.empty()) {
    // Looked up by view: no ID is copied per device.
    absl::flat_hash_set<absl::string_view> unhealthy(shown_unhealthy_.begin(),
                                                     shown_unhealthy_.end());
    unhealthy.insert(damped.begin(), damped.end());
    shown = base_->WithHealth([&unhealthy](const DeviceList::View& d) -> absl::string_view {
      return unhealthy.contains(d.id) ? kUnhealthy : absl::string_view();
    });
  }
  std::shared_ptr<const DeviceList> to_device_plugins = shown;
  if (withdrawn_from_device_plugins_) {
    to_device_plugins = shown->WithHealth(
        [](const DeviceList::View&) -> absl::string_view { return kUnhealthy; });
  } else if (held_by_claims_.size() > held_by_pod_claims_.size()) {
    absl::flat_hash_set<absl::string_view> claimed;
    for (const std::string& d : held_by_claims_) {
      if (held_by_pod_claims_.count(d) == 0) claimed.insert(d);
    }
    to_device_plugins =
        shown->WithHealth([&claimed](const DeviceList::View& d) -> absl::string_view {
          return claimed.contains(d.id) ? kUnhealthy : absl::string_view();
        });
  }
  // A device held for flapping hides the plugin's flips: a list that shows
  // nothing new is not sent again (the storm costs the kubelet nothing).
  if (!damped.empty() && snapshot_.list != nullptr && snapshot_.to_device_plugins != nullptr &&
      shown->wire() == snapshot_.list->wire() &&
      to_device_plugins->wire() == snapshot_.to_device_plugins->wire()) {
    return;
  }
  snapshot_.list = std::move(shown);
  snapshot_.to_device_plugins = std::move(to_device_plugins);
  ++snapshot_.version;
  const size_t bytes = snapshot_.list->bytes();
  const bool over = bytes > kKubeletMaxListBytes;
  if (over != over_kubelet_limit_) {
    over_kubelet_limit_ = over;
    if (over) {
      LOG(ERROR) << "resource " << name_ << ": the device list is " << bytes
                 << " bytes (" << snapshot_.list->size()
                 << " devices), more than the kubelet accepts in one message ("
                 << kKubeletMaxListBytes
                 << "): its ListAndWatch stream will fail and the node will show no "
                    "capacity for this resource";
    } else {
      LOG(INFO) << "resource " << name_ << ": the device list fits the kubelet's limit again ("
                << bytes << " bytes)";
    }
    events_->Emit(over ? "device_list_too_large" : "device_list_fits",
                  {{"resource", name_},
                   {"bytes", bytes},
                   {"limit", kKubeletMaxListBytes},
                   {"devices", snapshot_.list->size()}});
  }
}

void Resource::SetFlapDamping(const FlapDamping& settings) {
  {
    ChangeLock lock(this);
    const FlapDamper::Changes ended = damper_.SetSettings(settings, absl::Now());
    if (ended.empty()) return;
    TellFlapsLocked(ended);
    PublishBaseLocked(base_);
  }
  if (hooks_.on_change) hooks_.on_change();
}

std::set<std::string> Resource::damped() {
  absl::MutexLock lock(&mu_);
  return damper_.Damped();
}

void Resource::TellFlapsLocked(const FlapDamper::Changes& changes) {
  for (const FlapDamper::Episode& e : changes.started) {
    LOG(WARNING) << "resource " << name_ << ": device " << e.device << " turned Unhealthy "
                 << e.flaps << " times within " << absl::FormatDuration(damper_.settings().window)
                 << "; held Unhealthy for " << absl::FormatDuration(e.held_for)
                 << ", longer with each further flap (flap_damping)";
    events_->Emit("device_flapping", {{"resource", name_},
                                      {"device", e.device},
                                      {"flaps", e.flaps},
                                      {"held_ms", absl::ToInt64Milliseconds(e.held_for)}});
  }
  for (const FlapDamper::Episode& e : changes.ended) {
    LOG(WARNING) << "resource " << name_ << ": device " << e.device << " no longer held for "
                 << "flapping (held " << absl::FormatDuration(absl::Trunc(e.held_for, absl::Seconds(1)))
                 << "); shown as the plugin reports it";
    events_->Emit("device_flapping_ended",
                  {{"resource", name_},
                   {"device", e.device},
                   {"held_ms", absl::ToInt64Milliseconds(e.held_for)}});
  }
}

void Resource::SetShownUnhealthy(std::set<std::string> ids) {
  {
    ChangeLock lock(this);
    if (ids == shown_unhealthy_) return;
    shown_unhealthy_ = std::move(ids);
    PublishBaseLocked(base_);
  }
  if (hooks_.on_change) hooks_.on_change();
}

void Resource::SetHeldAcrossPaths(std::set<std::string> by_claims,
                                  std::set<std::string> by_pod_claims,
                                  std::set<std::string> by_pods) {
  {
    ChangeLock lock(this);
    if (by_claims == held_by_claims_ && by_pod_claims == held_by_pod_claims_ &&
        by_pods == *snapshot_.left_out_of_pool) {
      return;
    }
    held_by_claims_ = std::move(by_claims);
    if (by_pod_claims != held_by_pod_claims_) {
      held_by_pod_claims_ = std::move(by_pod_claims);
      UpdateSteerAroundLocked();
    }
    snapshot_.left_out_of_pool = std::make_shared<const std::set<std::string>>(std::move(by_pods));
    PublishBaseLocked(base_);
  }
  if (hooks_.on_change) hooks_.on_change();
}

void Resource::SetWithdrawnFromDevicePlugins(bool withdrawn) {
  {
    ChangeLock lock(this);
    if (withdrawn == withdrawn_from_device_plugins_) return;
    withdrawn_from_device_plugins_ = withdrawn;
    PublishBaseLocked(base_);
  }
  if (hooks_.on_change) hooks_.on_change();
}

void Resource::SetForgotten(Forgotten held) {
  absl::MutexLock lock(&mu_);
  if (held == *forgotten_) return;
  forgotten_ = std::make_shared<const Forgotten>(std::move(held));
  UpdateSteerAroundLocked();
}

void Resource::UpdateSteerAroundLocked() {
  if (held_by_pod_claims_.empty()) {
    steer_around_ = forgotten_;
    return;
  }
  auto merged = std::make_shared<Forgotten>(*forgotten_);
  for (const std::string& d : held_by_pod_claims_) {
    merged->emplace(d, "a DRA claim the scheduler made for a pod of the extended resource");
  }
  steer_around_ = std::move(merged);
}

std::shared_ptr<const Resource::Forgotten> Resource::steer_around() {
  absl::MutexLock lock(&mu_);
  return steer_around_;
}

std::shared_ptr<const Resource::Forgotten> Resource::forgotten() {
  absl::MutexLock lock(&mu_);
  return forgotten_;
}

absl::StatusOr<bool> Resource::CheckForgotten(
    const std::vector<std::vector<std::string>>& per_container, bool readmission) {
  if (hooks_.forgotten == nullptr) return false;
  return hooks_.forgotten->CheckForgotten(name_, per_container, readmission);
}

std::set<std::string> Resource::StillForgotten(const std::vector<std::string>& ids) {
  if (hooks_.forgotten == nullptr) return {ids.begin(), ids.end()};
  return hooks_.forgotten->StillForgotten(name_, ids);
}

std::vector<std::string> Resource::ReadmissionPick(int size,
                                                   const std::set<std::string>& available) {
  if (hooks_.forgotten == nullptr) return {};
  return hooks_.forgotten->ReadmissionPick(name_, size, available);
}

bool Resource::backend_offers_preferred() {
  absl::MutexLock lock(&mu_);
  return options_.get_preferred_allocation_available();
}

void Resource::MarkAllLocked(const std::string& health) {
  std::shared_ptr<const DeviceList> marked =
      base_->WithHealth([&](const DeviceList::View&) { return absl::string_view(health); });
  if (marked != base_) PublishBaseLocked(std::move(marked));
}

std::string Resource::list_refused() {
  absl::MutexLock lock(&mu_);
  return list_refused_;
}

int64_t Resource::ids_mapped() {
  absl::MutexLock lock(&mu_);
  return ids_mapped_;
}

std::string Resource::ToBackendId(const std::string& kubelet_id) {
  absl::MutexLock lock(&mu_);
  auto it = to_backend_.find(kubelet_id);
  return it == to_backend_.end() ? kubelet_id : it->second;
}

std::string Resource::ToKubeletId(const std::string& backend_id) {
  absl::MutexLock lock(&mu_);
  auto m = ids_->id_map.find(backend_id);
  if (m != ids_->id_map.end()) return m->second;
  if (!ids_->compact_ids) return backend_id;
  std::string compact = CompactDeviceId(backend_id);
  // Another device's compact ID (one in 10^9 at 100,000 devices): it keeps
  // its own. Known before the first list under compact IDs arrives.
  auto it = to_backend_.find(compact);
  return it == to_backend_.end() || it->second == backend_id ? compact : backend_id;
}

std::string CompactDeviceId(absl::string_view backend_id) {
  static constexpr char kBase32[] = "abcdefghijklmnopqrstuvwxyz234567";
  uint64_t h = Fnv64(backend_id);
  std::string out = "c";
  for (int i = 0; i < 13; ++i) {  // 65 bits: all of the hash
    out += kBase32[h & 31];
    h >>= 5;
  }
  return out;
}

void Resource::OnLost(uint64_t generation, const std::string& why) {
  ChangeLock lock(this);
  if (generation != generation_) return;
  if (silent_) {
    // Its stream ended too: lost since it fell silent, policy applied then.
    silent_ = false;
    LOG(WARNING) << "resource " << name_ << ": silent backend "
                 << (backend_ ? backend_->endpoint() : std::string("?")) << " ended its stream ("
                 << why << ")";
    return;
  }
  connected_ = false;
  ++changes_;
  LoseBackendLocked(why, "backend_down");
}

void Resource::OnSilent(uint64_t generation, absl::Duration silent_for) {
  ChangeLock lock(this);
  if (generation != generation_ || !connected_) return;
  connected_ = false;
  silent_ = true;
  ++changes_;
  LoseBackendLocked(
      absl::StrCat("plugin silent for ",
                   absl::FormatDuration(absl::Trunc(silent_for, absl::Milliseconds(100))),
                   ": it holds its stream open but answered none of the watchdog's last asks"),
      "backend_silent", {{"silent_ms", absl::ToInt64Milliseconds(silent_for)}});
}

void Resource::OnAnswering(uint64_t generation, absl::Duration silent_for) {
  ChangeLock lock(this);
  if (generation != generation_ || !silent_) return;
  silent_ = false;
  connected_ = true;
  lost_at_.reset();
  hold_override_.reset();
  ++changes_;
  // What the backend last listed, with its own health, is shown again.
  PublishBaseLocked(reported_);
  const std::string endpoint = backend_ ? backend_->endpoint() : "";
  LOG(WARNING) << "resource " << name_ << ": backend " << endpoint << " answers again after "
               << absl::FormatDuration(absl::Trunc(silent_for, absl::Seconds(1)))
               << " of silence; its devices are reported as it lists them";
  events_->Emit("backend_answering",
                {{"resource", name_},
                 {"endpoint", endpoint},
                 {"silent_ms", absl::ToInt64Milliseconds(silent_for)}});
}

bool Resource::backend_silent() {
  absl::MutexLock lock(&mu_);
  return silent_;
}

void Resource::LoseBackendLocked(const std::string& why, const char* event, Json fields) {
  lost_at_ = absl::Now();
  hold_override_.reset();
  LOG(WARNING) << "resource " << name_ << ": backend "
               << (backend_ ? backend_->endpoint() : std::string("?")) << " lost (" << why
               << "); devices "
               << (LossHoldLocked() <= absl::ZeroDuration()
                       ? std::string("reported Unhealthy")
                   : loss_policy_ == LossPolicy::kUnhealthy
                       ? "reported Unhealthy unless it is back within " +
                             absl::FormatDuration(grace_)
                       : "held at their last health for " + absl::FormatDuration(hold_));
  fields["resource"] = name_;
  fields["endpoint"] = backend_ ? backend_->endpoint() : "";
  fields["reason"] = why;
  events_->Emit(event, std::move(fields));
  if (keep_health_) return;
  if (LossHoldLocked() <= absl::ZeroDuration()) MarkAllLocked(std::string(kUnhealthy));
}

void Resource::Restore(std::shared_ptr<const DeviceList> devices, absl::Duration trust_for,
                       const std::string& backend_endpoint, const std::string& backend_api,
                       std::optional<v1beta1::DevicePluginOptions> backend_options) {
  ChangeLock lock(this);
  if (connected_) return;  // a backend was faster: its list wins
  PublishBaseLocked(std::move(devices));
  reported_ = base_;
  lost_at_ = absl::Now();
  hold_override_ = trust_for;
  last_endpoint_ = backend_endpoint;
  last_api_ = backend_api;
  last_options_ = backend_options;
  if (backend_options.has_value()) options_ = *backend_options;
  if (trust_for <= absl::ZeroDuration()) MarkAllLocked(std::string(kUnhealthy));
}

std::optional<absl::Time> Resource::trusted_until() {
  absl::MutexLock lock(&mu_);
  if (connected_ || !lost_at_.has_value() || !hold_override_.has_value() ||
      *hold_override_ <= absl::ZeroDuration()) {
    return std::nullopt;
  }
  const absl::Time until = *lost_at_ + *hold_override_;
  if (absl::Now() >= until) return std::nullopt;
  return until;
}

std::string Resource::ShownWhileAway() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  auto at = [](absl::Time t) { return absl::FormatTime("%H:%M:%S", t, absl::LocalTimeZone()); };
  if (keep_health_) return "its devices keep their last health during a handoff";
  if (lost_at_.has_value() && hold_override_.has_value() &&
      now < *lost_at_ + *hold_override_) {
    return absl::StrCat("no plugin has connected since dpproxy started, and its devices are "
                        "reported at their remembered health until ",
                        at(*lost_at_ + *hold_override_),
                        " (restore_hold), then Unhealthy unless one connects");
  }
  if (lost_at_.has_value() && !hold_override_.has_value() &&
      now < *lost_at_ + LossHoldLocked()) {
    return absl::StrCat("its devices are held at their last health until ",
                        at(*lost_at_ + LossHoldLocked()),
                        loss_policy_ == LossPolicy::kHold ? " (backend_loss.hold)"
                                                          : " (backend_loss.grace)",
                        ", then Unhealthy");
  }
  return "its devices are reported Unhealthy until one connects";
}

std::shared_ptr<const DeviceList> Resource::ReportedDevices() {
  absl::MutexLock lock(&mu_);
  return reported_;
}

Resource::LastBackend Resource::last_backend() {
  absl::MutexLock lock(&mu_);
  return {last_endpoint_, last_api_, last_options_};
}

void Resource::KeepHealthOnLoss(bool keep) {
  ChangeLock lock(this);
  keep_health_ = keep;
  // Back to the loss policy (a handoff given back): a backend lost
  // meanwhile is marked now if the policy would have marked it by now.
  if (!keep && !connected_ && lost_at_.has_value() && !hold_override_.has_value() &&
      absl::Now() - *lost_at_ >= LossHoldLocked()) {
    MarkAllLocked(std::string(kUnhealthy));
  }
}

void Resource::Tick(absl::Time now) {
  std::shared_ptr<Backend> asked;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (connected_ || silent_) asked = backend_;
    generation = generation_;
  }
  watchdog_.Tick(now, asked, generation);
  ChangeLock lock(this);
  if (const FlapDamper::Changes ended = damper_.Tick(now); !ended.empty()) {
    TellFlapsLocked(ended);
    PublishBaseLocked(base_);
  }
  if (connected_ || !lost_at_.has_value() || keep_health_) return;
  absl::Duration hold;
  if (hold_override_.has_value()) {
    hold = *hold_override_;
  } else {
    hold = LossHoldLocked();  // the hold, or the grace of `unhealthy`
  }
  if (now - *lost_at_ < hold) return;
  const uint64_t before = snapshot_.version;
  MarkAllLocked(std::string(kUnhealthy));
  if (snapshot_.version != before) {
    LOG(WARNING) << "resource " << name_ << ": no backend for " << absl::FormatDuration(hold)
                 << "; devices reported Unhealthy";
    events_->Emit("hold_expired",
                  {{"resource", name_}, {"held_ms", absl::ToInt64Milliseconds(hold)}});
  }
}

void Resource::DetachBackend(const std::string& why) {
  uint64_t generation;
  std::shared_ptr<Backend> b;
  {
    absl::MutexLock lock(&mu_);
    if (!connected_ || backend_ == nullptr) return;
    generation = generation_;
    b = backend_;
  }
  OnLost(generation, why);
  {
    absl::MutexLock lock(&mu_);
    if (generation == generation_) ++generation_;  // its late callbacks are ignored
  }
  b->Stop();
}

void Resource::Shutdown() {
  std::shared_ptr<Backend> b;
  {
    absl::MutexLock lock(&mu_);
    b = std::move(backend_);
    connected_ = false;
    ++generation_;
  }
  if (b) b->Stop();
}

}  // namespace dpproxy
