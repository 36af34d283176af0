// File: translate.h
//
// Conversions between the kubelet-facing and backend-facing device-plugin
// APIs. The proxy's canonical model is v1beta1; everything version-specific
// is here and in the adapters at the edges. Stateless and thread-safe,
// except LossCounter, which is thread-safe by its own lock.
//
// Every conversion that cannot carry a field reports it in a Loss, so the
// caller can count it and log it once per resource (docs/translation.md).
#ifndef DPPROXY_PROXY_TRANSLATE_TRANSLATE_H_
#define DPPROXY_PROXY_TRANSLATE_TRANSLATE_H_

#include <cstdint>
#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/v1alpha/api.pb.h"
#include "proto/v1beta1/api.pb.h"

namespace dpproxy {

// What a conversion had to drop.
struct Loss {
  int annotations = 0;  // annotation entries (no 1.9 kubelet reads them)
  int cdi_devices = 0;  // CDI device names (v1alpha has no field for them)
  int topology = 0;     // devices whose topology was dropped
  // DRA mode only: PreStartContainer calls made during prepare, not at
  // container start; prepares for a plugin that offers
  // GetPreferredAllocation, unused since the scheduler chose.
  int prestart_timing = 0;
  int preferred_allocation = 0;
  bool any() const {
    return annotations + cdi_devices + topology + prestart_timing + preferred_allocation > 0;
  }
};

// --- Requests toward a v1alpha backend --------------------------------------

// One v1alpha request for one container request (same IDs, same order).
deviceplugin::AllocateRequest ToV1AlphaAllocate(const v1beta1::ContainerAllocateRequest& c);

// --- Responses and lists from a v1alpha backend -----------------------------------

// A v1alpha response as the container response it is on the wire (fields 1-4
// have the same numbers); annotations from later v1alpha protos are kept.
v1beta1::ContainerAllocateResponse FromV1AlphaResponse(const deviceplugin::AllocateResponse& r);

// Options the proxy answers for a v1alpha backend: neither PreStart nor
// preferred allocation exists there.
v1beta1::DevicePluginOptions V1AlphaBackendOptions();

// --- Toward a v1alpha (1.9) kubelet ----------------------------------------------------

// Drops annotations (never read by 1.9) and CDI devices (no field).
deviceplugin::AllocateResponse ToV1AlphaResponse(const v1beta1::ContainerAllocateResponse& r,
                                                 Loss* loss);

// Drops topology.
deviceplugin::ListAndWatchResponse ToV1AlphaList(const v1beta1::ListAndWatchResponse& r,
                                                 Loss* loss);

// The container request a v1alpha kubelet's Allocate stands for.
v1beta1::AllocateRequest FromV1AlphaAllocate(const deviceplugin::AllocateRequest& r);

// --- Counting what was lost -------------------------------------------------------------

// Counts dropped fields per resource and kind, and says when a kind is lost
// for the first time for a resource (the caller logs that once).
class LossCounter {
 public:
  // Adds `loss` for `resource`; returns the kinds ("annotations",
  // "cdi_devices", "topology", "prestart_timing", "preferred_allocation")
  // seen for the first time for that resource.
  std::vector<std::string> Add(const std::string& resource, const Loss& loss);
  // Total count of one kind for one resource.
  int64_t Count(const std::string& resource, const std::string& kind) const;
  // resource -> kind -> count.
  std::map<std::string, std::map<std::string, int64_t>> Snapshot() const;
  // Everything counted so far, in O(1) (grows with every loss).
  int64_t Total() const { return total_.load(); }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, int64_t>> counts_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> total_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_TRANSLATE_TRANSLATE_H_
