// File: reporter.h
//
// What dpproxy says about itself, read from its parts: the status (dpctl,
// the status file, metrics), readiness (/readyz), the resources as the
// state file saves them, and a fingerprint of all of that which changes
// whenever any of it does, at O(resources) (change counters and the few
// small values that have none). The saver (saver.h) compares
// fingerprints, so an idle dpproxy builds nothing.
//
// Every part but the table may be absent (null): no state directory, DRA
// mode or not, before Start.
//
//   Reporter reporter(parts);
//   ProxyStatus st = reporter.Status(/*with_devices=*/false);
#ifndef DPPROXY_PROXY_SERVER_REPORTER_H_
#define DPPROXY_PROXY_SERVER_REPORTER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/registration_server.h"
#include "proxy/config/proxy_config.h"
#include "proxy/events/event_log.h"
#include "proxy/kubelet_side/dra/dra_side.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/server/withheld.h"
#include "proxy/server/redialer.h"
#include "proxy/holders/reconciler.h"
#include "proxy/server/resource_table.h"
#include "proxy/server/static_backends.h"
#include "proxy/status/status_model.h"
#include "proxy/state/state_keeper.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

class Reporter {
 public:
  struct Parts {
    const ProxyConfig* config = nullptr;
    ResourceTable* table = nullptr;
    StaticBackends* statics = nullptr;
    LossCounter* losses = nullptr;
    KubeletSide* side = nullptr;                       // the kubelet's, whichever it is
    BackendRegistrationServer* registration = nullptr;
    StateKeeper* keeper = nullptr;                     // with a state directory
    Reconciler* reconciler = nullptr;                  // with one, not in DRA mode
    Withheld* withheld = nullptr;                      // with a state directory
    DraSide* dra = nullptr;                            // the side, in DRA mode
    Redialer* redialer = nullptr;                      // once serving
  };

  explicit Reporter(Parts parts) : p_(parts) {}

  // Without `with_devices` (metrics), the per-device lists are left out
  // and the cost is O(resources).
  ProxyStatus Status(bool with_devices = true);
  std::string Fingerprint();
  // Each resource as the state file keeps it (state::Resource, serialized
  // straight from the published device list: no copy of every device), in
  // order of name.
  std::vector<StateKeeper::ResourceToSave> SavedResources();
  // Behind /readyz: registered with the kubelet for every resource, each
  // plugin's list taken, the state directory writable (with one).
  std::vector<HealthCheck> Readiness();

  // How often a status with devices was built (tests: an idle proxy
  // builds nothing).
  int64_t status_builds() const { return status_builds_.load(); }

 private:
  ResourceStatus ResourceStatusOf(ServedResource* e, bool with_devices);
  StateStatus StateStatusOf();

  const Parts p_;
  std::atomic<int64_t> status_builds_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_REPORTER_H_
