#include "proxy/translate/translate.h"

namespace dpproxy {

deviceplugin::AllocateRequest ToV1AlphaAllocate(const v1beta1::ContainerAllocateRequest& c) {
  deviceplugin::AllocateRequest out;
  for (const std::string& id : c.devices_ids()) out.add_devicesids(id);
  return out;
}

v1beta1::ContainerAllocateResponse FromV1AlphaResponse(const deviceplugin::AllocateResponse& r) {
  v1beta1::ContainerAllocateResponse out;
  for (const auto& [k, v] : r.envs()) (*out.mutable_envs())[k] = v;
  for (const auto& m : r.mounts()) {
    v1beta1::Mount* o = out.add_mounts();
    o->set_container_path(m.container_path());
    o->set_host_path(m.host_path());
    o->set_read_only(m.read_only());
  }
  for (const auto& d : r.devices()) {
    v1beta1::DeviceSpec* o = out.add_devices();
    o->set_container_path(d.container_path());
    o->set_host_path(d.host_path());
    o->set_permissions(d.permissions());
  }
  for (const auto& [k, v] : r.annotations()) (*out.mutable_annotations())[k] = v;
  return out;
}

v1beta1::DevicePluginOptions V1AlphaBackendOptions() { return v1beta1::DevicePluginOptions(); }

deviceplugin::AllocateResponse ToV1AlphaResponse(const v1beta1::ContainerAllocateResponse& r,
                                                 Loss* loss) {
  deviceplugin::AllocateResponse out;
  for (const auto& [k, v] : r.envs()) (*out.mutable_envs())[k] = v;
  for (const auto& m : r.mounts()) {
    deviceplugin::Mount* o = out.add_mounts();
    o->set_container_path(m.container_path());
    o->set_host_path(m.host_path());
    o->set_read_only(m.read_only());
  }
  for (const auto& d : r.devices()) {
    deviceplugin::DeviceSpec* o = out.add_devices();
    o->set_container_path(d.container_path());
    o->set_host_path(d.host_path());
    o->set_permissions(d.permissions());
  }
  loss->annotations += r.annotations_size();
  loss->cdi_devices += r.cdi_devices_size();
  return out;
}

deviceplugin::ListAndWatchResponse ToV1AlphaList(const v1beta1::ListAndWatchResponse& r,
                                                 Loss* loss) {
  deviceplugin::ListAndWatchResponse out;
  for (const auto& d : r.devices()) {
    deviceplugin::Device* o = out.add_devices();
    o->set_id(d.id());
    o->set_health(d.health());
    if (d.has_topology() && d.topology().nodes_size() > 0) ++loss->topology;
  }
  return out;
}

v1beta1::AllocateRequest FromV1AlphaAllocate(const deviceplugin::AllocateRequest& r) {
  v1beta1::AllocateRequest out;
  v1beta1::ContainerAllocateRequest* c = out.add_container_requests();
  for (const std::string& id : r.devicesids()) c->add_devices_ids(id);
  return out;
}

std::vector<std::string> LossCounter::Add(const std::string& resource, const Loss& loss) {
  std::vector<std::string> first;
  if (!loss.any()) return first;
  absl::MutexLock lock(&mu_);
  auto& m = counts_[resource];
  auto add = [&](const char* kind, int n) {
    if (n <= 0) return;
    int64_t& c = m[kind];
    if (c == 0) first.push_back(kind);
    c += n;
    total_ += n;
  };
  add("annotations", loss.annotations);
  add("cdi_devices", loss.cdi_devices);
  add("topology", loss.topology);
  add("prestart_timing", loss.prestart_timing);
  add("preferred_allocation", loss.preferred_allocation);
  return first;
}

int64_t LossCounter::Count(const std::string& resource, const std::string& kind) const {
  absl::MutexLock lock(&mu_);
  auto r = counts_.find(resource);
  if (r == counts_.end()) return 0;
  auto k = r->second.find(kind);
  return k == r->second.end() ? 0 : k->second;
}

std::map<std::string, std::map<std::string, int64_t>> LossCounter::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

}  // namespace dpproxy
