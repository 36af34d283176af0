// File: reload_actions.h
//
// What a configuration reload does to the running parts, one kind of
// change at a time, as the Reloader (reloader.h) decides: the loss policy
// of every resource, the call settings of every endpoint, the static
// backends dialled, and the names and IDs resources are served under.
// Each call also updates the table's live configuration, which the next
// reload compares with and new resources are made from.
//
// A rename or new IDs: the plugin's next list must come to the new name,
// or with the new IDs, and complete, so its backend is dialled again, as a
// restart would do for that resource alone (by the static backends' tick
// when dpproxy dials it, on the workers otherwise).
//
//   ReloadActions actions(parts);
//   Reloader reloader(&actions, &events, dra);
#ifndef DPPROXY_PROXY_SERVER_RELOAD_ACTIONS_H_
#define DPPROXY_PROXY_SERVER_RELOAD_ACTIONS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/registration_server.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/backend.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/kubelet_side/split_side.h"
#include "proxy/events/event_log.h"
#include "proxy/server/reloader.h"
#include "proxy/server/resource_table.h"
#include "proxy/server/static_backends.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class ReloadActions : public Reloader::Host {
 public:
  struct Parts {
    ResourceTable* table = nullptr;
    StaticBackends* statics = nullptr;
    WorkQueue* workers = nullptr;
    BackendRegistrationServer* registration = nullptr;
    KubeletSide* side = nullptr;
    // The side, where dpproxy runs both (null otherwise): ApplyPaths
    // reroutes resources through it.
    SplitSide* split = nullptr;
    EventLog* events = nullptr;
    int max_list_bytes = 0;  // a backend's device-list cap
    // The entry of a kubelet-facing name, made if new.
    std::function<ServedResource*(const std::string& name)> ensure_entry;
    // Serves a connected backend (as one registering would be).
    std::function<absl::Status(std::shared_ptr<Backend>)> attach;
  };

  // Set once the parts exist (ProxyServer::Start), before any reload.
  void SetParts(Parts parts) { p_ = std::move(parts); }

  void ApplyLossPolicy(const ProxyConfig& next) override;
  void ApplyCallSettings(const ProxyConfig& next) override;
  void ApplyServedNames(const ProxyConfig& next) override;
  void ApplyPaths(const ProxyConfig& next) override;
  void RemoveStaticBackend(const StaticBackendConfig& b) override;
  void AddStaticBackend(const StaticBackendConfig& b) override;
  void StaticBackendsApplied(const ProxyConfig& next) override;

 private:
  // After a rename (to `renamed_to`) or new IDs (""): the plugin is
  // dialled again, or, when dpproxy dials it, detached for the next tick.
  void Redial(ServedResource* e, const std::string& renamed_to, bool static_backend,
              absl::Duration dial_timeout);

  Parts p_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_RELOAD_ACTIONS_H_
