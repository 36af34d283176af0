// File: dra_manager.h
//
// The simulated kubelet's DRA manager (1.32+): drivers registered through
// the plugin watcher, the service each release chooses, instances kept to
// fall back to, the health stream it watches, the node's ResourceSlices
// deleted at start, and claims prepared and unprepared. KubeletSim owns
// one, hands it the plugin watcher's DRA registrations and removals, and
// clears it when the kubelet stops.
//
// Thread-safe. It never calls back into KubeletSim, so KubeletSim may call
// it with its own lock held; it joins its health threads with none of its
// own locks held.
#ifndef DPPROXY_TOOLS_KUBELET_SIM_DRA_MANAGER_H_
#define DPPROXY_TOOLS_KUBELET_SIM_DRA_MANAGER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>
#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/pluginregistration/api.pb.h"
#include "proxy/events/event_log.h"

namespace dpproxy::sim {

class DraManager {
 public:
  struct Options {
    // The CDI directories the container runtime reads: a prepared claim's
    // CDI names are resolved there as a runtime would; empty: not resolved.
    std::vector<std::string> cdi_dirs;
    // The API server (a kubeconfig) and the node's name, for the slices
    // deleted at start. Empty kubeconfig: none.
    std::string kubeconfig;
    std::string node_name;
  };

  // A driver as registered, by name, and the service the release chose
  // from its supported_versions (1.34+ take v1.DRAPlugin where offered,
  // 1.32-1.33 know only v1beta1.DRAPlugin).
  //
  // Two instances of one driver (a rolling update, a takeover): from 1.33
  // the kubelet keeps both and calls the one registered last; when that
  // one's registration socket goes, it falls back to the other (events
  // dra_driver_replaced, dra_driver_fallback, dra_instance_removed). Up to
  // 1.32 a registration replaces the driver, and the removal of any of its
  // registration sockets deregisters it by name, whichever instance now
  // serves (kubernetes#129832 changed both in 1.33).
  struct Driver {
    std::string endpoint;
    std::string service;       // "v1.DRAPlugin" or "v1beta1.DRAPlugin"
    std::string registration;  // its socket in plugins_registry/
    // The health service the kubelet watches: "v1alpha1.DRAResourceHealth"
    // on 1.36 whatever the driver lists; on 1.37+ v1 if listed, else
    // v1alpha1 if listed, else "" (not watched).
    std::string health;
  };
  // What a 1.36+ kubelet's health stream last said of a device.
  struct DeviceHealth {
    std::string health;  // "HEALTHY", "UNHEALTHY", "UNKNOWN"
    std::string message;
    int64_t last_updated_time = 0;
  };
  struct Claim {
    std::string namespace_, name, uid;
  };

  DraManager(Options options, EventLog* events);
  // Stops every health stream.
  ~DraManager();
  DraManager(const DraManager&) = delete;
  DraManager& operator=(const DraManager&) = delete;

  // The release being played (its minor and name); set at each start.
  void SetKubelet(int minor, const std::string& name);

  // The plugin watcher found a DRA plugin (GetInfo type "DRAPlugin") at
  // `socket_path`: "" once registered, or why the release refused it.
  std::string Register(const pluginregistration::PluginInfo& info, const std::string& endpoint,
                       const std::string& socket_path);
  // Whether `driver` is registered.
  bool Serves(const std::string& driver);
  // A registration socket of `driver` went away (`path`): the driver as the
  // release deregisters it.
  void SocketRemoved(const std::string& path, const std::string& driver);
  // The kubelet stopped: drivers register again through the plugin watcher
  // after a start; their health streams end, and what they said is
  // forgotten.
  void Clear();
  // At start (1.32+, with a kubeconfig): deletes the node's ResourceSlices,
  // as the kubelet does (KEP-4381). A failure is the event
  // node_slices_delete_failed.
  void DeleteNodeSlices();

  // nullopt: not registered.
  std::optional<Driver> driver(const std::string& name);
  // The instances held: the one called and (1.33+) those to fall back to.
  int instances(const std::string& name);
  // What the health stream last said of each device, by "pool/device";
  // empty before the first message or on releases that do not watch
  // (1.32-1.35). Events: dra_health per message (devices, unhealthy,
  // unknown), dra_health_unsupported or dra_health_ended when a stream
  // ends (1.36 tries again 5 s later; 1.37 stops at Unimplemented).
  std::map<std::string, DeviceHealth> Health(const std::string& driver);
  // NodePrepareResources / NodeUnprepareResources for `claims` in the
  // driver's package (45 s deadline). The answer's claims as JSON: {uid:
  // {"devices": [{"pool", "device", "cdi_device_ids", "request_names"}],
  // "error"}}. kFailedPrecondition if the driver is not registered. With
  // cdi_dirs, each prepared device also gets "runtime": {"edits": {env,
  // deviceNodes, mounts}, "errors": [...]} (cdi_registry.h), and an
  // unresolvable name is the event "cdi_unresolved".
  absl::StatusOr<nlohmann::json> Prepare(const std::string& driver,
                                         const std::vector<Claim>& claims);
  absl::StatusOr<nlohmann::json> Unprepare(const std::string& driver,
                                           const std::vector<Claim>& claims);

 private:
  // One health stream (on a thread, until stopped), and a new stream 5 s
  // after one ends (the kubelet's fixed retry).
  struct HealthWatch {
    std::thread thread;
    absl::Mutex mu;
    bool stop ABSL_GUARDED_BY(mu) = false;
    grpc::ClientContext* ctx ABSL_GUARDED_BY(mu) = nullptr;
  };
  using Stops = std::vector<std::unique_ptr<HealthWatch>>;
  // Watches `driver`'s health at `endpoint` (`service` "": nothing); the
  // watch it replaces goes to `stops`.
  void StartHealthWatchLocked(const std::string& driver, const std::string& endpoint,
                              const std::string& service, Stops* stops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watch of `driver` into `stops`, and what it said forgotten.
  void StopHealthLocked(const std::string& driver, Stops* stops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchHealth(const std::string& driver, const std::string& endpoint,
                   const std::string& service, HealthWatch* w);
  // Stops and joins each; no lock held.
  static void Join(Stops stops);
  absl::StatusOr<nlohmann::json> Call(const std::string& driver,
                                      const std::vector<Claim>& claims, bool prepare);

  const Options options_;
  EventLog* const events_;
  absl::Mutex mu_;
  int minor_ ABSL_GUARDED_BY(mu_) = 0;
  std::string kubelet_name_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Driver> drivers_ ABSL_GUARDED_BY(mu_);
  // 1.33+: the instances registered before the current one, oldest first.
  std::map<std::string, std::vector<Driver>> older_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<HealthWatch>> watches_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<std::string, DeviceHealth>> health_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_DRA_MANAGER_H_
