#include "tools/apiserver_sim/scheduler.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;

// The free devices of the driver's pools, in pool then slice order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FreeDevices(
    KubeClient* client, const std::string& version, const ClaimAllocation& a,
    std::set<std::string>* pools_seen) {
  // (a.driver, a.node and a.pool say where to look.)
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

// The API server's preferred resource.k8s.io version ("resource.k8s.io/v1").
absl::StatusOr<std::string> PreferredVersion(KubeClient* client) {
  absl::StatusOr<Json> group = client->Get("/apis/resource.k8s.io");
  if (!group.ok()) return group.status();
  return group->value("/preferredVersion/groupVersion"_json_pointer,
                      std::string("resource.k8s.io/v1"));
}

std::string ShortageError(const ClaimAllocation& a, size_t free,
                          const std::set<std::string>& pools) {
  return absl::StrCat(
      "cannot allocate ", a.count, " device(s) of driver ", a.driver, ": ", free, " free in ",
      pools.empty() ? std::string("no published pool")
                    : absl::StrCat("pool(s) ", absl::StrJoin(pools, ", ")),
      a.node.empty() ? "" : absl::StrCat(" on node ", a.node));
}

// The DeviceClasses naming each extended resource (the first by name
// wins where several do), with their drivers.
struct ClassOf {
  std::string name;
  std::string driver;
};
absl::StatusOr<std::map<std::string, ClassOf>> ExtendedResourceClasses(
    KubeClient* client, const std::string& version) {
  absl::StatusOr<Json> classes = client->Get(absl::StrCat("/apis/", version, "/deviceclasses"));
  if (!classes.ok()) return classes.status();
  std::map<std::string, ClassOf> out;
  for (const Json& c : classes->value("items", Json::array())) {
    const std::string resource =
        c.value("/spec/extendedResourceName"_json_pointer, std::string());
    if (resource.empty() || out.count(resource) > 0) continue;
    ClassOf of;
    of.name = c.value("/metadata/name"_json_pointer, std::string());
    for (const Json& sel : c.value("/spec/selectors"_json_pointer, Json::array())) {
      std::string e = sel.value("/cel/expression"_json_pointer, std::string());
      e.erase(std::remove(e.begin(), e.end(), ' '), e.end());
      constexpr absl::string_view kPrefix = "device.driver==\"";
      if (absl::StartsWith(e, kPrefix) && absl::EndsWith(e, "\"") &&
          e.size() > kPrefix.size() + 1) {
        of.driver = e.substr(kPrefix.size(), e.size() - kPrefix.size() - 1);
      }
    }
    if (of.driver.empty()) {
      return absl::UnimplementedError(absl::StrCat(
          "DeviceClass ", of.name, " serves ", resource,
          " but has no selector device.driver == \"...\", the only form this scheduler reads"));
    }
    out[resource] = of;
  }
  return out;
}

}  // namespace

Json ExtendedResourceDeviceClass(const std::string& name, const std::string& driver,
                                 const std::string& resource) {
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"selectors",
             {{{"cel", {{"expression", absl::StrCat("device.driver == \"", driver, "\"")}}}}}},
            {"extendedResourceName", resource}}}};
}

absl::StatusOr<ExtendedResourceRoute> RouteExtendedResource(KubeClient* client,
                                                            const std::string& resource,
                                                            int64_t node_allocatable) {
  if (node_allocatable > 0) return ExtendedResourceRoute::kDevicePlugin;
  absl::StatusOr<std::string> version = PreferredVersion(client);
  if (!version.ok()) return version.status();
  absl::StatusOr<std::map<std::string, ClassOf>> classes =
      ExtendedResourceClasses(client, *version);
  if (!classes.ok()) return classes.status();
  return classes->count(resource) > 0 ? ExtendedResourceRoute::kDra
                                      : ExtendedResourceRoute::kNone;
}

