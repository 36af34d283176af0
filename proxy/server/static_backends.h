// File: static_backends.h
//
// The backends dpproxy dials itself (`static_backends` in the
// configuration), for plugins that serve a socket but never register. Per
// kubelet-facing resource name: which endpoint is dialled, whether a
// dial is running, why the last one failed and how often in a row, and
// whether a reload removed it (its devices are then shown Unhealthy until
// a plugin serves the resource again).
//
// Tick() starts a dial on the workers for each dialled resource whose
// backend is away, one at a time per resource, every tick (a second)
// until it connects. A failure is logged at once and then once a minute
// (event static_backend_unreachable at the first); a success after
// failures is logged once.
//
//   StaticBackends statics({max_list_bytes}, &workers, &events, attach);
//   statics.Dial("example.com/nic", config.static_backends[0]);
//   statics.Tick(table.All());  // from housekeeping
#ifndef DPPROXY_PROXY_SERVER_STATIC_BACKENDS_H_
#define DPPROXY_PROXY_SERVER_STATIC_BACKENDS_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/backend.h"
#include "proxy/events/event_log.h"
#include "proxy/server/resource_table.h"
#include "proxy/util/waitable_count.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class StaticBackends {
 public:
  struct Options {
    int max_list_bytes = 0;  // a backend's device-list cap
  };
  // How a resource's static backend is doing, for status and saving.
  struct Report {
    bool dialled = false;  // dpproxy dials it now
    bool removed = false;  // a reload removed it, and no plugin serves it
    std::string error;     // why the last dial failed ("" once dialled)
    int64_t failures = 0;  // failed dials in a row
  };
  // Hands a connected backend over to be served.
  using Attach = std::function<absl::Status(std::shared_ptr<Backend>)>;

  StaticBackends(Options options, WorkQueue* workers, EventLog* events, Attach attach)
      : options_(options), workers_(workers), events_(events), attach_(std::move(attach)) {}

  StaticBackends(const StaticBackends&) = delete;
  StaticBackends& operator=(const StaticBackends&) = delete;

  // `name` is dialled at `config` from now on (a start, a reload adding it).
  void Dial(const std::string& name, const StaticBackendConfig& config) ABSL_LOCKS_EXCLUDED(mu_);
  // A reload removed `config`: true if `name` was dialled there, and is
  // now removed (not dialled, shown Unhealthy).
  bool Remove(const std::string& name, const StaticBackendConfig& config)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A rename: what `from` dialled is dialled for `to`. False if `from`
  // was not dialled.
  bool Move(const std::string& from, const std::string& to) ABSL_LOCKS_EXCLUDED(mu_);
  // A plugin registered for `name`: it is not removed any more.
  void PluginServes(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // The state file says `name`'s static backend is gone from the
  // configuration.
  void MarkRemoved(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  bool dialled(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  Report report(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  std::set<std::string> removed() ABSL_LOCKS_EXCLUDED(mu_);
  // What status shows of them, for the saver's fingerprint: whether each
  // fails and why, not its count of attempts (one a second).
  void AppendFingerprint(std::string* out) ABSL_LOCKS_EXCLUDED(mu_);

  // Dials, on the workers, each dialled resource whose backend is away.
  void Tick(const std::vector<ServedResource*>& served) ABSL_LOCKS_EXCLUDED(mu_);
  // How many dials ended, failed or not (one a second while one fails,
  // with nothing else to say so).
  const WaitableCount& dials() const { return dials_; }

 private:
  WaitableCount dials_;

  struct Dialled {
    StaticBackendConfig config;
    bool dialled = false;
    bool removed = false;
    bool connecting = false;
    std::string error;
    int64_t failures = 0;
    absl::Time logged_at = absl::InfinitePast();
  };

  void Connect(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  // A dial failed (logged at the first failure, then once a minute), or
  // succeeded after failures.
  void Note(const std::string& name, const StaticBackendConfig& config, const absl::Status& s)
      ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  WorkQueue* const workers_;
  EventLog* const events_;
  const Attach attach_;
  absl::Mutex mu_;
  std::map<std::string, Dialled> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_STATIC_BACKENDS_H_
