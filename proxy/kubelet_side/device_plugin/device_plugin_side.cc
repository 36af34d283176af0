#include "proxy/kubelet_side/device_plugin/device_plugin_side.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/util/files.h"

namespace dpproxy {

namespace {

// After a handoff, how long a call the kubelet chose this dpproxy for just
// before it moved to the new one may take to arrive: the kubelet picks the
// endpoint and sends at once, so a few milliseconds, with room to spare.
constexpr absl::Duration kHandoffQuiet = absl::Milliseconds(250);

}  // namespace

DevicePluginSide::DevicePluginSide(KubeletSideOptions kubelet, Parts parts)
    : kubelet_(std::move(kubelet)),
      parts_(std::move(parts)),
      registrar_(kubelet_, parts_.events, parts_.workers, parts_.wake),
      backend_timeout_(kubelet_.backend_timeout),
      cdi_annotations_(kubelet_.cdi_annotations) {
  registrar_.SetTelemetry(parts_.telemetry);
}

DevicePluginSide::~DevicePluginSide() {
  if (watcher_) watcher_->Stop();
  for (DevicePluginServer* e : Endpoints()) e->Stop();
  // The registrar's jobs may still hold a removed endpoint: they end with
  // its Stop, before it goes.
}

absl::Status DevicePluginSide::Start() {
  const std::string dir = kubelet_.registration == KubeletRegistration::kPluginWatcher
                              ? JoinPath(kubelet_.kubelet_root, "plugins_registry")
                              : DevicePluginDir(kubelet_);
  watcher_ = std::make_unique<DirWatcher>(dir, [this](const DirWatcher::Event& e) {
    if (e.kind != DirWatcher::Event::kTick && parts_.wake) parts_.wake();
  });
  return watcher_->Start();
}

void DevicePluginSide::Stop(Ending ending) {
  if (watcher_) watcher_->Stop();
  if (ending == Ending::kHandedOver) DrainAfterHandoff();
  const std::vector<DevicePluginServer*> endpoints = Endpoints();
  if (ending == Ending::kForGood) {
    // Stopping for good: an endpoint the kubelet no longer lists by name
    // registers once more, so that its end turns the devices unhealthy.
    for (DevicePluginServer* e : endpoints) e->RelistBeforeStop();
  }
  // Cancels Register calls in flight; the workers' jobs then end.
  for (DevicePluginServer* e : endpoints) e->Stop();
}

void DevicePluginSide::DrainAfterHandoff() {
  // Handed over, and the kubelet has moved to the new dpproxy. A call it
  // sent here just before may still be on its way: wait until the kubelet
  // ends its streams here (1.9 stops a replaced endpoint; later kubelets
  // keep it until the plugin ends it, so at most kHandoffQuiet), then until
  // the Allocates forwarded to the new dpproxy have their answers, and
  // only then close the sockets.
  const std::vector<DevicePluginServer*> endpoints = Endpoints();
  const absl::Time quiet_by = absl::Now() + kHandoffQuiet;
  for (DevicePluginServer* e : endpoints) {
    (void)e->WaitForKubeletGone(std::max(absl::ZeroDuration(), quiet_by - absl::Now()));
  }
  absl::Duration wait;
  {
    absl::MutexLock lock(&mu_);
    wait = backend_timeout_ + absl::Seconds(1);
  }
  for (DevicePluginServer* e : endpoints) {
    if (!e->WaitForAllocatesServed(wait)) {
      LOG(WARNING) << "resource " << e->resource()->name()
                   << ": a forwarded Allocate is still in progress after "
                   << absl::FormatDuration(wait) << "; stopping anyway";
    }
  }
}

void DevicePluginSide::AddResource(Allocator* allocator) {
  Resource* resource = allocator->resource();
  DevicePluginServer* raw = nullptr;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<DevicePluginServer>& e = endpoints_[resource->name()];
    if (e != nullptr) {  // served already; fully again if it was withdrawn
      if (withdrawn_.erase(resource->name()) > 0) {
        resource->SetWithdrawnFromDevicePlugins(false);
        LOG(INFO) << "resource " << resource->name()
                  << ": served to the kubelet's device manager again";
      }
      return;
    }
    e = std::make_unique<DevicePluginServer>(resource, kubelet_, parts_.losses, parts_.events,
                                             allocator, parts_.telemetry);
    e->SetCallSettings(backend_timeout_, cdi_annotations_);
    raw = e.get();
  }
  registrar_.Add(resource, raw);
  LOG(INFO) << "resource " << resource->name() << ": kubelet-facing socket "
            << raw->socket_path();
}