absl::StatusOr<GeneratedClaim> CreateExtendedResourceClaim(
    KubeClient* client, const ExtendedResourcePod& pod) {
  absl::StatusOr<std::string> version = PreferredVersion(client);
  if (!version.ok()) return version.status();
  absl::StatusOr<std::map<std::string, ClassOf>> classes =
      ExtendedResourceClasses(client, *version);
  if (!classes.ok()) return classes.status();
  Json requests = Json::array();
  Json results = Json::array();
  Json mappings = Json::array();
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> free;  // by driver
  std::map<std::string, size_t> next;  // by driver: the next free device to give
  for (size_t i = 0; i < pod.containers.size(); ++i) {
    const ExtendedResourcePod::Container& c = pod.containers[i];
    int j = -1;  // std::map: the requests sorted by name
    for (const auto& [resource, count] : c.requests) {
      ++j;
      if (count <= 0) continue;
      auto cls = classes->find(resource);
      if (cls == classes->end()) continue;  // cpu, memory, a device plugin's own
      const std::string driver = cls->second.driver;
      if (free.count(driver) == 0) {
        ClaimAllocation where;
        where.driver = driver;
        where.node = pod.node;
        std::set<std::string> pools;
        absl::StatusOr<std::vector<std::pair<std::string, std::string>>> f =
            FreeDevices(client, *version, where, &pools);
        if (!f.ok()) return f.status();
        free[driver] = *std::move(f);
      }
      const std::string request = absl::StrCat("container-", i, "-request-", j);
      requests.push_back({{"name", request},
                          {"exactly",
                           {{"deviceClassName", cls->second.name},
                            {"allocationMode", "ExactCount"},
                            {"count", count}}}});
      mappings.push_back(
          {{"containerName", c.name}, {"resourceName", resource}, {"requestName", request}});
      const std::vector<std::pair<std::string, std::string>>& devices = free[driver];
      const size_t left = devices.size() - next[driver];
      if (left < static_cast<size_t>(count)) {
        ClaimAllocation asked;
        asked.driver = driver;
        asked.node = pod.node;
        asked.count = count;
        std::set<std::string> pools;
        for (const auto& [p, d] : devices) pools.insert(p);
        return absl::FailedPreconditionError(absl::StrCat(
            "pod ", pod.name, " container ", c.name, ": ", ShortageError(asked, left, pools)));
      }
      for (int k = 0; k < count; ++k, ++next[driver]) {
        const auto& [p, d] = devices[next[driver]];
        results.push_back({{"request", request}, {"driver", driver}, {"pool", p}, {"device", d}});
      }
    }
  }
  if (requests.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod ", pod.name,
                     " asks for no extended resource that a DeviceClass names"));
  }
  const std::string base =
      absl::StrCat("/apis/", *version, "/namespaces/", pod.namespace_, "/resourceclaims");
  absl::StatusOr<Json> made = client->Post(
      base, {{"metadata",
              {{"generateName", absl::StrCat(pod.name, "-extended-resources-")},
               {"annotations", {{"resource.kubernetes.io/extended-resource-claim", "true"}}}}},
             {"spec", {{"devices", {{"requests", requests}}}}}});
  if (!made.ok()) return made.status();
  (*made)["status"] = {{"allocation", {{"devices", {{"results", results}}}}}};
  const std::string name = (*made)["metadata"]["name"];
  absl::StatusOr<Json> stored = client->Put(absl::StrCat(base, "/", name, "/status"), *made);
  if (!stored.ok()) return stored.status();
  GeneratedClaim out;
  out.claim = *std::move(stored);
  out.status = {{"resourceClaimName", name}, {"requestMappings", mappings}};
  return out;
}

absl::StatusOr<Json> CreateAllocatedClaim(KubeClient* client, const ClaimAllocation& a) {
  const size_t devices = a.devices.empty() ? static_cast<size_t>(a.count) : a.devices.size();
  if (!a.requests.empty() && a.requests.size() != devices) {
    return absl::InvalidArgumentError(
        absl::StrCat(a.requests.size(), " request(s) for ", devices, " device(s)"));
  }
  absl::StatusOr<std::string> version_or = PreferredVersion(client);
  if (!version_or.ok()) return version_or.status();
  const std::string& version = *version_or;
  std::vector<std::pair<std::string, std::string>> chosen;  // (pool, device)
  if (!a.devices.empty()) {
    for (const std::string& d : a.devices) chosen.emplace_back(a.pool, d);
  } else {
    std::set<std::string> pools;
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> free =
        FreeDevices(client, version, a, &pools);
    if (!free.ok()) return free.status();
    if (static_cast<int>(free->size()) < a.count) {
      return absl::FailedPreconditionError(ShortageError(a, free->size(), pools));
    }
    chosen.assign(free->begin(), free->begin() + a.count);
  }
  const std::string base =
      absl::StrCat("/apis/", version, "/namespaces/", a.namespace_, "/resourceclaims");
  absl::StatusOr<Json> made =
      client->Post(base, {{"metadata", {{"name", a.name}}}, {"spec", Json::object()}});
  if (!made.ok()) return made.status();
  Json results = Json::array();
  for (size_t i = 0; i < chosen.size(); ++i) {
    results.push_back({{"request", a.requests.empty() ? a.request : a.requests[i]},
                       {"driver", a.driver},
                       {"pool", chosen[i].first},
                       {"device", chosen[i].second}});
  }
  (*made)["status"] = {{"allocation", {{"devices", {{"results", results}}}}}};
  return client->Put(absl::StrCat(base, "/", a.name, "/status"), *made);
}

}  // namespace dpproxy::sim
