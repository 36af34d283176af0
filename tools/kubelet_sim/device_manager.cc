#include "tools/kubelet_sim/device_manager.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proxy/util/encoding.h"
#include "tools/kubelet_sim/kubelet_texts.h"

namespace dpproxy::sim {
namespace {

using Json = nlohmann::json;

constexpr char kUnexpectedAdmissionError[] = "UnexpectedAdmissionError";

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

// The strings of `o[key]` (an array); what is not a string is left out.
std::vector<std::string> StringsOf(const Json& o, const char* key) {
  std::vector<std::string> out;
  if (!o.contains(key) || !o[key].is_array()) return out;
  for (const Json& s : o[key]) {
    if (s.is_string()) out.push_back(s.get<std::string>());
  }
  return out;
}

std::string Holder(const ContainerAllocation& a) {
  return absl::StrCat(a.pod_namespace(), "/", a.pod_name(), "/", a.container());
}

}  // namespace

void DeviceManager::RegisterEndpoint(const std::string& resource,
                                   const std::string& endpoint,
                                   const std::string& api_version,
                                   const std::string& via,
                                   const v1beta1::DevicePluginOptions& options,
                                   uint64_t generation) {
  ResourceRecord& r = resources_[resource];
  r.name = resource;
  r.endpoint = endpoint;
  r.api_version = api_version;
  r.registered_via = via;
  r.options = options;
  r.connected = true;
  r.stopped_at.reset();
  r.generation = generation;
}

bool DeviceManager::UpdateDevices(const std::string& resource, uint64_t generation,
                                  bool by_name, const std::vector<v1beta1::Device>& devices) {
  auto it = resources_.find(resource);
  if (it == resources_.end() || (!by_name && it->second.generation != generation)) return false;
  ResourceRecord& r = it->second;
  r.devices.clear();
  // An ID listed more than once is one device: the last entry's fields
  // (the kubelet's map of devices keeps the last), Healthy if any entry is
  // (the kubelet's healthy set then holds it, and it is allocated).
  for (const v1beta1::Device& d : devices) {
    DeviceInfo info;
    info.health = d.health();
    for (const auto& n : d.topology().nodes()) info.numa_nodes.push_back(n.id());
    auto [it, fresh] = r.devices.try_emplace(d.id());
    const bool was_healthy = !fresh && it->second.health == kHealthy;
    it->second = std::move(info);
    if (was_healthy) it->second.health = std::string(kHealthy);
  }
  return true;
}

bool DeviceManager::EndpointLost(const std::string& resource, uint64_t generation,
                               absl::Time now) {
  auto it = resources_.find(resource);
  if (it == resources_.end() || it->second.generation != generation) return false;
  ResourceRecord& r = it->second;
  r.connected = false;
  r.stopped_at = now;
  for (auto& [id, d] : r.devices) d.health = std::string(kUnhealthy);
  return true;
}

std::vector<std::string> DeviceManager::ExpireResources(absl::Time now,
                                                      absl::Duration grace) {
  std::vector<std::string> removed;
  for (auto it = resources_.begin(); it != resources_.end();) {
    const ResourceRecord& r = it->second;
    if (!r.connected && r.stopped_at.has_value() && now - *r.stopped_at >= grace) {
      removed.push_back(it->first);
      it = resources_.erase(it);
    } else {
      ++it;
    }
  }
  return removed;
}

const ResourceRecord* DeviceManager::Find(const std::string& resource) const {
  auto it = resources_.find(resource);
  return it == resources_.end() ? nullptr : &it->second;
}

std::vector<std::string> DeviceManager::ResourceNames() const {
  std::vector<std::string> names;
  for (const auto& [name, r] : resources_) names.push_back(name);
  return names;
}

std::set<std::string> DeviceManager::AllocatedDevices(const std::string& resource) const {
  std::set<std::string> out;
  for (const ContainerAllocation& a : allocations_) {
    if (a.resource() != resource) continue;
    auto pod = pods_.find(a.pod_uid());
    if (pod != pods_.end() && pod->second.phase() == "Failed") continue;
    out.insert(a.device_ids().begin(), a.device_ids().end());
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> DeviceManager::AvailableFor(
    const std::string& resource, int count) const {
  const ResourceRecord* r = Find(resource);
  if (r == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot allocate unregistered device ", resource));
  }
  std::vector<std::string> healthy;
  for (const auto& [id, d] : r->devices) {
    if (d.health == kHealthy) healthy.push_back(id);
  }
  if (healthy.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no healthy devices present; cannot allocate unhealthy devices ", resource));
  }
  std::set<std::string> allocated = AllocatedDevices(resource);
  std::vector<std::string> available;
  for (const std::string& id : healthy) {
    if (allocated.count(id) == 0) available.push_back(id);
  }
  if (static_cast<int>(available.size()) < count) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "requested number of devices unavailable for ", resource,
        ". Requested: ", count, ", Available: ", available.size()));
  }
  return available;
}

