// File: extended_pods.h
//
// Pods of one extended resource (`vendor.com/gpu: N`) on a simulated node,
// from the scheduler to the kubelet, as a cluster serves them since
// KEP-5004: the scheduler's route (the node's device plugin while its
// allocatable is above 0, else DRA through a DeviceClass naming the
// resource), the claim it makes for the DRA route, the kubelet's admission
// (tools/kubelet_sim), and the end of a pod (the kubelet deletes it and
// unprepares its claim; the claim controller deletes the claim). For tests
// and the bench that move a resource between paths under a stream of pods.
//
//   ExtendedResourcePods pods(&kubelet, client.get(), "vendor.com/gpu", "node-1");
//   absl::StatusOr<ExtendedResourcePods::Pod> p = pods.Start("train-1", 1);
//   // p->route, p->devices; kResourceExhausted: it does not fit (pending)
//   pods.End(p->uid);
#ifndef DPPROXY_TOOLS_APISERVER_SIM_EXTENDED_PODS_H_
#define DPPROXY_TOOLS_APISERVER_SIM_EXTENDED_PODS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/kube/kube_client.h"
#include "tools/apiserver_sim/scheduler.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::sim {

class ExtendedResourcePods {
 public:
  struct Pod {
    std::string uid;
    std::string name;
    ExtendedResourceRoute route = ExtendedResourceRoute::kNone;
    // The devices its container got: device-plugin IDs, or the claim's
    // device names.
    std::vector<std::string> devices;
    std::string claim;  // "namespace/name" of its extended-resource claim
    std::string claim_path;  // the claim's path in the API
  };

  ExtendedResourcePods(KubeletSim* kubelet, KubeClient* api, std::string resource,
                       std::string node);

  // Schedules a pod with one container asking for `count` devices and has
  // the kubelet start it. kResourceExhausted when it fits nowhere now (the
  // scheduler leaves it pending; nothing was made); kFailedPrecondition
  // when the kubelet refused it (the pod is Failed); kUnavailable when its
  // claim could not be prepared (the claim is deleted again).
  absl::StatusOr<Pod> Start(const std::string& name, int count);
  // The pod ends: the kubelet deletes it (unpreparing its claim) and the
  // claim controller deletes the claim.
  absl::Status End(const std::string& uid);

  // Running pods this placed, by UID.
  const std::map<std::string, Pod>& running() const { return running_; }

 private:
  KubeletSim* const kubelet_;
  KubeClient* const api_;
  const std::string resource_;
  const std::string node_;
  std::map<std::string, Pod> running_;
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_EXTENDED_PODS_H_
