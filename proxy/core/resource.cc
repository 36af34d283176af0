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
      ids_(std::make_shared<const IdPolicy>(IdPolicy{policy_.id_map, policy_.compact_ids})) {}

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
  if (!shown_unhealthy_.empty()) {
    // Looked up by view: no ID is copied per device.
    const absl::flat_hash_set<absl::string_view> unhealthy(shown_unhealthy_.begin(),
                                                           shown_unhealthy_.end());
    shown = base_->WithHealth([&unhealthy](const DeviceList::View& d) -> absl::string_view {
      return unhealthy.contains(d.id) ? kUnhealthy : absl::string_view();
    });
  }
  snapshot_.list = std::move(shown);
  snapshot_.to_device_plugins = snapshot_.list;
  if (withdrawn_from_device_plugins_) {
    snapshot_.to_device_plugins = snapshot_.list->WithHealth(
        [](const DeviceList::View&) -> absl::string_view { return kUnhealthy; });
  } else if (held_by_claims_.size() > held_by_pod_claims_.size()) {
    absl::flat_hash_set<absl::string_view> claimed;
    for (const std::string& d : held_by_claims_) {
      if (held_by_pod_claims_.count(d) == 0) claimed.insert(d);
    }
    snapshot_.to_device_plugins =
        snapshot_.list->WithHealth([&claimed](const DeviceList::View& d) -> absl::string_view {
          return claimed.contains(d.id) ? kUnhealthy : absl::string_view();
        });
  }
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
  if (!hooks_.check_forgotten) return false;
  return hooks_.check_forgotten(per_container, readmission);
}

std::set<std::string> Resource::StillForgotten(const std::vector<std::string>& ids) {
  if (!hooks_.still_forgotten) return {ids.begin(), ids.end()};
  return hooks_.still_forgotten(ids);
}

