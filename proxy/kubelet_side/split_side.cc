#include "proxy/kubelet_side/split_side.h"

#include <algorithm>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace dpproxy {

SplitSide::SplitSide(std::unique_ptr<KubeletSide> device_plugins,
                     std::unique_ptr<KubeletSide> dra, PathOfResource path_of,
                     PluginPodsHold plugin_pods_hold, Fence fence)
    : device_plugins_(std::move(device_plugins)),
      dra_(std::move(dra)),
      path_of_(std::move(path_of)),
      plugin_pods_hold_(std::move(plugin_pods_hold)),
      fence_(std::move(fence)) {}

absl::Status SplitSide::Start() {
  if (absl::Status s = device_plugins_->Start(); !s.ok()) return s;
  if (absl::Status s = dra_->Start(); !s.ok()) {
    device_plugins_->Stop(Ending::kForGood);
    return s;
  }
  return absl::OkStatus();
}

void SplitSide::Stop(Ending ending) {
  device_plugins_->Stop(ending);
  dra_->Stop(ending);
}

void SplitSide::AddResource(Allocator* allocator) {
  const std::string& name = allocator->resource()->name();
  const KubeletPath path = path_of_(name);
  if (path != KubeletPath::kDra) {
    device_plugins_->AddResource(allocator);
  } else if (PodsHold(name)) {
    device_plugins_->Withdraw(allocator);
  }
  if (path != KubeletPath::kDevicePlugin) dra_->AddResource(allocator);
}

void SplitSide::RemoveResource(const std::string& resource) {
  device_plugins_->RemoveResource(resource);
  dra_->RemoveResource(resource);
}

void SplitSide::Reroute(Allocator* allocator, KubeletPath from, KubeletPath to) {
  const std::string& name = allocator->resource()->name();
  const bool plugin_before = from != KubeletPath::kDra, plugin_after = to != KubeletPath::kDra;
  const bool dra_before = from != KubeletPath::kDevicePlugin;
  const bool dra_after = to != KubeletPath::kDevicePlugin;
  if (plugin_after && !plugin_before) {
    if (fence_.cancel) fence_.cancel(name);  // a move to `dra` not withdrawn yet stays undone
    device_plugins_->AddResource(allocator);
  }
  if (dra_after && !dra_before) dra_->AddResource(allocator);
  if (plugin_before && !plugin_after) {
    if (fence_.fence) {
      // Served in full, by both paths, until the fence lets it go.
      fence_.fence(name, [this, allocator, name] {
        if (path_of_(name) == KubeletPath::kDra) LeaveDevicePlugins(allocator);
      });
      dra_->Wake();
    } else {
      LeaveDevicePlugins(allocator);
    }
  }
  if (dra_before && !dra_after) dra_->RemoveResource(name);
}

void SplitSide::LeaveDevicePlugins(Allocator* allocator) {
  const std::string& name = allocator->resource()->name();
  if (PodsHold(name)) {
    device_plugins_->Withdraw(allocator);
  } else {
    device_plugins_->RemoveResource(name);
  }
}

void SplitSide::Wake() {
  device_plugins_->Wake();
  dra_->Wake();
}

KubeletSide::PassResult SplitSide::Pass(absl::Time now) {
  // A withdrawn resource goes once no pod of the device plugin holds its
  // devices.
  for (const std::string& name : device_plugins_->Withdrawn()) {
    if (path_of_(name) == KubeletPath::kDra && !PodsHold(name)) {
      LOG(INFO) << "resource " << name << ": no pod of the device plugin holds its devices any "
                << "more; its device-plugin endpoint stops";
      device_plugins_->RemoveResource(name);
    }
  }
  PassResult a = device_plugins_->Pass(now);
  const PassResult b = dra_->Pass(now);
  if (!a.kubelet_restarted) a.kubelet_restarted = b.kubelet_restarted;
  a.next_retry = std::min(a.next_retry, b.next_retry);
  return a;
}

void SplitSide::SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) {
  device_plugins_->SetCallSettings(backend_timeout, cdi_annotations);
  dra_->SetCallSettings(backend_timeout, cdi_annotations);
}

KubeletView SplitSide::ViewOf(const std::string& resource) {
  const KubeletPath path = path_of_(resource);
  if (path == KubeletPath::kDevicePlugin) return device_plugins_->ViewOf(resource);
  if (path == KubeletPath::kDra) return dra_->ViewOf(resource);
  KubeletView v = device_plugins_->ViewOf(resource);
  const KubeletView d = dra_->ViewOf(resource);
  if (v.api.empty()) {
    v.api = d.api;
  } else if (!d.api.empty()) {
    v.api = absl::StrCat(v.api, " + ", d.api);
  }
  return v;
}

std::vector<HealthCheck> SplitSide::Readiness() {
  std::vector<HealthCheck> out = device_plugins_->Readiness();
  for (HealthCheck& c : dra_->Readiness()) out.push_back(std::move(c));
  return out;
}

std::vector<KubeletGate*> SplitSide::Gates() {
  std::vector<KubeletGate*> out = device_plugins_->Gates();
  for (KubeletGate* g : dra_->Gates()) out.push_back(g);
  return out;
}

void SplitSide::Hold() {
  device_plugins_->Hold();
  dra_->Hold();
}

void SplitSide::Resume(bool successor_registered) {
  device_plugins_->Resume(successor_registered);
  dra_->Resume(successor_registered);
}

void SplitSide::BeforePredecessorExits() {
  device_plugins_->BeforePredecessorExits();
  dra_->BeforePredecessorExits();
}

}  // namespace dpproxy