bool DeviceManager::HasPod(const std::string& uid) const { return pods_.count(uid) > 0; }

const PodState* DeviceManager::FindPod(const std::string& uid) const {
  auto it = pods_.find(uid);
  return it == pods_.end() ? nullptr : &it->second;
}

void DeviceManager::AddPod(PodState pod) {
  if (pod.created() == 0) pod.set_created(next_created_);
  next_created_ = std::max(next_created_, pod.created() + 1);
  pods_[pod.uid()] = std::move(pod);
}

void DeviceManager::AddRunning(const std::string& uid, const RuntimeDevices& running) {
  auto it = pods_.find(uid);
  if (it != pods_.end()) *it->second.add_running() = running;
}

void DeviceManager::SetExtendedResourceClaim(const std::string& uid,
                                             const ExtendedResourceClaim& claim) {
  auto it = pods_.find(uid);
  if (it != pods_.end()) *it->second.mutable_extended_resource_claim() = claim;
}

void DeviceManager::StopContainer(const std::string& uid, const std::string& container) {
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  auto* running = it->second.mutable_running();
  for (int i = running->size() - 1; i >= 0; --i) {
    if (running->Get(i).container() == container) running->DeleteSubrange(i, 1);
  }
}

std::vector<DeviceManager::RefitResult> DeviceManager::RefitRunningPods() {
  std::vector<const PodState*> order;
  for (const auto& [uid, p] : pods_) {
    if (p.phase() == "Running") order.push_back(&p);
  }
  std::sort(order.begin(), order.end(),
            [](const PodState* a, const PodState* b) { return a->created() < b->created(); });
  std::vector<RefitResult> results;
  std::map<std::string, int64_t> used;  // by the pods admitted so far
  for (const PodState* p : order) {
    RefitResult r;
    r.pod_uid = p->uid();
    r.pod_name = p->name();
    r.pod_namespace = p->namespace_();
    // The pod's effective request: its app containers' sum, or its
    // largest init container's if that is more.
    std::map<std::string, int64_t> need, init_need;
    std::vector<std::string> resources;
    for (const ContainerRequest& c : p->containers()) {
      const int count = c.count() != 0 ? c.count() : c.device_ids_size();
      if (need.count(c.resource()) == 0 && init_need.count(c.resource()) == 0) {
        resources.push_back(c.resource());
      }
      if (c.init()) {
        init_need[c.resource()] = std::max<int64_t>(init_need[c.resource()], count);
      } else {
        need[c.resource()] += count;
      }
    }
    for (const auto& [res, n] : init_need) need[res] = std::max(need[res], n);
    for (const std::string& res : resources) {
      // A resource the device manager does not know (no checkpoint, no
      // plugin yet) is not a device-plugin resource to it: the node keeps
      // the allocatable it last published, and the pod is not checked
      // against the device manager's count (kubernetes#116125).
      if (Find(res) == nullptr) continue;
      int64_t allocatable = Allocatable(res);
      // The kubelet raises allocatable to what it holds allocated when the
      // pod is one it holds devices for (sanitizeNodeAllocatable).
      bool holds = false;
      for (const ContainerAllocation& a : allocations_) {
        if (a.pod_uid() == p->uid() && a.resource() == res) holds = true;
      }
      if (holds) {
        allocatable =
            std::max(allocatable, static_cast<int64_t>(AllocatedDevices(res).size()));
      }
      if (used[res] + need[res] > allocatable) {
        r.admitted = false;
        r.reason = absl::StrCat("OutOf", res);
        r.message = absl::StrCat("Node didn't have enough resource: ", res,
                                 ", requested: ", need[res], ", used: ", used[res],
                                 ", capacity: ", allocatable);
        break;
      }
    }
    if (r.admitted) {
      for (const auto& [res, n] : need) used[res] += n;
      for (const ContainerRequest& c : p->containers()) {
        if (c.init()) continue;  // it ran to completion before
        bool recorded = false;
        for (const ContainerAllocation& a : allocations_) {
          if (a.pod_uid() == p->uid() && a.container() == c.name() &&
              a.resource() == c.resource()) {
            recorded = true;
          }
        }
        if (!recorded) r.forgotten.push_back(c);
      }
    } else {
      FailPod(p->uid(), r.reason, r.message);
    }
    results.push_back(std::move(r));
  }
  return results;
}

