// File: split_side.h
//
// Both kubelet sides in one process: each resource goes to the device-plugin
// side, the DRA side, or both, as its path says (ProxyConfig::paths). The
// server sees one KubeletSide; every call reaches the sides that serve
// something, and a resource's calls reach the sides of its path.
//
//   SplitSide side(std::move(device_plugins), std::move(dra),
//                  [&](const std::string& r) { return PathOf(config, r); });
//   side.AddResource(allocator);  // to one side or both
//
// Both sides allocate through the resource's one Allocator, so a device
// held on one path is refused on the other with its holder named.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_SPLIT_SIDE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_SPLIT_SIDE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proxy/config/proxy_config.h"
#include "proxy/kubelet_side/kubelet_side.h"

namespace dpproxy {

class SplitSide : public KubeletSide {
 public:
  using PathOfResource = std::function<KubeletPath(const std::string& resource)>;
  // Whether pods of the device plugin hold devices of the resource (the
  // journal's allocations without a claim).
  using PluginPodsHold = std::function<bool(const std::string& resource)>;
  // Where a resource that leaves the device manager for DRA by a reload is
  // withdrawn once no pod can be routed to it on a stale node status
  // (dra/move_fence.h): `fence` runs `withdraw` when that is so, `cancel`
  // drops a withdrawal not run yet (the resource moves back). Unset: at
  // once.
  struct Fence {
    std::function<void(const std::string& resource, std::function<void()> withdraw)> fence;
    std::function<void(const std::string& resource)> cancel;
  };

  // `device_plugins` and `dra` are both set; `path_of` and `plugin_pods_hold`
  // are called on any thread (the latter may be empty: never).
  //
  // A resource served through DRA only while pods of the device plugin
  // still hold its devices (a move to `dra` without a drain) stays
  // withdrawn on the device-plugin side (KubeletSide::Withdraw) until the
  // last of them ends: a kubelet (1.34-1.36) looks the resource's endpoint
  // up at every container start of the resource while any pod holds
  // devices of it, claim-served pods included, and fails the start once it
  // dropped the endpoint (5 minutes after it stopped).
  SplitSide(std::unique_ptr<KubeletSide> device_plugins, std::unique_ptr<KubeletSide> dra,
            PathOfResource path_of, PluginPodsHold plugin_pods_hold = nullptr,
            Fence fence = Fence());

  // The device-plugin side first; if the DRA side cannot start, the first
  // is stopped again and the error returned.
  absl::Status Start() override;
  void Stop(Ending ending) override;
  void AddResource(Allocator* allocator) override;
  void RemoveResource(const std::string& resource) override;
  // The resource's path changed from `from` to `to` (a reload): the side
  // it leaves serves it no more, the side it joins serves it from now on.
  // `path_of` says `to` already.
  void Reroute(Allocator* allocator, KubeletPath from, KubeletPath to);
  void Wake() override;
  // Both passes; a kubelet restart either saw, the sooner retry.
  PassResult Pass(absl::Time now) override;
  void SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations) override;
  // Through both paths: "v1beta1 + dra (DRIVER)", the device plugin's socket.
  KubeletView ViewOf(const std::string& resource) override;
  std::vector<HealthCheck> Readiness() override;
  std::vector<KubeletGate*> Gates() override;
  void Hold() override;
  void Resume(bool successor_registered) override;
  void BeforePredecessorExits() override;

 private:
  const std::unique_ptr<KubeletSide> device_plugins_;
  const std::unique_ptr<KubeletSide> dra_;
  const PathOfResource path_of_;
  const PluginPodsHold plugin_pods_hold_;
  const Fence fence_;
  // The device-plugin side serves `allocator`'s resource no more (its path
  // is `dra` now): withdrawn while pods of the device plugin hold its
  // devices, else removed.
  void LeaveDevicePlugins(Allocator* allocator);
  bool PodsHold(const std::string& resource) const {
    return plugin_pods_hold_ && plugin_pods_hold_(resource);
  }
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_SPLIT_SIDE_H_
