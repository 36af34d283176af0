// File: slice_publisher.h
//
// Keeps the API server's ResourceSlices of this node and driver equal to
// the devices dpproxy publishes, one pool per resource (resource_slices.h).
// Publish lists the pool's slices, and only when what they say differs from
// what should be published (a device changed health, appeared or went; the
// kubelet deleted the node's slices at its start) writes the pool again with
// its generation bumped: updates slices that exist, creates missing ones,
// deletes ones no longer needed. A conflict (someone wrote in between) is
// retried from a fresh list. The resource.k8s.io version written is the
// newest the server serves among v1, v1beta2 and v1beta1 (Discover).
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_SLICE_PUBLISHER_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_SLICE_PUBLISHER_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proxy/kubelet_side/dra/resource_slices.h"
#include "proxy/kube/kube_client.h"

namespace dpproxy {

// Reading the API server's answers, each checked by type first (a field of
// the wrong type fails with its path; json_shape.h). Exposed for the
// fuzzer.
//   The versions an API-group answer for resource.k8s.io lists.
absl::StatusOr<std::vector<std::string>> ServedVersions(const nlohmann::json& group);
//   The slices of one pool (of `node` and `driver`) in a ResourceSlice list.
absl::StatusOr<std::vector<nlohmann::json>> SlicesOfPool(const nlohmann::json& list,
                                                        const std::string& node,
                                                        const std::string& driver,
                                                        const std::string& pool_name);
//   What of a slice's spec is compared to tell a change (the server adds
//   defaults to the rest). Safe on any spec SlicesOfPool returned.
nlohmann::json SliceProjection(const nlohmann::json& spec);

class SlicePublisher {
 public:
  SlicePublisher(KubeClient* client, std::string driver, std::string node);

  // Finds the version to write. kFailedPrecondition naming what the server
  // serves when it is none dpproxy knows.
  absl::Status Discover();
  // The version to write: the one found, or found now (Discover). Safe from
  // any thread, as is api_version.
  absl::StatusOr<std::string> Version();
  // "resource.k8s.io/v1"; "" until found.
  std::string api_version() const;

  // Makes `resource`'s pool hold exactly the healthy ones of `devices`.
  absl::Status Publish(const std::string& resource, const std::vector<SliceDevice>& devices);
  // Deletes `resource`'s pool.
  absl::Status Unpublish(const std::string& resource);

  // Writes (creates, updates, deletes) made so far: a publish that changed
  // nothing adds none.
  int writes() const { return writes_.load(); }

 private:
  absl::Status PublishOnce(const std::string& version, const std::string& resource,
                           const std::vector<SliceDevice>& devices);
  absl::StatusOr<std::vector<nlohmann::json>> PoolSlices(const std::string& version,
                                                         const std::string& pool_name);

  KubeClient* const client_;
  const std::string driver_;
  const std::string node_;
  mutable absl::Mutex mu_;
  std::string api_version_ ABSL_GUARDED_BY(mu_);  // "resource.k8s.io/v1", after Discover
  std::atomic<int> writes_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_SLICE_PUBLISHER_H_