void DeviceManager::AddAllocation(const ContainerAllocation& allocation) {
  allocations_.push_back(allocation);
}

void DeviceManager::FailPod(const std::string& uid, const std::string& reason,
                          const std::string& message) {
  auto it = pods_.find(uid);
  if (it != pods_.end()) {
    it->second.set_phase("Failed");
    it->second.set_reason(reason);
    it->second.set_message(message);
    it->second.clear_running();  // its containers are killed
  }
  allocations_.erase(std::remove_if(allocations_.begin(), allocations_.end(),
                                    [&](const ContainerAllocation& a) {
                                      return a.pod_uid() == uid;
                                    }),
                     allocations_.end());
}

absl::Status DeviceManager::DeletePod(const std::string& uid) {
  if (pods_.erase(uid) == 0) {
    return absl::NotFoundError(absl::StrCat("no pod with uid ", GoQuote(uid)));
  }
  allocations_.erase(std::remove_if(allocations_.begin(), allocations_.end(),
                                    [&](const ContainerAllocation& a) {
                                      return a.pod_uid() == uid;
                                    }),
                     allocations_.end());
  return absl::OkStatus();
}

std::vector<ReadmitResult> DeviceManager::Readmit() {
  std::vector<ReadmitResult> results;
  std::map<std::string, std::string> failed;  // pod uid -> message
  for (const ContainerAllocation& a : allocations_) {
    auto pod = pods_.find(a.pod_uid());
    if (pod != pods_.end() && pod->second.phase() != "Running") continue;
    ReadmitResult res;
    res.set_pod_uid(a.pod_uid());
    res.set_pod_name(a.pod_name());
    res.set_container(a.container());
    res.set_resource(a.resource());
    std::string err;
    const ResourceRecord* r = Find(a.resource());
    if (r == nullptr) {
      err = absl::StrCat("cannot allocate unregistered device ", a.resource());
    } else {
      std::set<std::string> healthy;
      for (const auto& [id, d] : r->devices) {
        if (d.health == kHealthy) healthy.insert(id);
      }
      if (healthy.empty()) {
        err = absl::StrCat("no healthy devices present; cannot allocate unhealthy devices ",
                           a.resource());
      } else {
        for (const std::string& id : a.device_ids()) {
          if (healthy.count(id) == 0) {
            err = absl::StrCat(
                "previously allocated devices are no longer healthy; cannot "
                "allocate unhealthy devices ",
                a.resource());
            break;
          }
        }
      }
    }
    res.set_admitted(err.empty());
    if (!err.empty()) {
      res.set_reason(kUnexpectedAdmissionError);
      res.set_message(absl::StrCat("Allocate failed due to ", err, ", which is unexpected"));
      failed.emplace(a.pod_uid(), res.message());
    }
    results.push_back(std::move(res));
  }
  for (const auto& [uid, message] : failed) FailPod(uid, kUnexpectedAdmissionError, message);
  return results;
}

std::string DeviceManager::CheckpointJson(int minor) const {
  const bool per_numa = minor >= 20;
  const std::string no_topology = minor >= 23 ? "-1" : "0";
  Json entries = Json::array();
  for (const ContainerAllocation& a : allocations_) {
    const ResourceRecord* r = Find(a.resource());
    Json ids = per_numa ? Json::object() : Json::array();
    for (const std::string& id : a.device_ids()) {
      if (!per_numa) {
        ids.push_back(id);
        continue;
      }
      std::string key = no_topology;
      if (r != nullptr) {
        auto d = r->devices.find(id);
        if (d != r->devices.end() && !d->second.numa_nodes.empty()) {
          key = std::to_string(d->second.numa_nodes.front());
        }
      }
      ids[key].push_back(id);
    }
    std::string resp;
    a.response().SerializeToString(&resp);
    entries.push_back({{"PodUID", a.pod_uid()},
                       {"ContainerName", a.container()},
                       {"ResourceName", a.resource()},
                       {"DeviceIDs", ids},
                       {"AllocResp", absl::Base64Escape(resp)}});
  }
  Json registered = Json::object();
  for (const auto& [name, r] : resources_) {
    Json ids = Json::array();
    for (const auto& [id, d] : r.devices) {
      if (d.health == kHealthy) ids.push_back(id);
    }
    registered[name] = ids;
  }
  Json data = {{"PodDeviceEntries", entries}, {"RegisteredDevices", registered}};
  if (minor <= 10) return data.dump();
  Json top = {{"Data", data}, {"Checksum", Fnv32a(data.dump())}};
  return top.dump();
}

