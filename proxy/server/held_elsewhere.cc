#include "proxy/server/held_elsewhere.h"

#include "absl/strings/str_cat.h"

namespace dpproxy {

std::map<std::string, std::map<std::string, HeldElsewhere>> DevicesHeldElsewhere(
    const state::State& allocations, const std::map<std::string, ServedAs>& served,
    const std::map<std::string, std::string>& backend_of) {
  std::map<std::string, std::map<std::string, HeldElsewhere>> out;
  for (const state::Allocation& a : allocations.allocations()) {
    std::string backend = a.backend_resource();
    if (backend.empty()) {
      auto b = backend_of.find(a.resource());
      if (b == backend_of.end()) continue;  // nothing says which plugin it was
      backend = b->second;
    }
    auto s = served.find(backend);
    if (s == served.end()) continue;  // not served now: nothing to show free
    // Records whose plugin IDs equal the kubelet's do not repeat them.
    const bool plugin_ids = a.backend_device_ids_size() == a.device_ids_size();
    for (int i = 0; i < a.device_ids_size(); ++i) {
      const std::string& held_as = a.device_ids(i);
      const std::string shown =
          s->second.kubelet_id(plugin_ids ? a.backend_device_ids(i) : held_as);
      if (s->second.resource == a.resource() && shown == held_as) continue;  // as known
      HeldElsewhere h;
      h.allocation = a.id();
      h.held_as_resource = a.resource();
      h.held_as_device = held_as;
      if (!a.pod_name().empty()) h.pod = absl::StrCat(a.pod_namespace(), "/", a.pod_name());
      out[s->second.resource].emplace(shown, std::move(h));
    }
  }
  return out;
}

}  // namespace dpproxy
