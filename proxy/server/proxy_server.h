// File: proxy_server.h
//
// dpproxy: one device plugin per resource toward the kubelet, a kubelet
// toward vendor plugins, translating between them. Owns the backend
// registration socket, static backends, the per-resource state and kubelet
// endpoints, and the registrar that (re-)registers with the kubelet:
// inotify on device-plugins/ plus a stat check once a second; a new
// kubelet.sock or our socket removed means a kubelet restart, after which
// every resource is served and registered again with the cached device list.
// Backend connections stay open throughout.
#ifndef DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
#define DPPROXY_PROXY_SERVER_PROXY_SERVER_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "backends/registration_server.h"
#include "proxy/config/proxy_config.h"
#include "proxy/util/dir_watcher.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet/kubelet_endpoint.h"
#include "proxy/kubelet/kubelet_checkpoint.h"
#include "proxy/server/holdings.h"
#include "proxy/util/work_queue.h"
#include "proxy/state/state_keeper.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

class ProxyServer {
 public:
  explicit ProxyServer(ProxyConfig config);
  ~ProxyServer();

  ProxyServer(const ProxyServer&) = delete;
  ProxyServer& operator=(const ProxyServer&) = delete;

  absl::Status Start();
  // Closes streams, stops backends, removes the proxy's sockets. Idempotent.
  void Shutdown();

  EventLog& events() { return events_; }
  LossCounter& losses() { return losses_; }
  // The durable state (nullptr without a state_dir).
  StateKeeper* state() { return keeper_.get(); }
  // One reconciliation pass now (also run periodically). kUnavailable if
  // the pod-resources API did not answer (nothing is released then).
  absl::Status ReconcileOnce();
  // One pass over the kubelet's checkpoint now (also run when it changes
  // and on the reconcile interval): journal entries no kubelet container
  // holds in two passes (and older than the grace) are released.
  // kUnavailable if the checkpoint cannot be read.
  absl::Status ReconcileCheckpointOnce();
  // Where vendor plugins register.
  std::string backend_registration_socket() const;
  // Refused backend registrations by reason.
  std::map<std::string, int64_t> RegistrationRejections();
  // Resources, negotiated versions, backends, devices, lossy counters.
  // Without `with_devices` (metrics), the per-device lists are left out and
  // the cost is O(resources).
  Json Status(bool with_devices = true);
  // How often a status with devices was built, and how many registrar
  // passes ran (tests: an idle proxy builds nothing).
  int64_t status_builds() const { return status_builds_.load(); }
  int64_t registrar_ticks() const { return registrar_ticks_.load(); }
  // The kubelet-facing socket of a resource ("" if unknown).
  std::string KubeletSocketOf(const std::string& resource);

  // Takes a connected backend (from the registration socket or a static
  // backend) and makes it serve its resource.
  absl::Status AttachBackend(std::shared_ptr<Backend> backend);

 private:
  struct Entry {
    std::unique_ptr<Resource> resource;
    std::unique_ptr<KubeletEndpoint> endpoint;
    std::optional<FileId> registered_with;  // kubelet.sock it registered at
    // Options sent in that registration (serialized): kubelets up to 1.24
    // read them only there, so a change means registering again.
    std::string registered_options;
    // Bumped each time the socket is served again: a Register that began
    // before does not count (the kubelet's stream is on the old server).
    uint64_t served = 0;
    // A Register (or static connect) is running on a worker; at most one.
    bool registering = false;
    bool connecting = false;
    // After a failed Register: not before retry_at, then backoff doubles.
    absl::Time retry_at = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    bool static_backend = false;
    StaticBackendConfig static_config;
    std::string restored_kubelet_api;  // from the state file, until registered
  };

  Entry* EnsureEntry(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  void RegistrarLoop();
  void CheckKubelet();
  void WakeRegistrar();
  void ConnectStatic(Entry* e);
  // Runs on a worker: one registration of `e` with the kubelet at `kubelet`.
  void RegisterOnWorker(Entry* e, FileId kubelet, std::string options, uint64_t served);
  void WriteStatusIfChanged(const std::string& fingerprint);
  absl::Status RestoreState();
  void PersistResources(const std::string& fingerprint);
  void ReconcileLoop();
  std::string PodResourcesSocket() const;
  // Kubelet checkpoint: the check after a kubelet restart, and releasing
  // entries no kubelet container holds (registrar thread).
  void CheckKubeletCheckpoint();
  Holdings CheckpointHoldings(const KubeletCheckpoint& ckpt);
  absl::Status CheckpointPass(const KubeletCheckpoint& ckpt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  // Marks allocations quarantined, logs and reports each (and any device
  // the kubelet has handed out again meanwhile).
  void QuarantineAllocations(const std::vector<uint64_t>& ids, const std::string& reason);
  // Reports quarantined devices Unhealthy (registrar thread, on change).
  void ApplyQuarantine();

  const ProxyConfig config_;
  EventLog events_{"dpproxy"};
  LossCounter losses_;
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<BackendRegistrationServer> registration_;
  std::unique_ptr<DirWatcher> watcher_;

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread registrar_;
  // Blocking work handed off by the registrar (Register, static connects).
  std::unique_ptr<WorkQueue> workers_;
  // When the registrar must look again at the latest (retries).
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread reconciler_;
  // Allocation ids missing from the last successful List (reconciler only).
  std::set<uint64_t> missing_once_;
  // Registrar thread only: the kubelet.sock last seen, the check pending
  // after a kubelet restart, and the checkpoint last parsed.
  struct RestartCheck {
    std::set<uint64_t> live;  // allocations live when the restart was seen
    std::optional<FileId> checkpoint_before;
    absl::Time deadline;
  };
  std::optional<FileId> last_kubelet_;
  std::optional<RestartCheck> restart_check_;
  std::optional<FileId> last_checkpoint_;
  absl::Time last_checkpoint_parse_ = absl::InfinitePast();
  absl::Mutex checkpoint_mu_;  // one checkpoint pass at a time
  std::set<uint64_t> checkpoint_missing_once_ ABSL_GUARDED_BY(checkpoint_mu_);
  // What the kubelet's checkpoint listed at the last pass, and when: at a
  // kubelet restart only those (and anything newer) were live for it.
  bool checkpoint_seen_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  std::set<uint64_t> checkpoint_live_ ABSL_GUARDED_BY(checkpoint_mu_);
  int64_t checkpoint_read_ms_ ABSL_GUARDED_BY(checkpoint_mu_) = 0;
  uint64_t applied_quarantine_ = 0;
  Json quarantine_status_ ABSL_GUARDED_BY(mu_) = Json::array();
  int64_t devices_held_twice_ ABSL_GUARDED_BY(mu_) = 0;
  // What status and the saved resources are made of, in O(resources):
  // change counters and the few small values that have none.
  std::string Fingerprint();
  // Registrar thread only: the fingerprint of the last persisted resources
  // and written status file.
  std::string persisted_fingerprint_;
  std::string written_fingerprint_;
  std::atomic<int64_t> status_builds_{0};
  std::atomic<int64_t> registrar_ticks_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