std::string DeviceManager::PodsJson() const {
  Json pods = Json::array();
  for (const auto& [uid, p] : pods_) {
    Json containers = Json::array();
    for (const ContainerRequest& c : p.containers()) {
      containers.push_back({{"name", c.name()},
                            {"resource", c.resource()},
                            {"count", c.count()},
                            {"init", c.init()},
                            {"never_starts", c.never_starts()}});
    }
    Json running = Json::array();
    for (const RuntimeDevices& r : p.running()) {
      Json one = {{"container", r.container()},
                  {"resource", r.resource()},
                  {"device_ids", Strings(r.device_ids())}};
      if (r.cdi_device_ids_size() > 0 || r.claim_devices_size() > 0) {
        one["cdi_device_ids"] = Strings(r.cdi_device_ids());
        one["claim_devices"] = Strings(r.claim_devices());
        one["claim_pools"] = Strings(r.claim_pools());
        one["claim_driver"] = r.claim_driver();
      }
      running.push_back(std::move(one));
    }
    Json pod = {{"uid", p.uid()},
                {"name", p.name()},
                {"namespace", p.namespace_()},
                {"phase", p.phase()},
                {"reason", p.reason()},
                {"message", p.message()},
                {"created", p.created()},
                {"containers", containers},
                {"running", running}};
    if (p.has_extended_resource_claim()) {
      const ExtendedResourceClaim& e = p.extended_resource_claim();
      Json mappings = Json::array();
      for (const auto& m : e.request_mappings()) {
        mappings.push_back(
            {{"container", m.container()}, {"resource", m.resource()}, {"request", m.request()}});
      }
      pod["extended_resource_claim"] = {{"namespace", e.namespace_()},
                                        {"name", e.name()},
                                        {"uid", e.uid()},
                                        {"driver", e.driver()},
                                        {"request_mappings", mappings}};
    }
    pods.push_back(std::move(pod));
  }
  return Json({{"format_version", 1}, {"pods", pods}}).dump(1);
}

