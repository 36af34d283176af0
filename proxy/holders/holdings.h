// File: holdings.h
//
// Who holds which devices, as a kubelet tells it (pod-resources List, or its
// device-manager checkpoint), matched against dpproxy's journal. Pure
// functions, no I/O: the reconciler and the checkpoint check feed them.
//
// A kubelet lists a container's devices one entry per device ID (pod-
// resources since 1.20) or grouped (older answers, the checkpoint): a
// container holds an allocation if the union of its entries for that
// resource has every device of it. When a device was allocated several
// times, the newest allocation is the one a container holds; older ones
// naming any of its devices are superseded.
#ifndef DPPROXY_PROXY_HOLDERS_HOLDINGS_H_
#define DPPROXY_PROXY_HOLDERS_HOLDINGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proxy/state/state.pb.h"

namespace dpproxy {

struct PodHolder {
  std::string pod_namespace, pod_name, container;
  std::string pod_uid;  // checkpoint only
};

class Holdings {
 public:
  // Adds a container; returns its index.
  size_t AddHolder(PodHolder holder);
  void AddDevice(size_t holder, const std::string& resource, const std::string& device_id);
  const PodHolder& holder(size_t i) const { return holders_[i]; }
  // Pods listed at all ("namespace/name"), holding devices or not.
  void AddPod(const std::string& pod_namespace, const std::string& pod_name);
  bool HasPod(const std::string& pod_namespace, const std::string& pod_name) const;

  // Allocation id -> index of the holder, for every allocation a container
  // holds; allocations not in the map are not held (or superseded).
  std::map<uint64_t, size_t> Match(const state::State& st) const;

 private:
  std::vector<PodHolder> holders_;
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> held_;
  std::set<std::string> pods_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_HOLDINGS_H_