std::vector<std::string> Resource::ReadmissionPick(int size,
                                                   const std::set<std::string>& available) {
  return hooks_.readmission_pick ? hooks_.readmission_pick(size, available)
                                 : std::vector<std::string>();
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

namespace {

// Whether `id` has control characters. A kubelet accepts them end to end
// (observed on 1.36), and a node may run pods under them already: they are
// served as they are, unless the resource's IDs are compact; dpproxy's own
// logs, events and tables escape them.
bool HasControlCharacters(absl::string_view id) {
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

// Refuses a backend's list with an empty ID.
absl::Status ValidateBackendDevices(const DeviceList& devices) {
  for (int i = 0; i < devices.size(); ++i) {
    if (devices.device(i).id.empty()) return absl::InvalidArgumentError("a device ID is empty");
  }
  return absl::OkStatus();
}

// One device per ID, as the kubelet keeps them (its device manager's
// genericDeviceUpdateCallback): a device listed more than once is kept at
// its first place with the last entry's fields (the kubelet's map of
// devices keeps the last), and Healthy if any entry is (the kubelet puts it
// in its healthy set then, and allocates it). `*collapsed` is how many
// entries went; the list itself when none did.
std::shared_ptr<const DeviceList> CollapseDuplicateIds(std::shared_ptr<const DeviceList> devices,
                                                       int* collapsed, std::string* first) {
  *collapsed = 0;
  const int n = devices->size();
  std::vector<int> last;        // by first position: the last entry of that ID
  std::vector<bool> healthy;    // by first position: some entry is Healthy
  for (int i = 0; i < n; ++i) {
    const DeviceList::View d = devices->device(i);
    const int at = *devices->Find(d.id);
    if (at == i) continue;
    if (*collapsed == 0) {
      last.resize(static_cast<size_t>(n), -1);
      healthy.resize(static_cast<size_t>(n), false);
      *first = std::string(d.id);
    }
    ++*collapsed;
  }
  if (*collapsed == 0) return devices;
  for (int i = 0; i < n; ++i) {
    const DeviceList::View d = devices->device(i);
    const int at = *devices->Find(d.id);
    last[static_cast<size_t>(at)] = i;
    if (d.health == kHealthy) healthy[static_cast<size_t>(at)] = true;
  }
  DeviceList::Builder kept(static_cast<size_t>(n - *collapsed), devices->bytes());
  for (int i = 0; i < n; ++i) {
    if (last[static_cast<size_t>(i)] < 0) continue;  // not a first entry
    DeviceList::View d = devices->device(last[static_cast<size_t>(i)]);
    if (healthy[static_cast<size_t>(i)]) d.health = kHealthy;
    kept.Add(d);
  }
  return std::move(kept).Build();
}

}  // namespace

bool Resource::RefuseMalformed(uint64_t generation, const DeviceList& devices) {
  absl::Status s = ValidateBackendDevices(devices);
  if (s.ok()) return false;
  bool first;
  bool had_list;
  {
    absl::MutexLock lock(&mu_);
    if (generation == generation_) listed_ = true;
    first = list_refused_ != s.message();
    list_refused_ = std::string(s.message());
    had_list = !base_->empty();
  }
  if (first) {
    LOG(ERROR) << "resource " << name_ << ": the backend sent a device list dpproxy refuses ("
               << s.message() << "); "
               << (had_list ? "the kubelet keeps the list before it"
                            : "the kubelet is shown no device until a list is taken");
  }
  events_->Emit("device_list_refused", {{"resource", name_},
                                        {"devices", devices.size()},
                                        {"error", std::string(s.message())}});
  return true;
}

std::shared_ptr<const DeviceList> Resource::CollapseDuplicates(
    std::shared_ptr<const DeviceList> devices) {
  int collapsed = 0;
  std::string first;
  devices = CollapseDuplicateIds(std::move(devices), &collapsed, &first);
  bool tell;
  {
    absl::MutexLock lock(&mu_);
    tell = collapsed != ids_collapsed_;
    ids_collapsed_ = collapsed;
  }
  if (tell && collapsed > 0) {
    LOG(WARNING) << "resource " << name_ << ": the plugin lists " << collapsed
                 << " device entries under an ID listed before (first: " << GoQuote(first)
                 << "); each ID is one device, Healthy if any of its entries is, as the "
                    "kubelet keeps them";
    events_->Emit("device_ids_collapsed", {{"resource", name_},
                                            {"entries", collapsed},
                                            {"devices", devices->size()},
                                            {"first", EchoField(first)}});
  }
  return devices;
}

std::shared_ptr<const DeviceList> Resource::RelabelUnknownHealth(
    std::shared_ptr<const DeviceList> devices) {
  // The kubelet reads anything but "Healthy" as unhealthy; say so plainly.
  int relabelled = 0;
  std::string first_relabelled;
  devices = devices->WithHealth([&](const DeviceList::View& d) -> absl::string_view {
    if (d.health == kHealthy || d.health == kUnhealthy) return {};
    if (relabelled++ == 0) first_relabelled = std::string(d.id);
    return kUnhealthy;
  });
  if (relabelled > 0) {
    LOG(WARNING) << "resource " << name_ << ": " << relabelled
                 << " device(s) have a health other than Healthy or Unhealthy (first: "
                 << GoQuote(first_relabelled) << "); reported Unhealthy, as a kubelet reads them";
    events_->Emit("device_health_unknown", {{"resource", name_},
                                            {"devices", relabelled},
                                            {"first", EchoField(first_relabelled)}});
  }
  return devices;
}

std::shared_ptr<const Resource::IdPolicy> Resource::IdPolicyFor(const DeviceList& devices) {
  std::shared_ptr<const IdPolicy> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = ids_;
  }
  // A list the kubelet cannot take (over its 4 MiB) under the plugin's own
  // IDs, none of which an allocation holds (the kubelet never saw them):
  // compact IDs go on by themselves, for good, as --compact_ids would.
  if (!ids->compact_ids && devices.bytes() > kKubeletMaxListBytes) {
    bool held = false;
    for (int i = 0; i < devices.size() && !held && hooks_.is_allocated; ++i) {
      held = hooks_.is_allocated(std::string(devices.device(i).id));
    }
    if (!held) {
      auto next = std::make_shared<IdPolicy>(*ids);
      next->compact_ids = next->compact_by_itself = true;
      {
        absl::MutexLock lock(&mu_);
        ids_ = next;
      }
      ids = next;
      LOG(WARNING) << "resource " << name_ << ": the plugin's device list is "
                   << devices.bytes() << " bytes (" << devices.size()
                   << " devices), more than the kubelet accepts in one message ("
                   << kKubeletMaxListBytes
                   << "), and no pod holds its devices: compact device IDs are on for it from "
                      "now on, across restarts (kept in the state)";
      events_->Emit("compact_ids_on", {{"resource", name_},
                                       {"bytes", devices.bytes()},
                                       {"devices", devices.size()}});
    } else {
      LOG_EVERY_N(ERROR, 100) << "resource " << name_ << ": the plugin's device list is "
                              << devices.bytes()
                              << " bytes, more than the kubelet accepts, and pods hold devices "
                                 "under its IDs: compact IDs would rename them, so they stay "
                                 "off (see dpproxy status)";
    }
  }
  return ids;
}

void Resource::WarnOfControlCharacters(const IdPolicy& ids, const DeviceList& devices) {
  // IDs with control characters: shown compact under compact_ids, else as
  // they are.
  if (!ids.compact_ids) {
    int raw = 0;
    std::string first_raw;
    for (int i = 0; i < devices.size(); ++i) {
      if (HasControlCharacters(devices.device(i).id) && raw++ == 0) {
        first_raw = std::string(devices.device(i).id);
      }
    }
    if (raw > 0 && !warned_raw_control_.exchange(true)) {
      LOG(WARNING) << "resource " << name_ << ": " << raw
                   << " device ID(s) contain control characters (first: " << GoQuote(first_raw)
                   << "); they are served to the kubelet as they are, which it accepts (logs, "
                      "events and dpproxy's tables escape them; compact_ids would rename them)";
      events_->Emit("device_ids_control_characters",
                    {{"resource", name_}, {"devices", raw}, {"first", EchoField(first_raw)}});
    }
  }
}

Resource::Renamed Resource::ApplyIdPolicy(const IdPolicy& ids,
                                          std::shared_ptr<const DeviceList> devices) {
  Renamed out;
  out.list = std::move(devices);
  if (ids.id_map.empty() && !ids.compact_ids) return out;
  if (ids.compact_ids) out.to_backend.reserve(static_cast<size_t>(out.list->size()));
  // The kubelet-side IDs given so far (views into `renamed` or `devices`).
  absl::flat_hash_set<std::string> taken;
  DeviceList::Builder renamed(static_cast<size_t>(out.list->size()), out.list->bytes());
  int collisions = 0;
  for (int i = 0; i < out.list->size(); ++i) {
    DeviceList::View d = out.list->device(i);
    std::string kubelet_id;
    auto m = ids.id_map.find(std::string(d.id));
    if (m != ids.id_map.end()) {
      kubelet_id = m->second;
      out.to_backend[kubelet_id] = std::string(d.id);
    } else if (ids.compact_ids) {
      if (HasControlCharacters(d.id) && out.mapped++ == 0) out.first_mapped = std::string(d.id);
      std::string compact = CompactDeviceId(d.id);
      if (out.to_backend.count(compact) == 0 && taken.count(compact) == 0 &&
          !out.list->Contains(compact)) {
        out.to_backend.emplace(compact, std::string(d.id));
        kubelet_id = std::move(compact);
      } else {
        ++collisions;  // (one in 10^9 at 100,000 devices) it keeps its own ID
      }
    }
    if (!kubelet_id.empty()) d.id = kubelet_id;
    taken.insert(std::string(d.id));
    renamed.Add(d);
  }
  out.list = std::move(renamed).Build();
  if (collisions > 0) {
    LOG(ERROR) << "resource " << name_ << ": " << collisions
               << " device(s) keep their own ID: their compact ID is taken";
  }
  return out;
}

Resource::Vanished Resource::FindVanished(const DeviceList& before, const DeviceList& now) {
  Vanished out;
  for (int i = 0; i < before.size(); ++i) {
    if (now.Contains(before.device(i).id)) continue;
    const std::string id(before.device(i).id);
    if (hooks_.is_allocated && hooks_.is_allocated(id)) {
      out.keep_at.push_back(i);
      out.kept.push_back(id);
    } else {
      out.dropped.push_back(id);
    }
  }
  return out;
}

namespace {

// `list`, then the devices of `before` at `keep_at`, Unhealthy.
std::shared_ptr<const DeviceList> WithKept(const DeviceList& list, const DeviceList& before,
                                           const std::vector<int>& keep_at) {
  DeviceList::Builder with_kept(static_cast<size_t>(list.size()) + keep_at.size(), list.bytes());
  for (int i = 0; i < list.size(); ++i) with_kept.Add(list.device(i));
  for (int i : keep_at) {
    DeviceList::View d = before.device(i);
    d.health = kUnhealthy;
    with_kept.Add(d);
  }
  return std::move(with_kept).Build();
}

}  // namespace

void Resource::TellMapped(const Renamed& r) {
  LOG(WARNING) << "resource " << name_ << ": " << r.mapped
               << " device ID(s) contain control characters (first: " << GoQuote(r.first_mapped)
               << "); the kubelet is shown their compact IDs, the plugin still gets its own";
  events_->Emit("device_ids_mapped", {{"resource", name_},
                                      {"devices", r.mapped},
                                      {"first", EchoField(r.first_mapped)}});
}

bool Resource::Publish(uint64_t generation, Renamed r) {
  // Devices the kubelet knew that the backend no longer reports. Whether an
  // allocation holds them is asked outside the lock (the state keeper may
  // be writing to disk); retried if the list changed meanwhile.
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<const DeviceList> before;
    uint64_t seen_version;
    {
      ChangeLock lock(this);
      if (generation != generation_) return false;  // a replaced backend
      seen_version = snapshot_.version;
      before = reported_;
    }
    const Vanished gone = FindVanished(*before, *r.list);
    {
      ChangeLock lock(this);
      if (generation != generation_) return false;
      if (snapshot_.version != seen_version && attempt < 3) continue;  // changed: again
      std::shared_ptr<const DeviceList> shown = r.list;
      if (!gone.kept.empty() || !gone.dropped.empty()) {
        // Never silently renamed or dropped while an allocation holds them:
        // they stay, Unhealthy. Others are dropped, as a kubelet would.
        LOG(WARNING) << "resource " << name_ << ": the backend no longer reports "
                     << gone.kept.size() + gone.dropped.size() << " device(s); "
                     << gone.kept.size() << " held by allocations stay listed as Unhealthy, "
                     << gone.dropped.size() << " are dropped";
        events_->Emit("devices_vanished",
                      {{"resource", name_},
                       {"kept_unhealthy", gone.kept.size()},
                       {"dropped", gone.dropped.size()},
                       {"first_kept", gone.kept.empty() ? "" : gone.kept[0]},
                       {"first_dropped", gone.dropped.empty() ? "" : gone.dropped[0]}});
      }
      if (!gone.keep_at.empty()) shown = WithKept(*r.list, *before, gone.keep_at);
      to_backend_ = std::move(r.to_backend);
      listed_ = true;
      list_refused_.clear();
      if (r.mapped != ids_mapped_) {
        ids_mapped_ = r.mapped;
        if (r.mapped > 0) TellMapped(r);
      }
      // What the backend reports is what the kubelet is shown: one list.
      PublishBaseLocked(std::move(shown));
      reported_ = base_;
      VLOG(1) << "resource " << name_ << ": " << reported_->size() << " devices, "
              << snapshot_.list->healthy() << " healthy";
      events_->Emit("devices", {{"resource", name_},
                                {"total", reported_->size()},
                                {"healthy", snapshot_.list->healthy()},
                                {"version", snapshot_.version}});
      break;
    }
  }
  return true;
}

void Resource::OnDevices(uint64_t generation, std::shared_ptr<const DeviceList> devices) {
  // Once the backend has sent a list it knows its devices, and calls held
  // for it go on (a kubelet never calls before a connection's first list,
  // and plugins that learn their devices in ListAndWatch rely on that):
  // `listed_` is set where the list is taken, with the ID mapping that
  // calls translate through, never before it.
  if (RefuseMalformed(generation, *devices)) {
    // Nothing of a malformed list reaches the kubelet: the previous one stays.
    if (hooks_.on_change) hooks_.on_change();
    return;
  }
  devices = RelabelUnknownHealth(CollapseDuplicates(std::move(devices)));
  const std::shared_ptr<const IdPolicy> ids = IdPolicyFor(*devices);
  WarnOfControlCharacters(*ids, *devices);
  if (!Publish(generation, ApplyIdPolicy(*ids, std::move(devices)))) return;
  if (hooks_.on_change) hooks_.on_change();
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
  connected_ = false;
  ++changes_;
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
  events_->Emit("backend_down", {{"resource", name_},
                                 {"endpoint", backend_ ? backend_->endpoint() : ""},
                                 {"reason", why}});
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
  ChangeLock lock(this);
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
