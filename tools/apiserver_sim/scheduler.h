// File: scheduler.h
//
// kube-scheduler's part in DRA, as far as a test of a node's driver needs
// it: a ResourceClaim created and its allocation written to its status,
// with devices either named by the caller or picked from the driver's
// published ResourceSlices the way the scheduler picks them: only the
// newest generation of each pool counts, and a device already in another
// claim's allocation is taken. Works against any API server (the
// simulator, or a real test cluster), through KubeClient.
//
//   ClaimAllocation a;
//   a.name = "train"; a.driver = "gpu.vendor.com"; a.count = 2;
//   absl::StatusOr<nlohmann::json> claim = CreateAllocatedClaim(client, a);
//   // claim->at("metadata").at("uid"), and status.allocation.devices.results
#ifndef DPPROXY_TOOLS_APISERVER_SIM_SCHEDULER_H_
#define DPPROXY_TOOLS_APISERVER_SIM_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "proxy/kube/kube_client.h"

namespace dpproxy::sim {

struct ClaimAllocation {
  std::string namespace_ = "default";
  std::string name;
  std::string driver;
  std::string request = "gpu";  // the claim's request the devices are for
  // Else one request per device, in order (as many as the devices).
  std::vector<std::string> requests;
  // Devices named by the caller (with `pool`), or else `count` devices
  // picked from the published slices of `pool` ("" any pool of the
  // driver) on `node` ("" any node).
  std::vector<std::string> devices;
  int count = 0;
  std::string pool;
  std::string node;
};

// The stored claim, allocated. kFailedPrecondition naming the pools
// looked at when fewer devices are free than asked (nothing is created
// then); the API server's error otherwise.
absl::StatusOr<nlohmann::json> CreateAllocatedClaim(KubeClient* client, const ClaimAllocation& a);

// Pods asking for an extended resource (`vendor.com/gpu: 1`), as the
// scheduler serves them on a node since KEP-5004 (DRAExtendedResource,
// 1.34+): through the node's device plugin while the node's allocatable
// for the name is above 0, else through DRA where a DeviceClass names the
// resource as its spec.extendedResourceName, else not on this node.
enum class ExtendedResourceRoute { kDevicePlugin, kDra, kNone };

// A DeviceClass that selects `driver`'s devices and names `resource` as
// its extendedResourceName, as deploy/dra-deviceclass.yaml does: the body
// to POST to .../deviceclasses.
nlohmann::json ExtendedResourceDeviceClass(const std::string& name, const std::string& driver,
                                           const std::string& resource);
absl::StatusOr<ExtendedResourceRoute> RouteExtendedResource(KubeClient* client,
                                                            const std::string& resource,
                                                            int64_t node_allocatable);

struct ExtendedResourcePod {
  std::string namespace_ = "default";
  std::string name;
  struct Container {
    std::string name;
    std::map<std::string, int> requests;  // every request: resource name -> count
  };
  std::vector<Container> containers;  // init containers first, then the others
  std::string node;                   // "" any node's devices
};

struct GeneratedClaim {
  nlohmann::json claim;  // as stored, allocated
  // What the scheduler writes to pod.status.extendedResourceClaimStatus:
  // resourceClaimName and requestMappings [{containerName, resourceName,
  // requestName}], which tell the kubelet each container's devices.
  nlohmann::json status;
};

// The claim the scheduler makes for a pod whose extended resources DRA
// serves: named `<pod>-extended-resources-<5 characters>`, annotated
// resource.kubernetes.io/extended-resource-claim: "true", one request per
// container and resource named `container-<i>-request-<j>` (j: the
// resource's place among the container's requests, sorted by name), its
// devices picked from the pools of the class's driver. The class's driver
// is read from a selector `device.driver == "<driver>"` (the only form
// read here); requests no class names (cpu, a device plugin's resource)
// are left to the node. kFailedPrecondition when too few devices are
// free, kInvalidArgument when no class names any request (nothing is
// created then).
absl::StatusOr<GeneratedClaim> CreateExtendedResourceClaim(KubeClient* client,
                                                                  const ExtendedResourcePod& pod);

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_SCHEDULER_H_
