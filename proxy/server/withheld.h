// File: withheld.h
//
// The devices withheld from new pods: what a resource must not hand out
// although its plugin lists it healthy, applied to every resource after
// anything it depends on changed:
//   - devices held by containers the kubelet forgot
//     (forgotten_allocations.h): kept at
//     their real health, and steered around;
//   - devices held under another kubelet name or ID (held_elsewhere.h), by
//     renames, ID maps or compact IDs changed while pods held them: shown
//     Unhealthy;
//   - every device of a name no longer served (renamed away, or whose
//     static backend a reload removed): shown Unhealthy;
//   - devices an operator took out of service (dpctl cordon, the cordon
//     book): shown Unhealthy;
//   - where dpproxy serves both as device plugins and through DRA, devices
//     one path holds: hidden from the other side only
//     (Resource::SetHeldAcrossPaths), at each change of the holdings.
// It keeps the rows status reports of them. Apply() costs one pass over the
// journal's allocations, read in place, and nothing when the journal's
// releases, the forgotten allocations and the served names are as they
// were at the last pass.
//
//   Withheld w(&table, &statics, keeper, reconciler, &events);
//   w.Apply();  // each housekeeping pass, and before a backend attaches
#ifndef DPPROXY_PROXY_SERVER_WITHHELD_H_
#define DPPROXY_PROXY_SERVER_WITHHELD_H_

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proxy/events/event_log.h"
#include "proxy/holders/reconciler.h"
#include "proxy/server/resource_table.h"
#include "proxy/server/static_backends.h"
#include "proxy/status/status_model.h"
#include "proxy/state/cordon_book.h"
#include "proxy/state/state_keeper.h"

namespace dpproxy {

class Withheld {
 public:
  // `reconciler` is null in DRA mode (nothing forgotten there).
  Withheld(ResourceTable* table, StaticBackends* statics, StateKeeper* keeper,
           Reconciler* reconciler, CordonBook* cordons, EventLog* events)
      : table_(table), statics_(statics), keeper_(keeper), reconciler_(reconciler),
        cordons_(cordons), events_(events) {}

  Withheld(const Withheld&) = delete;
  Withheld& operator=(const Withheld&) = delete;

  void Apply() ABSL_LOCKS_EXCLUDED(apply_mu_, rows_mu_);

  // What status shows, as last applied.
  struct Rows {
    std::vector<ForgottenStatus> forgotten;
    std::vector<HeldElsewhereStatus> held_elsewhere;
    std::vector<CordonStatus> cordoned;
    std::map<std::string, std::string> renamed;  // kubelet name -> served as now
  };
  Rows rows() ABSL_LOCKS_EXCLUDED(rows_mu_);
  // Grows each time the rows are stored (the saver's fingerprint).
  uint64_t rows_version() const { return rows_version_.load(); }

 private:
  // Has anything it reads changed since the last pass? Takes the versions.
  bool Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Sets each resource's shown-Unhealthy and forgotten devices.
  void SetOnResources(const std::map<std::string, std::set<std::string>>& held,
                      const std::map<std::string, std::map<std::string, std::string>>& forgotten,
                      const std::set<std::string>& not_served);

  ResourceTable* const table_;
  StaticBackends* const statics_;
  StateKeeper* const keeper_;
  Reconciler* const reconciler_;
  CordonBook* const cordons_;
  EventLog* const events_;

  absl::Mutex apply_mu_ ABSL_ACQUIRED_BEFORE(rows_mu_);
  uint64_t applied_forgotten_ ABSL_GUARDED_BY(apply_mu_) = 0;
  uint64_t applied_released_ ABSL_GUARDED_BY(apply_mu_) = 0;
  uint64_t applied_served_ ABSL_GUARDED_BY(apply_mu_) = 0;
  uint64_t applied_cordons_ ABSL_GUARDED_BY(apply_mu_) = 0;
  // What each side must not offer because the other path holds it
  // (StateKeeper::HeldAcrossPaths), at each change.
  void ApplyHeldAcrossPaths() ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  uint64_t applied_across_ ABSL_GUARDED_BY(apply_mu_) = 0;
  uint64_t applied_across_served_ ABSL_GUARDED_BY(apply_mu_) = 0;
  absl::Mutex rows_mu_;
  Rows rows_ ABSL_GUARDED_BY(rows_mu_);
  std::atomic<uint64_t> rows_version_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_WITHHELD_H_
