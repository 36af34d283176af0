#include "proxy/events/telemetry.h"

#include <array>

namespace dpproxy {

namespace {

prometheus::Histogram::BucketBoundaries Doubling(double from, double to) {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = from; v < to; v *= 2) b.push_back(v);
  b.push_back(to);
  return b;
}

}  // namespace

const prometheus::Histogram::BucketBoundaries& Telemetry::RpcBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries(Doubling(50e-6, 30));
  return *b;
}

Telemetry::Telemetry()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpc_(prometheus::BuildHistogram()
               .Name("dpproxy_rpc_duration_seconds")
               .Help("Device-plugin calls: side=kubelet from the kubelet's call arriving to "
                     "dpproxy's answer, side=backend dpproxy's call to the plugin.")
               .Register(*registry_)),
      fsync_(prometheus::BuildHistogram()
                 .Name("dpproxy_journal_fsync_duration_seconds")
                 .Help("One journal write and its fdatasync (one per group of concurrent "
                       "Allocates).")
                 .Register(*registry_)),
      registration_(prometheus::BuildHistogram()
                        .Name("dpproxy_kubelet_registration_seconds")
                        .Help("From the kubelet's socket appearing (a kubelet start) to the "
                              "resource registered with it.")
                        .Register(*registry_)),
      fsync_all_(fsync_.Add({}, Doubling(50e-6, 10))) {}

void Telemetry::ObserveRpc(absl::string_view side, absl::string_view method,
                           absl::string_view resource, absl::string_view kubelet_api,
                           absl::string_view backend_api, absl::string_view code,
                           absl::Duration d) {
  const std::array<absl::string_view, 6> values = {side,        method,      resource,
                                                   kubelet_api, backend_api, code};
  std::string key;
  size_t size = 0;
  for (absl::string_view v : values) size += v.size() + 1;
  key.reserve(size);
  for (absl::string_view v : values) {
    key.append(v.data(), v.size());
    key.push_back('\0');
  }
  prometheus::Histogram* h = nullptr;
  {
    absl::ReaderMutexLock lock(&rpc_mu_);
    if (auto it = rpc_by_labels_.find(key); it != rpc_by_labels_.end()) h = it->second;
  }
  if (h == nullptr) {
    absl::MutexLock lock(&rpc_mu_);
    prometheus::Histogram*& slot = rpc_by_labels_[key];
    if (slot == nullptr) {
      slot = &rpc_.Add({{"side", std::string(side)},
                        {"method", std::string(method)},
                        {"resource", std::string(resource)},
                        {"kubelet_api", std::string(kubelet_api)},
                        {"backend_api", std::string(backend_api)},
                        {"code", std::string(code)}},
                       RpcBuckets());
    }
    h = slot;
  }
  h->Observe(absl::ToDoubleSeconds(d));
}

void Telemetry::ObserveJournalSync(absl::Duration d) {
  fsync_all_.Observe(absl::ToDoubleSeconds(d));
}

void Telemetry::ObserveRegistration(absl::string_view resource,
                                    absl::Duration since_kubelet_start) {
  registration_.Add({{"resource", std::string(resource)}}, Doubling(1e-3, 60))
      .Observe(absl::ToDoubleSeconds(since_kubelet_start));
}

}  // namespace dpproxy
