// Resource's device lists on their way from a backend to the kubelet
// (OnDevices, resource.h): refused when malformed, repeated IDs collapsed,
// unknown health relabelled, the ID policy applied, and devices an
// allocation holds kept when the backend no longer lists them.
#include <glog/logging.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/encoding.h"

namespace dpproxy {

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
      // Each device's health as the plugin reports it, for the damper
      // (which holds a flapping one Unhealthy in what is shown).
      if (damper_.on()) {
        const absl::Time now = absl::Now();
        for (int i = 0; i < r.list->size(); ++i) {
          const DeviceList::View d = r.list->device(i);
          damper_.Observe(d.id, d.health == kHealthy, now);
        }
        TellFlapsLocked(damper_.TakeStarted());
      }
      // What the backend reports is what the kubelet is shown: one list.
      const uint64_t shown_before = snapshot_.version;
      PublishBaseLocked(std::move(shown));
      reported_ = base_;
      // A silent backend's list (its stream still delivers) is kept for
      // when it answers; the loss policy's marking stays until then.
      if (silent_ && !keep_health_ && lost_at_.has_value() &&
          absl::Now() - *lost_at_ >= LossHoldLocked()) {
        MarkAllLocked(std::string(kUnhealthy));
      }
      // Nothing new shown (a flip of a device held for flapping): no event.
      if (snapshot_.version == shown_before) break;
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

}  // namespace dpproxy
