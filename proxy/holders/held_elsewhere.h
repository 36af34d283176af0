// File: held_elsewhere.h
//
// Devices a resource must not show free because a live allocation holds
// them under another kubelet name or another kubelet ID. That happens when
// a resource is renamed (`renames`), or its ID map or compact IDs change,
// while pods hold its devices: the kubelet knows those allocations by the
// old name and ID only, and would hand the same device out again under the
// new one. Pure functions, no I/O; the server shows what they find as
// Unhealthy until the allocation is released (its pod is gone).
#ifndef DPPROXY_PROXY_HOLDERS_HELD_ELSEWHERE_H_
#define DPPROXY_PROXY_HOLDERS_HELD_ELSEWHERE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "proxy/state/state.pb.h"

namespace dpproxy {

// How a plugin's resource is served to the kubelet now.
struct ServedAs {
  std::string resource;  // the kubelet-facing name
  // The kubelet ID shown for a plugin's device ID (ID map, compact IDs);
  // empty: the plugin's own.
  std::function<std::string(const std::string& backend_id)> kubelet_id;
};

// One device shown under a resource that an allocation holds elsewhere.
struct HeldElsewhere {
  uint64_t allocation = 0;
  std::string held_as_resource, held_as_device;  // as the kubelet knows them
  std::string pod;                               // "namespace/name", "" if unknown
};

// `served`: plugin resource -> how it is served now. `backend_of`: the
// plugin resource behind a kubelet name, for records written before they
// named theirs (from the saved or current backends). Returns kubelet name
// -> (kubelet ID shown -> who holds it under another name or ID). O(records).
std::map<std::string, std::map<std::string, HeldElsewhere>> DevicesHeldElsewhere(
    const state::State& allocations, const std::map<std::string, ServedAs>& served,
    const std::map<std::string, std::string>& backend_of);

// The same, one allocation at a time (the journal's, read in place).
class HeldElsewhereFinder {
 public:
  HeldElsewhereFinder(const std::map<std::string, ServedAs>& served,
                      const std::map<std::string, std::string>& backend_of)
      : served_(served), backend_of_(backend_of) {}
  void Add(const state::Allocation& a);
  std::map<std::string, std::map<std::string, HeldElsewhere>> Take() { return std::move(out_); }

 private:
  const std::map<std::string, ServedAs>& served_;
  const std::map<std::string, std::string>& backend_of_;
  std::map<std::string, std::map<std::string, HeldElsewhere>> out_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_HELD_ELSEWHERE_H_
