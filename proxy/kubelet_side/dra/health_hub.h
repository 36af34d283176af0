// File: health_hub.h
//
// The DRA health stream (DRAResourceHealth.NodeWatchResources, in package
// v1 for 1.37+ kubelets and v1alpha1 for 1.34-1.36, over the same
// messages; kubernetes/kubelet pkg/apis/dra-health) of dpproxy's devices:
// the device plugins' health as the kubelet reads it for pods' status.
// Both services serve one state. The owner sets each
// pool's devices as they change; every open stream is sent the full state
// at once and again after each change. At most one write per stream is in
// flight and states that arrive meanwhile fold into the newest: a stream
// costs no thread. A 1.36 kubelet opens the stream to every DRA driver and,
// where it is not served, logs an error every 5 s.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_HEALTH_HUB_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_HEALTH_HUB_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/impl/service_type.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/dra_health/v1alpha1/api.pb.h"

namespace dpproxy {

struct DeviceHealthEntry {
  enum class Health { kUnknown, kHealthy, kUnhealthy };
  std::string device;  // DRA device name
  Health health = Health::kUnknown;
  std::string message;  // why, for people
};

class HealthHub {
 public:
  HealthHub();
  ~HealthHub();

  // Replaces one pool's devices. Streams are sent the whole state when
  // anything changed; a device's last_updated_time is when its health last
  // changed.
  void SetPool(const std::string& pool, const std::vector<DeviceHealthEntry>& devices,
               absl::Time now = absl::Now());
  // Ends every stream (the server is stopping); later ones end at once.
  void Stop();

  // The services to register with the DRA service socket's server: v1 and
  // v1alpha1.
  std::vector<grpc::Service*> services();
  int streams();  // open now

  using Message = ::v1alpha1::NodeWatchResourcesResponse;

 private:
  template <typename Generated>
  class Service;
  class Stream;
  // The current state and its version; nullptr before any SetPool.
  std::pair<std::shared_ptr<const Message>, uint64_t> Current();
  // A stream is told the current state when added, and no more once removed.
  void Add(Stream* s);
  void Remove(Stream* s);

  std::unique_ptr<grpc::Service> service_v1_;
  std::unique_ptr<grpc::Service> service_v1alpha1_;
  // Held while streams are told of a state, and to add or remove one: a
  // stream is never told after it is removed (it deletes itself then).
  // Taken before mu_.
  absl::Mutex notify_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  struct Known {
    DeviceHealthEntry entry;
    int64_t updated_unix = 0;
  };
  std::map<std::string, std::map<std::string, Known>> pools_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Message> current_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_HEALTH_HUB_H_
