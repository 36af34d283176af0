// File: forgotten_devices.h
//
// What the core asks about devices the kubelet forgot: a restarted kubelet
// that lost its checkpoint counts the devices of running containers free,
// so an Allocate naming one must wait until that container is gone. The
// answers come from the layer that knows who holds what
// (proxy/holders/forgotten_allocations.h); the core holds only this
// interface. Every method may block (a pod-resources List, a container
// runtime's ListContainers) and is called on any thread, with no lock of
// the core held.
#ifndef DPPROXY_PROXY_CORE_FORGOTTEN_DEVICES_H_
#define DPPROXY_PROXY_CORE_FORGOTTEN_DEVICES_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dpproxy {

class ForgottenDevices {
 public:
  virtual ~ForgottenDevices() = default;

  // Whether an Allocate of `resource` may have the devices of
  // `per_container` (kubelet IDs, one list per container request). Holders
  // found gone are released first; kFailedPrecondition, naming the holder,
  // if one still runs. OK(true): allowed, as a re-admission whose devices
  // differ from the forgotten container's (`readmission`: the kubelet may
  // be re-admitting the running pods it forgot, before 1.25).
  virtual absl::StatusOr<bool> CheckForgotten(
      const std::string& resource, const std::vector<std::vector<std::string>>& per_container,
      bool readmission) = 0;

  // Of `ids` (kubelet IDs of `resource`), those still held by forgotten
  // containers that may run; holders found gone are released first.
  virtual std::set<std::string> StillForgotten(const std::string& resource,
                                               const std::vector<std::string>& ids) = 0;

  // For a kubelet that may be re-admitting: the devices of the oldest
  // forgotten container of `resource` not picked before in this kubelet's
  // start, if it has exactly `size` devices, all in `available`; empty
  // otherwise.
  virtual std::vector<std::string> ReadmissionPick(const std::string& resource, int size,
                                                   const std::set<std::string>& available) = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_FORGOTTEN_DEVICES_H_
