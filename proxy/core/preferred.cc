#include "proxy/core/preferred.h"

#include <algorithm>
#include <set>

namespace dpproxy {

PreferredChoice ChoosePreferred(const v1beta1::ContainerPreferredAllocationRequest& request,
                                const std::vector<std::string>& backend_picks,
                                const std::map<std::string, std::string>& held) {
  PreferredChoice out;
  const std::set<std::string> available(request.available_deviceids().begin(),
                                        request.available_deviceids().end());
  const size_t size = static_cast<size_t>(std::max(0, request.allocation_size()));
  std::set<std::string> chosen;
  auto take = [&](const std::string& id) {
    if (out.ids.size() >= size || chosen.count(id) > 0 || available.count(id) == 0) return;
    chosen.insert(id);
    out.ids.push_back(id);
  };
  auto is_held = [&held](const std::string& id) { return held.count(id) > 0; };
  for (const std::string& id : request.must_include_deviceids()) take(id);
  for (const std::string& id : backend_picks) {
    if (!is_held(id)) take(id);
  }
  for (const std::string& id : request.available_deviceids()) {
    if (!is_held(id)) take(id);
  }
  for (const std::string& id : backend_picks) take(id);
  for (const std::string& id : request.available_deviceids()) take(id);
  for (const std::string& id : available) {
    if (is_held(id) && chosen.count(id) == 0) ++out.avoided;
  }
  for (const std::string& id : out.ids) {
    if (is_held(id)) ++out.held_named;
  }
  return out;
}

}  // namespace dpproxy
