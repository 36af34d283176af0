#include "proxy/server/withheld.h"

#include <glog/logging.h>

#include <set>

#include "proxy/holders/held_elsewhere.h"

namespace dpproxy {

bool Withheld::Changed() {
  const uint64_t version = reconciler_ ? reconciler_->forgotten()->version() : 0;
  const uint64_t released = keeper_->released_version();
  const uint64_t served = table_->served_version();
  const uint64_t cordons = cordons_ ? cordons_->version() : 0;
  if (version == applied_forgotten_ && released == applied_released_ &&
      served == applied_served_ && cordons == applied_cordons_) {
    return false;
  }
  applied_cordons_ = cordons;
  applied_forgotten_ = version;
  applied_released_ = released;
  applied_served_ = served;
  return true;
}

void Withheld::ApplyHeldAcrossPaths() {
  const uint64_t version = keeper_->held_across_version();
  const uint64_t served = table_->served_version();
  if (version == applied_across_ && served == applied_across_served_) return;
  applied_across_ = version;
  applied_across_served_ = served;
  std::map<std::string, StateKeeper::HeldAcross> held = keeper_->HeldAcrossPaths();
  if (held.empty()) return;
  for (ServedResource* e : table_->All()) {
    auto h = held.find(e->resource->name());
    if (h == held.end()) continue;
    e->resource->SetHeldAcrossPaths(std::move(h->second.by_claims),
                                    std::move(h->second.by_pod_claims),
                                    std::move(h->second.by_pods));
  }
}

void Withheld::Apply() {
  absl::MutexLock guard(&apply_mu_);
  ApplyHeldAcrossPaths();
  if (!Changed()) return;
  Rows rows;
  // Held by containers the kubelet forgot: real health, steered around.
  const std::map<std::string, std::map<std::string, std::string>> forgotten =
      reconciler_ ? reconciler_->forgotten()->Devices(&rows.forgotten)
                  : std::map<std::string, std::map<std::string, std::string>>();
  // A renamed or re-mapped resource while pods held its devices: the
  // kubelet knows those allocations by their old name and ID only.
  std::map<std::string, ServedAs> served_as;
  std::map<std::string, std::string> backend_of;
  std::set<std::string> not_served = statics_->removed();
  const ProxyConfig live = table_->live();
  for (const auto& [e, facts] : table_->AllWithFacts()) {
    const std::string& name = e->resource->name();
    if (facts.backend_resource.empty()) continue;
    backend_of[name] = facts.backend_resource;
    if (not_served.count(name) > 0) continue;
    const std::string now = KubeletResourceName(live, facts.backend_resource);
    if (now != name) {
      rows.renamed[name] = now;
      not_served.insert(name);
      continue;
    }
    Resource* r = e->resource.get();
    ServedAs as{name, nullptr};
    if (r->maps_ids()) as.kubelet_id = [r](const std::string& id) { return r->ToKubeletId(id); };
    served_as[facts.backend_resource] = std::move(as);
  }
  // Read in place: at 50,000 allocations a copy would cost more than the
  // pass, which skips every record made under the name and IDs shown now.
  HeldElsewhereFinder finder(served_as, backend_of);
  keeper_->ForEachAllocation([&finder](const state::Allocation& a) { finder.Add(a); });
  std::map<std::string, std::set<std::string>> held;  // shown Unhealthy
  for (const auto& [resource, by_id] : finder.Take()) {
    for (const auto& [id, h] : by_id) {
      held[resource].insert(id);
      rows.held_elsewhere.push_back(HeldElsewhereStatus{resource, id, h.held_as_resource,
                                                        h.held_as_device, h.allocation, h.pod});
    }
  }
  // Taken out of service by hand.
  if (cordons_) {
    for (const Cordon& c : cordons_->List()) {
      held[c.resource].insert(c.device);
      rows.cordoned.push_back(CordonStatus{c.resource, c.device, c.reason,
                                           absl::ToUnixMillis(c.since), c.by_uid, c.by_pid});
    }
  }
  // The resources first: once the status shows a hold, Allocates see it.
  SetOnResources(held, forgotten, not_served);
  absl::MutexLock lock(&rows_mu_);
  if (rows.held_elsewhere.size() != rows_.held_elsewhere.size()) {
    LOG(WARNING) << rows.held_elsewhere.size()
                 << " device(s) are held under another name or ID than they are served as "
                    "now (renames, ID maps or compact IDs changed while pods held them); "
                    "reported Unhealthy until their pods are gone";
    events_->Emit("devices_held_elsewhere", {{"devices", rows.held_elsewhere.size()}});
  }
  rows_ = std::move(rows);
  ++rows_version_;  // the status shows them: written again
}

void Withheld::SetOnResources(
    const std::map<std::string, std::set<std::string>>& held,
    const std::map<std::string, std::map<std::string, std::string>>& forgotten,
    const std::set<std::string>& not_served) {
  for (ServedResource* e : table_->All()) {
    Resource* r = e->resource.get();
    if (not_served.count(r->name()) > 0) {
      // No new pod gets a device under a name no longer served.
      const Resource::Snapshot snap = r->Current();
      std::set<std::string> all;
      for (int i = 0; i < snap.list->size(); ++i) all.insert(std::string(snap.list->device(i).id));
      r->SetShownUnhealthy(std::move(all));
      r->SetForgotten({});
      continue;
    }
    auto h = held.find(r->name());
    r->SetShownUnhealthy(h == held.end() ? std::set<std::string>() : h->second);
    auto f = forgotten.find(r->name());
    r->SetForgotten(f == forgotten.end() ? Resource::Forgotten() : f->second);
  }
}

Withheld::Rows Withheld::rows() {
  absl::MutexLock lock(&rows_mu_);
  return rows_;
}

}  // namespace dpproxy
