// File: plugin_manager.h
//
// The simulated kubelet's plugin manager (1.13+; the kubelet's
// pkg/kubelet/pluginmanager): it watches <root>/plugins_registry/ and, at
// each pass of its reconciler, registers the sockets that appeared and
// deregisters those deleted or replaced, through the handler of each
// plugin's type (GetInfo's "DevicePlugin" or "DRAPlugin"), then tells the
// plugin the outcome (NotifyRegistrationStatus).
//
// As in the kubelet, the watcher records each socket's deletion at once and
// the reconciler acts at its next pass. A registered socket that is gone
// without a deletion event (renamed away) stays registered until a file at
// its path is created or deleted again, or the kubelet restarts.
//
// Thread-safe. It calls its handlers with its own lock held, so a handler
// must never call back into the manager; KubeletSim calls the manager with
// none of its own locks held.
#ifndef DPPROXY_TOOLS_KUBELET_SIM_PLUGIN_MANAGER_H_
#define DPPROXY_TOOLS_KUBELET_SIM_PLUGIN_MANAGER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/pluginregistration/api.pb.h"
#include "proxy/events/event_log.h"
#include "proxy/util/dir_watcher.h"

namespace dpproxy::sim {

class PluginManager {
 public:
  // What the kubelet does with one type of plugin (its PluginHandler).
  class Handler {
   public:
    virtual ~Handler() = default;
    // Validates and registers the plugin GetInfo described, registered at
    // `socket_path`: "" once registered, else the error the plugin is told.
    // A refusal is the handler's own event.
    virtual std::string RegisterPlugin(const pluginregistration::PluginInfo& info,
                                       const std::string& socket_path) = 0;
    // The registration socket `socket_path` of the plugin registered as
    // `name` was deleted or replaced.
    virtual void DeregisterPlugin(const std::string& name, const std::string& socket_path) = 0;
  };
  // The handler of a plugin type, or nullptr if the release has none.
  using HandlerFor = std::function<Handler*(const std::string& type)>;

  // `dir`: plugins_registry/. `dial_timeout`: how long a new socket is
  // dialled before its registration fails.
  PluginManager(std::string dir, absl::Duration dial_timeout, EventLog* events);
  ~PluginManager();
  PluginManager(const PluginManager&) = delete;
  PluginManager& operator=(const PluginManager&) = delete;

  // Starts watching `dir` for deletions; the first pass is the caller's
  // (Reconcile). Handlers come from `handlers` until Stop.
  absl::Status Start(HandlerFor handlers);
  // Stops watching and forgets every socket, without deregistering: a
  // stopped kubelet keeps nothing. A pass under way ends at its next dial.
  void Stop();
  // One pass of the reconciler: deregisters the sockets deleted or
  // replaced since the last, then registers each new one (dials it,
  // GetInfo, the handler, NotifyRegistrationStatus). Events:
  // watcher_found, watcher_registration_failed (dial or GetInfo failed),
  // registration_rejected (no handler for the type); and, as the watcher
  // sees it, watcher_socket_deleted.
  void Reconcile();

 private:
  // A socket seen: its identity (InodeKey), the name and type it
  // registered as, and whether that registration succeeded (a failed one
  // is not retried until the socket is replaced).
  struct Watched {
    std::string inode_key;
    std::string name;
    std::string type;
    bool registered = false;
  };
  void RegisterSocket(const std::string& socket_path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const absl::Duration dial_timeout_;
  EventLog* const events_;
  // Held for a whole pass, so Stop waits for the pass under way (which
  // sees stopping_ at its next dial slice).
  absl::Mutex mu_;
  HandlerFor handlers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Watched> watched_ ABSL_GUARDED_BY(mu_);
  // Deletions seen by the watcher since the last pass.
  absl::Mutex deleted_mu_;
  std::set<std::string> deleted_ ABSL_GUARDED_BY(deleted_mu_);
  std::atomic<bool> stopping_{true};
  std::unique_ptr<DirWatcher> watcher_;
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_PLUGIN_MANAGER_H_
