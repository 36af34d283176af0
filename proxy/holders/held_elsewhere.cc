#include "proxy/holders/held_elsewhere.h"

#include "absl/strings/str_cat.h"

namespace dpproxy {

void HeldElsewhereFinder::Add(const state::Allocation& a) {
  const std::string* backend = &a.backend_resource();
  if (backend->empty()) {
    auto b = backend_of_.find(a.resource());
    if (b == backend_of_.end()) return;  // nothing says which plugin it was
    backend = &b->second;
  }
  auto s = served_.find(*backend);
  if (s == served_.end()) return;  // not served now: nothing to show free
  const ServedAs& as = s->second;
  const bool same_name = as.resource == a.resource();
  // Records whose plugin IDs equal the kubelet's do not repeat them.
  const bool plugin_ids = a.backend_device_ids_size() == a.device_ids_size();
  if (same_name && !plugin_ids && !as.kubelet_id) return;  // as the kubelet knows it
  for (int i = 0; i < a.device_ids_size(); ++i) {
    const std::string& held_as = a.device_ids(i);
    const std::string& plugin_id = plugin_ids ? a.backend_device_ids(i) : held_as;
    std::string shown = as.kubelet_id ? as.kubelet_id(plugin_id) : plugin_id;
    if (same_name && shown == held_as) continue;
    HeldElsewhere h;
    h.allocation = a.id();
    h.held_as_resource = a.resource();
    h.held_as_device = held_as;
    if (!a.pod_name().empty()) h.pod = absl::StrCat(a.pod_namespace(), "/", a.pod_name());
    out_[as.resource].emplace(std::move(shown), std::move(h));
  }
}

std::map<std::string, std::map<std::string, HeldElsewhere>> DevicesHeldElsewhere(
    const state::State& allocations, const std::map<std::string, ServedAs>& served,
    const std::map<std::string, std::string>& backend_of) {
  HeldElsewhereFinder finder(served, backend_of);
  for (const state::Allocation& a : allocations.allocations()) finder.Add(a);
  return finder.Take();
}

}  // namespace dpproxy
