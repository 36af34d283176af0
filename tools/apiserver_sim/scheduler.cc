#include "tools/apiserver_sim/scheduler.h"

#include <map>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;

// The free devices of the driver's pools, in pool then slice order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FreeDevices(
    KubeClient* client, const std::string& version, const ClaimAllocation& a,
    std::set<std::string>* pools_seen) {
  std::string selector = absl::StrCat("spec.driver%3D", a.driver);
  if (!a.node.empty()) absl::StrAppend(&selector, "%2Cspec.nodeName%3D", a.node);
  absl::StatusOr<Json> slices =
      client->Get(absl::StrCat("/apis/", version, "/resourceslices?fieldSelector=", selector));
  if (!slices.ok()) return slices.status();
  absl::StatusOr<Json> claims = client->Get(absl::StrCat("/apis/", version, "/resourceclaims"));
  if (!claims.ok()) return claims.status();
  std::set<std::tuple<std::string, std::string>> taken;  // (pool, device)
  for (const Json& c : claims->value("items", Json::array())) {
    const Json results =
        c.value("/status/allocation/devices/results"_json_pointer, Json::array());
    for (const Json& r : results) {
      if (r.value("driver", "") == a.driver) taken.insert({r.value("pool", ""), r.value("device", "")});
    }
  }
  // Each pool's newest generation only: older slices are on their way out.
  std::map<std::string, int64_t> newest;
  for (const Json& s : slices->value("items", Json::array())) {
    const Json pool = s.value("/spec/pool"_json_pointer, Json::object());
    int64_t& g = newest[pool.value("name", "")];
    g = std::max<int64_t>(g, pool.value("generation", int64_t{0}));
  }
  std::map<std::string, std::vector<std::string>> by_pool;
  for (const Json& s : slices->value("items", Json::array())) {
    if (s.value("/spec/driver"_json_pointer, std::string()) != a.driver) continue;
    const Json pool = s.value("/spec/pool"_json_pointer, Json::object());
    const std::string name = pool.value("name", "");
    if (!a.pool.empty() && name != a.pool) continue;
    if (pool.value("generation", int64_t{0}) != newest[name]) continue;
    pools_seen->insert(name);
    for (const Json& d : s.value("/spec/devices"_json_pointer, Json::array())) {
      const std::string device = d.value("name", "");
      if (taken.count({name, device}) == 0) by_pool[name].push_back(device);
    }
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [pool, devices] : by_pool) {
    for (const std::string& d : devices) out.emplace_back(pool, d);
  }
  return out;
}

}  // namespace

absl::StatusOr<Json> CreateAllocatedClaim(KubeClient* client, const ClaimAllocation& a) {
  absl::StatusOr<Json> group = client->Get("/apis/resource.k8s.io");
  if (!group.ok()) return group.status();
  const std::string version = group->value("/preferredVersion/groupVersion"_json_pointer,
                                           std::string("resource.k8s.io/v1"));
  std::vector<std::pair<std::string, std::string>> chosen;  // (pool, device)
  if (!a.devices.empty()) {
    for (const std::string& d : a.devices) chosen.emplace_back(a.pool, d);
  } else {
    std::set<std::string> pools;
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> free =
        FreeDevices(client, version, a, &pools);
    if (!free.ok()) return free.status();
    if (static_cast<int>(free->size()) < a.count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot allocate ", a.count, " device(s) of driver ", a.driver, ": ", free->size(),
          " free in ",
          pools.empty() ? std::string("no published pool")
                        : absl::StrCat("pool(s) ", absl::StrJoin(pools, ", ")),
          a.node.empty() ? "" : absl::StrCat(" on node ", a.node)));
    }
    chosen.assign(free->begin(), free->begin() + a.count);
  }
  const std::string base =
      absl::StrCat("/apis/", version, "/namespaces/", a.namespace_, "/resourceclaims");
  absl::StatusOr<Json> made =
      client->Post(base, {{"metadata", {{"name", a.name}}}, {"spec", Json::object()}});
  if (!made.ok()) return made.status();
  Json results = Json::array();
  for (const auto& [pool, device] : chosen) {
    results.push_back(
        {{"request", a.request}, {"driver", a.driver}, {"pool", pool}, {"device", device}});
  }
  (*made)["status"] = {{"allocation", {{"devices", {{"results", results}}}}}};
  return client->Put(absl::StrCat(base, "/", a.name, "/status"), *made);
}

}  // namespace dpproxy::sim