void DevicePluginSide::Withdraw(Allocator* allocator) {
  Resource* resource = allocator->resource();
  AddResource(allocator);  // registered, if it was not
  {
    absl::MutexLock lock(&mu_);
    if (!withdrawn_.insert(resource->name()).second) return;
  }
  resource->SetWithdrawnFromDevicePlugins(true);
  LOG(INFO) << "resource " << resource->name()
            << ": withdrawn from the kubelet's device manager: its endpoint stays registered "
               "with every device Unhealthy while pods of the device plugin hold its devices "
               "(the kubelet looks it up at every container start of the resource)";
  parts_.events->Emit("device_plugin_withdrawn", {{"resource", resource->name()}});
}

std::vector<std::string> DevicePluginSide::Withdrawn() {
  absl::MutexLock lock(&mu_);
  return {withdrawn_.begin(), withdrawn_.end()};
}

void DevicePluginSide::RemoveResource(const std::string& resource) {
  DevicePluginServer* raw = nullptr;
  bool was_withdrawn = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(resource);
    if (it == endpoints_.end()) return;
    raw = it->second.get();
    removed_.push_back(std::move(it->second));
    endpoints_.erase(it);
    was_withdrawn = withdrawn_.erase(resource) > 0;
  }
  registrar_.Remove(raw);
  // As at a stop for good: a kubelet that no longer lists it by name hears
  // of it once more, so that its end turns the devices unhealthy.
  raw->RelistBeforeStop();
  raw->Stop();
  // Only once its stream has ended: lifted earlier, the plugin's health
  // would reach the kubelet on the way out, and a kubelet that counted
  // those devices allocatable would admit a pod onto an endpoint that is
  // gone ("no healthy devices present").
  if (was_withdrawn) raw->resource()->SetWithdrawnFromDevicePlugins(false);
  LOG(INFO) << "resource " << resource << ": no longer served to the kubelet's device manager";
}

KubeletSide::PassResult DevicePluginSide::Pass(absl::Time now) {
  const Registrar::PassResult pass = registrar_.Pass(now);
  PassResult out;
  out.kubelet_restarted = pass.kubelet_restarted;
  out.next_retry = pass.next_retry;
  return out;
}

void DevicePluginSide::SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) {
  absl::MutexLock lock(&mu_);
  backend_timeout_ = backend_timeout;
  cdi_annotations_ = cdi_annotations;
  for (auto& [name, e] : endpoints_) e->SetCallSettings(backend_timeout, cdi_annotations);
}

KubeletView DevicePluginSide::ViewOf(const std::string& resource) {
  DevicePluginServer* e = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(resource);
    if (it != endpoints_.end()) e = it->second.get();
  }
  KubeletView v;
  if (e == nullptr) return v;  // endpoints live until the side does
  v.api = e->negotiated();
  v.socket = e->socket_path();
  const DevicePluginServer::SteeringCounts s = e->steering();
  v.forgotten_avoided = s.avoided;
  v.forgotten_named = s.held_named;
  return v;
}

std::vector<HealthCheck> DevicePluginSide::Readiness() { return registrar_.RegistrationChecks(); }

std::vector<DevicePluginServer*> DevicePluginSide::Endpoints() {
  std::vector<DevicePluginServer*> out;
  absl::MutexLock lock(&mu_);
  out.reserve(endpoints_.size());
  for (auto& [name, e] : endpoints_) out.push_back(e.get());
  return out;
}

std::vector<KubeletGate*> DevicePluginSide::Gates() {
  std::vector<KubeletGate*> out;
  for (DevicePluginServer* e : Endpoints()) out.push_back(e);
  return out;
}

void DevicePluginSide::BeforePredecessorExits() {
  // A 1.25-1.36 kubelet disconnects whatever client holds a resource's
  // name when the predecessor's stream ends (kubernetes#121994): its
  // devices would turn unhealthy until this one registered again, and pods
  // admitted meanwhile fail. Emptying that entry first (the kubelet keeps
  // streaming from this endpoint) makes the predecessor's end a no-op.
  for (DevicePluginServer* e : Endpoints()) {
    if (!e->kubelet_registers_synchronously()) continue;
    absl::Status s = e->ReleaseClientName(absl::Seconds(10));
    if (s.ok()) {
      LOG(INFO) << "takeover: resource " << e->resource()->name()
                << ": the kubelet's record of its client is cleared, so the running "
                   "dpproxy's exit disconnects nothing";
      continue;
    }
    LOG(WARNING) << "takeover: resource " << e->resource()->name()
                 << ": the kubelet's record of its client could not be cleared ("
                 << s.message() << "); if the kubelet drops it when the running dpproxy "
                 << "exits, it is registered again at once";
    // Whatever the kubelet accepted is replaced.
    if (absl::IsFailedPrecondition(s)) registrar_.Resume(/*successor_registered=*/false);
  }
  // The predecessor's streams end as it exits. Where a 1.25-1.36 kubelet's
  // entry could not be emptied, it then drops this one's client by name,
  // to be registered again at once.
  registrar_.ExpectDrop(absl::Seconds(30));
}

}  // namespace dpproxy