absl::Status DeviceManager::Restore(const std::string& checkpoint_json,
                                  const std::string& pods_json, absl::Time now, int minor) {
  resources_.clear();
  pods_.clear();
  allocations_.clear();
  next_created_ = 1;
  if (!pods_json.empty()) {
    Json pj = Json::parse(pods_json, nullptr, /*allow_exceptions=*/false);
    if (pj.is_object() && pj.contains("pods") && pj["pods"].is_array()) {
      for (const Json& p : pj["pods"]) {
        if (!p.is_object()) continue;
        PodState pod;
        pod.set_uid(p.value("uid", ""));
        pod.set_name(p.value("name", ""));
        pod.set_namespace_(p.value("namespace", ""));
        pod.set_phase(p.value("phase", "Running"));
        pod.set_reason(p.value("reason", ""));
        pod.set_message(p.value("message", ""));
        pod.set_created(p.value("created", int64_t{0}));
        if (p.contains("containers") && p["containers"].is_array()) {
          for (const Json& c : p["containers"]) {
            if (!c.is_object()) continue;
            ContainerRequest* cr = pod.add_containers();
            cr->set_name(c.value("name", ""));
            cr->set_resource(c.value("resource", ""));
            cr->set_count(c.value("count", 0));
            cr->set_init(c.value("init", false));
            cr->set_never_starts(c.value("never_starts", false));
          }
        }
        if (p.contains("running") && p["running"].is_array()) {
          for (const Json& r : p["running"]) {
            if (!r.is_object()) continue;
            RuntimeDevices* rd = pod.add_running();
            rd->set_container(r.value("container", ""));
            rd->set_resource(r.value("resource", ""));
            for (const std::string& id : StringsOf(r, "device_ids")) rd->add_device_ids(id);
            for (const std::string& id : StringsOf(r, "cdi_device_ids")) {
              rd->add_cdi_device_ids(id);
            }
            for (const std::string& d : StringsOf(r, "claim_devices")) rd->add_claim_devices(d);
            for (const std::string& p : StringsOf(r, "claim_pools")) rd->add_claim_pools(p);
            rd->set_claim_driver(r.value("claim_driver", ""));
          }
        }
        if (p.contains("extended_resource_claim") && p["extended_resource_claim"].is_object()) {
          const Json& e = p["extended_resource_claim"];
          ExtendedResourceClaim* claim = pod.mutable_extended_resource_claim();
          claim->set_namespace_(e.value("namespace", ""));
          claim->set_name(e.value("name", ""));
          claim->set_uid(e.value("uid", ""));
          claim->set_driver(e.value("driver", ""));
          if (e.contains("request_mappings") && e["request_mappings"].is_array()) {
            for (const Json& m : e["request_mappings"]) {
              if (!m.is_object()) continue;
              auto* mapping = claim->add_request_mappings();
              mapping->set_container(m.value("container", ""));
              mapping->set_resource(m.value("resource", ""));
              mapping->set_request(m.value("request", ""));
            }
          }
        }
        if (!pod.uid().empty()) AddPod(std::move(pod));
      }
    }
  }
  if (checkpoint_json.empty()) return absl::OkStatus();
  Json top = Json::parse(checkpoint_json, nullptr, /*allow_exceptions=*/false);
  auto corrupt = [&](const std::string& why) {
    resources_.clear();
    allocations_.clear();
    return absl::DataLossError(absl::StrCat("checkpoint is corrupt: ", why));
  };
  Json empty_data = Json::object();
  const Json* data_ptr = &empty_data;
  if (minor <= 10) {
    // Go's json into {PodDeviceEntries, RegisteredDevices}: keys it does
    // not know (a newer file's "Data", "Checksum") are skipped.
    if (!top.is_object()) return corrupt("not a JSON object");
    data_ptr = &top;
  } else {
    if (!top.is_object() || !top.contains("Data") || !top["Data"].is_object() ||
        !top.contains("Checksum") || !top["Checksum"].is_number_unsigned()) {
      return corrupt("not a {\"Data\":...,\"Checksum\":N} object");
    }
    if (Fnv32a(top["Data"].dump()) != top["Checksum"].get<uint32_t>()) {
      return corrupt("checksum mismatch");
    }
    data_ptr = &top["Data"];
  }
  const Json& data = *data_ptr;
  // Which DeviceIDs layouts this release decodes (its checkpoint.go).
  const bool reads_list = minor <= 19 || (minor >= 22 && minor <= 30);
  const bool reads_map = minor >= 20;
  if (data.contains("PodDeviceEntries") && data["PodDeviceEntries"].is_array()) {
    for (const Json& e : data["PodDeviceEntries"]) {
      if (!e.is_object() || !e.contains("DeviceIDs")) continue;
      const Json& ids = e["DeviceIDs"];
      if (ids.is_array() && !reads_list) {
        return corrupt(absl::StrCat("json: cannot unmarshal array into DeviceIDs of type "
                                    "checkpoint.DevicesPerNUMA (a checkpoint of kubelet 1.19 or "
                                    "older, which 1.",
                                    minor, " cannot read)"));
      }
      if (ids.is_object() && !reads_map) {
        return corrupt(absl::StrCat("json: cannot unmarshal object into DeviceIDs of type "
                                    "[]string (a checkpoint of kubelet 1.20 or newer, which 1.",
                                    minor, " cannot read)"));
      }
    }
  }
  if (data.contains("RegisteredDevices") && data["RegisteredDevices"].is_object()) {
    for (auto it = data["RegisteredDevices"].begin(); it != data["RegisteredDevices"].end();
         ++it) {
      ResourceRecord& r = resources_[it.key()];
      r.name = it.key();
      r.connected = false;
      r.stopped_at = now;
    }
  }
  if (data.contains("PodDeviceEntries") && data["PodDeviceEntries"].is_array()) {
    for (const Json& e : data["PodDeviceEntries"]) {
      if (!e.is_object()) return corrupt("an entry is not an object");
      ContainerAllocation a;
      a.set_pod_uid(e.value("PodUID", ""));
      a.set_container(e.value("ContainerName", ""));
      a.set_resource(e.value("ResourceName", ""));
      if (e.contains("DeviceIDs") && e["DeviceIDs"].is_array()) {
        for (const Json& id : e["DeviceIDs"]) {
          if (id.is_string()) a.add_device_ids(id.get<std::string>());
        }
      } else if (e.contains("DeviceIDs") && e["DeviceIDs"].is_object()) {
        for (auto it = e["DeviceIDs"].begin(); it != e["DeviceIDs"].end(); ++it) {
          if (!it.value().is_array()) return corrupt("DeviceIDs is not a map of lists");
          for (const Json& id : it.value()) {
            if (id.is_string()) a.add_device_ids(id.get<std::string>());
          }
        }
      }
      std::string raw;
      if (!absl::Base64Unescape(e.value("AllocResp", ""), &raw) ||
          !a.mutable_response()->ParseFromString(raw)) {
        return corrupt("AllocResp is not a ContainerAllocateResponse");
      }
      auto pod = pods_.find(a.pod_uid());
      if (pod != pods_.end()) {
        a.set_pod_name(pod->second.name());
        a.set_pod_namespace(pod->second.namespace_());
      }
      allocations_.push_back(std::move(a));
    }
  }
  return absl::OkStatus();
}

