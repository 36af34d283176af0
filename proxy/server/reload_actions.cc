#include "proxy/server/reload_actions.h"

#include <glog/logging.h>

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/connect.h"

namespace dpproxy {

void ReloadActions::ApplyLossPolicy(const ProxyConfig& next) {
  p_.table->UpdateLive([&next](ProxyConfig& live) {
    live.policy.loss_policy = next.policy.loss_policy;
    live.policy.hold = next.policy.hold;
    live.policy.grace = next.policy.grace;
    live.policy.probe = next.policy.probe;
    live.policy.flap_damping = next.policy.flap_damping;
  });
  for (ServedResource* e : p_.table->All()) {
    e->resource->SetLossPolicy(next.policy.loss_policy, next.policy.hold, next.policy.grace);
    e->resource->SetProbe(next.policy.probe);
    e->resource->SetFlapDamping(next.policy.flap_damping);
  }
}

void ReloadActions::ApplyCallSettings(const ProxyConfig& next) {
  p_.table->UpdateLive([&next](ProxyConfig& live) {
    live.kubelet.backend_timeout = next.kubelet.backend_timeout;
    live.kubelet.cdi_annotations = next.kubelet.cdi_annotations;
    live.dial_timeout = next.dial_timeout;
  });
  p_.side->SetCallSettings(next.kubelet.backend_timeout, next.kubelet.cdi_annotations);
  if (p_.registration) p_.registration->SetDialTimeout(next.dial_timeout);
}

void ReloadActions::RemoveStaticBackend(const StaticBackendConfig& b) {
  const std::string name = p_.table->ServedName(b.resource);
  ServedResource* e = p_.statics->Remove(name, b) ? p_.table->Find(name) : nullptr;
  // Not used any more: its connection ends now, and its devices are
  // shown Unhealthy (withheld.h) unless it is added back.
  std::shared_ptr<Backend> open = e ? e->resource->attached_backend() : nullptr;
  if (open != nullptr && open->endpoint() == b.endpoint) {
    e->resource->DetachBackend("static backend removed from the configuration");
  }
  LOG(INFO) << "reload: static backend " << b.endpoint << " of " << b.resource
            << " is no longer dialled; " << name << " shows its devices Unhealthy";
  p_.events->Emit("static_backend_removed", {{"resource", name}, {"endpoint", b.endpoint}});
}

void ReloadActions::AddStaticBackend(const StaticBackendConfig& b) {
  const std::string name = p_.table->ServedName(b.resource);
  (void)p_.ensure_entry(name);
  p_.statics->Dial(name, b);
  LOG(INFO) << "reload: static backend " << b.endpoint << " of " << b.resource
            << " is dialled from now on";
  p_.events->Emit("static_backend_added", {{"resource", name}, {"endpoint", b.endpoint}});
}

void ReloadActions::StaticBackendsApplied(const ProxyConfig& next) {
  p_.table->UpdateLive([&next](ProxyConfig& live) { live.static_backends = next.static_backends; });
  p_.table->NoteServedChange();
}

namespace {

std::map<std::string, std::string> IdMapOf(const ProxyConfig& c, const std::string& resource) {
  auto it = c.id_maps.find(resource);
  return it == c.id_maps.end() ? std::map<std::string, std::string>() : it->second;
}

// A resource whose name or IDs a reload changes.
struct NameChange {
  ServedResource* entry;
  std::string to;  // the name served as from now on
  bool ids;        // the same name with other IDs
};

std::vector<NameChange> NameChanges(ResourceTable& table, const ProxyConfig& live,
                                    const ProxyConfig& next) {
  std::vector<NameChange> out;
  for (const auto& [e, facts] : table.AllWithFacts()) {
    const std::string& name = e->resource->name();
    const std::string& plugin = facts.backend_resource;
    if (plugin.empty() || KubeletResourceName(live, plugin) != name) continue;  // renamed
    const std::string to = KubeletResourceName(next, plugin);
    const bool ids = to == name && (IdMapOf(live, name) != IdMapOf(next, name) ||
                                    live.compact_ids.count(name) != next.compact_ids.count(name));
    if (to != name || ids) out.push_back({e, to, ids});
  }
  return out;
}

// "as a device plugin", "through DRA", "both as a device plugin and through
// DRA".
const char* PathDescription(KubeletPath p) {
  switch (p) {
    case KubeletPath::kDevicePlugin: return "as a device plugin";
    case KubeletPath::kDra: return "through DRA";
    case KubeletPath::kBoth: return "both as a device plugin and through DRA";
  }
  return "";
}

}  // namespace

void ReloadActions::ApplyServedNames(const ProxyConfig& next) {
  const ProxyConfig live = p_.table->live();
  const std::vector<NameChange> changes = NameChanges(*p_.table, live, next);
  p_.table->UpdateLive([&next](ProxyConfig& l) {
    l.renames = next.renames;
    l.id_maps = next.id_maps;
    l.compact_ids = next.compact_ids;
  });
  for (const NameChange& c : changes) {
    Resource* r = c.entry->resource.get();
    const std::string& from = r->name();
    bool dialled_by_dpproxy = p_.statics->dialled(from);
    if (c.ids) {
      r->SetIdPolicy(IdMapOf(next, from), next.compact_ids.count(from) > 0);
      LOG(INFO) << "reload: resource " << from << " shows the kubelet other device IDs from "
                << "its plugin's next list (ID map or compact IDs changed)";
      p_.events->Emit("resource_ids_changed", {{"resource", from}});
    } else {
      LOG(INFO) << "reload: resource " << from << " is served as " << c.to
                << " from now on; under " << from << " its devices are shown Unhealthy";
      p_.events->Emit("resource_renamed", {{"resource", from}, {"served_as", c.to}});
      (void)p_.ensure_entry(c.to);
      dialled_by_dpproxy = p_.statics->Move(from, c.to);
    }
    Redial(c.entry, c.ids ? std::string() : c.to, dialled_by_dpproxy, live.dial_timeout);
  }
  p_.table->NoteServedChange();  // renamed names and new IDs are known: shown at once
}

void ReloadActions::ApplyPaths(const ProxyConfig& next) {
  if (p_.split == nullptr) return;
  const ProxyConfig before = p_.table->live();
  ProxyConfig after = before;  // kubelet.api, the default, waits for a start
  after.paths = next.paths;
  p_.table->UpdateLive([&next](ProxyConfig& l) { l.paths = next.paths; });
  for (ServedResource* e : p_.table->All()) {
    const std::string& name = e->resource->name();
    const KubeletPath from = PathOf(before, name), to = PathOf(after, name);
    if (from == to) continue;
    LOG(INFO) << "reload: resource " << name << " is served " << PathDescription(to)
              << " from now on (was " << PathDescription(from) << ")";
    p_.events->Emit("resource_path_changed",
                    {{"resource", name}, {"from", KubeletPathName(from)},
                     {"to", KubeletPathName(to)}});
    p_.split->Reroute(e->allocator.get(), from, to);
  }
  p_.table->NoteServedChange();
}

void ReloadActions::Redial(ServedResource* e, const std::string& renamed_to,
                                    bool static_backend, absl::Duration dial_timeout) {
  // The plugin's next list must come to the new name, or with the new
  // IDs, and complete: it is dialled again, as a restart would.
  Resource* r = e->resource.get();
  std::shared_ptr<Backend> b = r->backend();
  if (b == nullptr) return;  // its next registration comes as configured now
  if (!renamed_to.empty() || static_backend) {
    r->DetachBackend(renamed_to.empty() ? std::string("dialled again for its new device IDs")
                                        : absl::StrCat("served as ", renamed_to, " from now on"));
  }
  if (static_backend) return;  // the static backends' tick dials it
  const std::string plugin = b->resource(), endpoint = b->endpoint();
  const ApiVersion api = b->api();
  const int max_bytes = p_.max_list_bytes;
  p_.workers->Submit([this, plugin, endpoint, api, dial_timeout, max_bytes] {
    absl::StatusOr<std::shared_ptr<Backend>> nb =
        ConnectBackend(plugin, endpoint, api, dial_timeout, max_bytes);
    if (!nb.ok()) {
      LOG(WARNING) << "reload: cannot dial " << endpoint << " again for " << plugin << ": "
                   << nb.status().message() << "; its next registration brings it back";
      return;
    }
    (void)p_.attach(*nb);
  });
}

}  // namespace dpproxy
