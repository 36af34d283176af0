#include "proxy/server/shared_ids.h"

#include <map>

#include <glog/logging.h>

#include "absl/time/clock.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"

namespace dpproxy {

void SharedIds::Check() {
  const std::vector<ServedResource*> served = table_->All();
  std::vector<std::pair<std::string, Resource::Snapshot>> lists;
  uint64_t versions = served.size();
  for (ServedResource* e : served) {
    lists.emplace_back(e->resource->name(), e->resource->Current());
    versions += lists.back().second.version;
  }
  const absl::Time now = absl::Now();
  if (versions == checked_ || now < checked_at_ + absl::Seconds(2)) return;
  checked_ = versions;
  checked_at_ = now;
  if (lists.size() < 2) return;
  // Each ID to the first resource listing it; a later one listing it too
  // is a pair.
  absl::flat_hash_map<absl::string_view, size_t> first;
  std::map<std::pair<size_t, size_t>, Shared> pairs;
  for (size_t r = 0; r < lists.size(); ++r) {
    const DeviceList& list = *lists[r].second.list;
    for (int i = 0; i < list.size(); ++i) {
      const absl::string_view id = list.device(i).id;
      auto [it, fresh] = first.try_emplace(id, r);
      if (fresh || it->second == r) continue;
      Shared& s = pairs[{it->second, r}];
      ++s.count;
      if (s.ids.size() < 5) s.ids.emplace_back(id);
    }
  }
  for (auto& [rs, s] : pairs) {
    s.a = lists[rs.first].first;
    s.b = lists[rs.second].first;
    if (s.b < s.a) std::swap(s.a, s.b);
    if (told_.insert({s.a, s.b}).second) {
      LOG(WARNING) << "resources " << s.a << " and " << s.b << " both show the kubelet "
                   << s.count << " device ID(s) (" << absl::StrJoin(s.ids, ", ")
                   << (s.count > s.ids.size() ? ", ..." : "")
                   << "): a kubelet before 1.37 puts the health of one resource's device on "
                      "the pods of the other (allocatedResourcesStatus); give one of them an "
                      "ID map or compact IDs";
      events_->Emit("device_ids_shared", {{"resources", {s.a, s.b}},
                                          {"count", s.count},
                                          {"first", s.ids}});
    }
  }
}

}  // namespace dpproxy
