// File: preferred.h
//
// The answer to one container of a GetPreferredAllocation when some of the
// devices the kubelet offers are held by running containers it forgot (it
// restarted without its checkpoint, and counts their devices free). The
// kubelet treats the answer as advice: what it names of the available
// devices is used as given, and a short answer is topped up from any
// available device, held ones included (observed on a 1.36.2 node; the
// kubelet's devicemanager/manager.go, devicesToAllocate). So the answer
// always has exactly `allocation_size` devices (or every available one if
// fewer), chosen in this order:
//
//   1. must_include (already chosen for the pod: an init container's
//      devices, which its app container reuses);
//   2. the backend's own picks that are not held (its topology advice);
//   3. the other available devices that are not held, in the kubelet's
//      order;
//   4. only then held devices, the backend's picks first.
//
// Pure, no I/O.
#ifndef DPPROXY_PROXY_CORE_PREFERRED_H_
#define DPPROXY_PROXY_CORE_PREFERRED_H_

#include <map>
#include <string>
#include <vector>

#include "proto/v1beta1/api.pb.h"

namespace dpproxy {

struct PreferredChoice {
  std::vector<std::string> ids;
  // Held devices the kubelet offered and the answer left out.
  int avoided = 0;
  // Held devices the answer had to name (not enough others available).
  int held_named = 0;
};

// `held`: kubelet ID -> holder. `backend_picks`: the backend's answer for
// this container, in kubelet IDs (empty if it has none).
PreferredChoice ChoosePreferred(const v1beta1::ContainerPreferredAllocationRequest& request,
                                const std::vector<std::string>& backend_picks,
                                const std::map<std::string, std::string>& held);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_PREFERRED_H_
