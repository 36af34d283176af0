// File: shared_ids.h
//
// Device IDs that two served resources both show the kubelet. A kubelet
// before 1.37 applies a device's health to the pods of every resource
// listing that ID, so a pod's allocatedResourcesStatus (KEP-4680) names
// another resource's device (kubernetes#140323, fixed in 1.37). dpproxy
// does not rename IDs into each other by itself (compact IDs hash one
// backend ID each, and a configuration whose ID maps of two resources
// share a target is refused), but two plugins may well both number their
// devices 0, 1, ...: this says so, once per pair of resources, in the log
// and as the event device_ids_shared, so that an operator can give one of
// them an ID map or compact IDs.
//
// Checked at each housekeeping pass, at the cost of a pass over the lists
// only when one of them changed, and at most once in 2 s (a plugin whose
// health flips does not make it a pass over every list each second).
#ifndef DPPROXY_PROXY_SERVER_SHARED_IDS_H_
#define DPPROXY_PROXY_SERVER_SHARED_IDS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/server/resource_table.h"

namespace dpproxy {

class SharedIds {
 public:
  SharedIds(ResourceTable* table, EventLog* events) : table_(table), events_(events) {}

  // One pass; the housekeeping thread only.
  void Check();

 private:
  struct Shared {
    std::string a, b;  // the two resources, a < b
    std::vector<std::string> ids;  // the first few IDs both list
    size_t count = 0;
  };

  ResourceTable* const table_;
  EventLog* const events_;
  uint64_t checked_ = 0;  // the sum of the lists' versions at the last pass
  absl::Time checked_at_ = absl::InfinitePast();
  std::set<std::pair<std::string, std::string>> told_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_SHARED_IDS_H_
