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

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_APISERVER_SIM_SCHEDULER_H_
