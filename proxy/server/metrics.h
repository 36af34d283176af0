// File: metrics.h
//
// dpproxy's Prometheus metrics, collected when scraped from what the proxy
// already tracks, so no call path pays for them:
//
//   dpproxy_events_total{event,resource}        lifecycle events and calls:
//       kubelet_registered, kubelet_restart_detected, backend_up, backend_down,
//       allocate, lossy_translation, state_save_failed, devices_vanished, ...
//   dpproxy_devices{resource,health}            devices reported to the kubelet
//   dpproxy_backend_connected{resource}, dpproxy_kubelet_registered{resource}
//   dpproxy_resource_info{resource,kubelet_api,backend_api}   the versions
//   process_cpu_seconds_total, process_resident_memory_bytes, ...   from /proc
//   dpproxy_lossy_translations_total{resource,kind}
//   dpproxy_backend_registrations_rejected_total{reason}
//   dpproxy_quarantined_devices{resource}, dpproxy_devices_held_twice_total
//   dpproxy_state_save_failures_total, dpproxy_journal_allocations
//
// Labels carry only names dpproxy serves and fixed sets (reasons, health):
// a name from a refused registration never becomes a series.

#ifndef DPPROXY_PROXY_SERVER_METRICS_H_
#define DPPROXY_PROXY_SERVER_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>

#include "proxy/events/event_log.h"
#include "proxy/status/status_model.h"

namespace dpproxy {

// True if `host_port` ("127.0.0.1:9464", "[::1]:9464", "localhost:9464")
// names a loopback address; false for "0.0.0.0:9464", ":9464" and others.
bool IsLoopbackAddress(const std::string& host_port);

class ProxyMetrics : public prometheus::Collectable {
 public:
  // `status` is called at each scrape (e.g. ProxyServer::Status(false)).
  ProxyMetrics(std::function<ProxyStatus()> status, EventLog* events)
      : status_(std::move(status)), events_(events) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

  // The Prometheus text exposition of Collect(), for tests and debugging.
  std::string Text() const;

 private:
  const std::function<ProxyStatus()> status_;
  EventLog* const events_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_METRICS_H_
