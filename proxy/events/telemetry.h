// File: telemetry.h
//
// The metrics dpproxy updates as things happen (prometheus-cpp families in
// a registry of their own), beside those ProxyMetrics derives at each
// scrape from the status:
//
//   dpproxy_rpc_duration_seconds{side,method,resource,kubelet_api,
//       backend_api,code}            every call, kubelet side (from the
//                                    kubelet's call arriving to the answer)
//                                    and backend side (dpproxy's call to the
//                                    plugin); buckets 50 us .. 30 s
//   dpproxy_journal_fsync_duration_seconds   each journal write + fdatasync
//   dpproxy_kubelet_registration_seconds{resource}
//                                    from the kubelet's socket appearing to
//                                    the resource registered with it
//
// Labels are bounded: resources dpproxy serves, API versions, gRPC code
// names, a fixed set of methods. Thread-safe. Each label set's histogram is
// made once and then found by one hash lookup under a reader lock: building
// prometheus-cpp's label map and asking its family for the histogram costs
// a dozen allocations and a histogram built and thrown away per call.
#ifndef DPPROXY_PROXY_EVENTS_TELEMETRY_H_
#define DPPROXY_PROXY_EVENTS_TELEMETRY_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dpproxy {

class Telemetry {
 public:
  Telemetry();

  // The registry to expose (a prometheus::Collectable).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // `side`: "kubelet" or "backend". `code`: the gRPC code's name ("OK").
  void ObserveRpc(absl::string_view side, absl::string_view method, absl::string_view resource,
                  absl::string_view kubelet_api, absl::string_view backend_api,
                  absl::string_view code, absl::Duration d);
  void ObserveJournalSync(absl::Duration d);
  void ObserveRegistration(absl::string_view resource, absl::Duration since_kubelet_start);

 private:
  // dpproxy_rpc_duration_seconds' buckets: 50 us doubling to 30 s.
  static const prometheus::Histogram::BucketBoundaries& RpcBuckets();

  const std::shared_ptr<prometheus::Registry> registry_;
  // dpproxy_rpc_duration_seconds' histograms by their labels' values, each
  // ended by a NUL (the family owns them; none is ever removed).
  mutable absl::Mutex rpc_mu_;
  absl::flat_hash_map<std::string, prometheus::Histogram*> rpc_by_labels_
      ABSL_GUARDED_BY(rpc_mu_);
  prometheus::Family<prometheus::Histogram>& rpc_;
  prometheus::Family<prometheus::Histogram>& fsync_;
  prometheus::Family<prometheus::Histogram>& registration_;
  prometheus::Histogram& fsync_all_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_EVENTS_TELEMETRY_H_
