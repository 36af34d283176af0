// File: resource_slices.h
//
// The ResourceSlices that publish one device-plugin resource as DRA devices
// (resource.k8s.io, KEP-4381; docs/dra.md): one pool per node and resource, at most 128
// devices per slice, every slice carrying the pool's generation and slice
// count. A device is named by DraDeviceName, keeps its device-plugin ID as
// the attribute "deviceID" (in the driver's domain), and its first NUMA
// node as "resource.kubernetes.io/numaNode". Unhealthy devices are left
// out, so that the scheduler never picks them.
//
// For resource.k8s.io/v1 and v1beta2 a device's attributes sit on the
// device; for v1beta1 under "basic".
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_RESOURCE_SLICES_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_RESOURCE_SLICES_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace dpproxy {

inline constexpr int kMaxDevicesPerSlice = 128;
inline constexpr char kNumaNodeAttribute[] = "resource.kubernetes.io/numaNode";
inline constexpr char kDeviceIdAttribute[] = "deviceID";

struct SliceDevice {
  std::string id;  // the device plugin's ID
  bool healthy = true;
  std::vector<int64_t> numa_nodes;
};

struct PoolSpec {
  std::string driver;    // DNS subdomain, e.g. gpu.vendor.com
  std::string node;      // the node's name
  std::string resource;  // the device plugin's resource, e.g. vendor.com/gpu
  int64_t generation = 1;
  std::string api_version = "resource.k8s.io/v1";
};

// "<node>/<resource, '/' as '-'>": the pool's name.
std::string PoolName(const PoolSpec& pool);

// The slices, in order; names "<node>-<driver>-<pool hash>-<index>" (stable,
// so a change updates the same objects). kFailedPrecondition if two device
// IDs get one name; kInvalidArgument for an API version it cannot write.
absl::StatusOr<std::vector<nlohmann::json>> BuildResourceSlices(
    const PoolSpec& pool, const std::vector<SliceDevice>& devices);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_RESOURCE_SLICES_H_
