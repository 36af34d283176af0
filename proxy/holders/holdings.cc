#include "proxy/holders/holdings.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace dpproxy {

size_t Holdings::AddHolder(PodHolder holder) {
  holders_.push_back(std::move(holder));
  return holders_.size() - 1;
}

void Holdings::AddDevice(size_t holder, const std::string& resource,
                         const std::string& device_id) {
  std::vector<size_t>& h = held_[{resource, device_id}];
  if (h.empty() || h.back() != holder) h.push_back(holder);
}

void Holdings::AddPod(const std::string& pod_namespace, const std::string& pod_name) {
  pods_.insert(absl::StrCat(pod_namespace, "/", pod_name));
}

bool Holdings::HasPod(const std::string& pod_namespace, const std::string& pod_name) const {
  return pods_.count(absl::StrCat(pod_namespace, "/", pod_name)) > 0;
}

std::map<uint64_t, size_t> Holdings::Match(const state::State& st) const {
  std::map<uint64_t, size_t> out;
  // Devices given to a newer matched allocation.
  std::set<std::pair<std::string, std::string>> claimed;
  for (int i = st.allocations_size() - 1; i >= 0; --i) {
    const state::Allocation& a = st.allocations(i);
    if (a.device_ids_size() == 0) continue;
    std::vector<size_t> candidates;
    bool superseded = false;
    for (int k = 0; k < a.device_ids_size(); ++k) {
      const std::pair<std::string, std::string> key{a.resource(), a.device_ids(k)};
      if (claimed.count(key) > 0) superseded = true;
      auto h = held_.find(key);
      const std::vector<size_t> empty;
      const std::vector<size_t>& here = h == held_.end() ? empty : h->second;
      if (k == 0) {
        candidates = here;
      } else {
        std::vector<size_t> both;
        std::set_intersection(candidates.begin(), candidates.end(), here.begin(), here.end(),
                              std::back_inserter(both));
        candidates = std::move(both);
      }
    }
    if (superseded || candidates.empty()) continue;
    out[a.id()] = candidates.front();
    for (const std::string& id : a.device_ids()) claimed.insert({a.resource(), id});
  }
  return out;
}

}  // namespace dpproxy