int64_t DeviceManager::Capacity(const std::string& resource) const {
  const ResourceRecord* r = Find(resource);
  return r == nullptr ? 0 : static_cast<int64_t>(r->devices.size());
}

int64_t DeviceManager::Allocatable(const std::string& resource) const {
  const ResourceRecord* r = Find(resource);
  if (r == nullptr) return 0;
  int64_t n = 0;
  for (const auto& [id, d] : r->devices) n += d.health == kHealthy ? 1 : 0;
  return n;
}

std::map<std::string, int64_t> DeviceManager::AllAllocatable() const {
  std::map<std::string, int64_t> out;
  for (const auto& [name, r] : resources_) out[name] = Allocatable(name);
  return out;
}

void DeviceManager::FillState(absl::Time now, State* out) const {
  std::map<std::string, std::string> holder;  // resource + '\0' + id -> holder
  for (const ContainerAllocation& a : allocations_) {
    for (const std::string& id : a.device_ids()) {
      holder[absl::StrCat(a.resource(), std::string(1, '\0'), id)] = Holder(a);
    }
  }
  std::map<std::string, std::vector<std::string>> users;  // resource + '\0' + id
  for (const auto& [uid, p] : pods_) {
    for (const RuntimeDevices& r : p.running()) {
      for (const std::string& id : r.device_ids()) {
        users[absl::StrCat(r.resource(), std::string(1, '\0'), id)].push_back(
            absl::StrCat(p.namespace_(), "/", p.name(), "/", r.container()));
      }
    }
  }
  for (const auto& [name, r] : resources_) {
    ResourceState* rs = out->add_resources();
    rs->set_name(name);
    rs->set_endpoint(r.endpoint);
    rs->set_api_version(r.api_version);
    rs->set_registered_via(r.registered_via);
    rs->set_connected(r.connected);
    rs->set_capacity(Capacity(name));
    rs->set_allocatable(Allocatable(name));
    rs->set_pre_start_required(r.options.pre_start_required());
    rs->set_get_preferred_allocation_available(
        r.options.get_preferred_allocation_available());
    if (r.stopped_at.has_value()) {
      rs->set_disconnected_ms(absl::ToInt64Milliseconds(now - *r.stopped_at));
    }
    for (const auto& [id, d] : r.devices) {
      DeviceState* ds = rs->add_devices();
      ds->set_id(id);
      ds->set_health(d.health);
      for (int64_t n : d.numa_nodes) ds->add_numa_nodes(n);
      auto h = holder.find(absl::StrCat(name, std::string(1, '\0'), id));
      if (h != holder.end()) ds->set_allocated_to(h->second);
      auto u = users.find(absl::StrCat(name, std::string(1, '\0'), id));
      if (u != users.end()) {
        for (const std::string& who : u->second) ds->add_used_by(who);
      }
    }
  }
  for (const auto& [uid, p] : pods_) *out->add_pods() = p;
  for (const ContainerAllocation& a : allocations_) *out->add_allocations() = a;
}

}  // namespace dpproxy::sim
