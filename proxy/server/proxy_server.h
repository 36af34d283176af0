// File: proxy_server.h
//
// dpproxy, wired: one device plugin per resource toward the kubelet, a
// kubelet toward vendor plugins. The server owns the parts and runs one
// housekeeping thread; each part does one job:
//
//   BackendRegistrationServer  plugins register here (backends/)
//   Resource                   a resource's devices and backend (core/)
//   KubeletEndpoint            its kubelet-facing socket, both APIs (kubelet/)
//   Registrar                  keeps each socket served and registered
//   Reconciler                 keeps the journal in step with the kubelet
//   StateKeeper                the durable state (state/)
//   ProxyStatus                what it reports (status_model.h)
//   Handover, Takeover         the two sides of a handoff between two
//                              dpproxy processes (handover.h, takeover.h)
//   Reloader                   what a SIGHUP changes, and in which order
//   Allocator                  each resource's one Allocate (core/)
//   DraSide                    DRA mode, in place of registering (dra/)
//
// The housekeeping thread wakes on a change (a device list, a backend, a
// file in device-plugins/) or once a second, and then: runs the resources'
// timers, reconnects static backends, lets the registrar serve and register,
// checks the kubelet's checkpoint and applies the quarantine. It never
// waits on the disk: after each pass the saver thread persists the
// resources and writes the status file if anything changed (O(resources)
// when nothing did).
#ifndef DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
#define DPPROXY_PROXY_SERVER_PROXY_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "proxy/core/allocator.h"
#include "proxy/core/backend.h"
#include "backends/registration_server.h"
#include "proxy/config/proxy_config.h"
#include "proxy/dra/dra_side.h"
#include "proxy/core/resource.h"
#include "proxy/events/event_log.h"
#include "proxy/events/telemetry.h"
#include "proxy/kubelet/kubelet_endpoint.h"
#include "proxy/server/reconciler.h"
#include "proxy/handoff/handoff.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/server/registrar.h"
#include "proxy/server/reloader.h"
#include "proxy/server/handover.h"
#include "proxy/server/takeover.h"
#include "proxy/server/status_model.h"
#include "proxy/state/state_keeper.h"
#include "proxy/translate/translate.h"
#include "proxy/util/dir_watcher.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class ProxyServer : private Handover::Host, private Reloader::Host {
 public:
  explicit ProxyServer(ProxyConfig config);
  ~ProxyServer() override;

  ProxyServer(const ProxyServer&) = delete;
  ProxyServer& operator=(const ProxyServer&) = delete;

  absl::Status Start();
  // Closes streams, stops backends, removes the proxy's sockets. Idempotent.
  void Shutdown();

  EventLog& events() { return events_; }
  LossCounter& losses() { return losses_; }
  // The durable state (nullptr without a state_dir).
  StateKeeper* state() { return keeper_.get(); }
  // One reconciliation pass over pod-resources / the kubelet's checkpoint
  // now (also run periodically; see reconciler.h). kFailedPrecondition
  // without a state directory.
  absl::Status ReconcileOnce();
  absl::Status ReconcileCheckpointOnce();
  // Where vendor plugins register.
  std::string backend_registration_socket() const;
  // Refused backend registrations by reason.
  std::map<std::string, int64_t> RegistrationRejections();
  // What dpproxy reports. Without `with_devices` (metrics), the per-device
  // lists are left out and the cost is O(resources).
  ProxyStatus Status(bool with_devices = true);
  // Behind /livez: the housekeeping thread (which serves and registers
  // after a kubelet restart) completed a pass in the last 30 s; it runs
  // at least once a second.
  std::vector<HealthCheck> Liveness();
  // The metrics updated as things happen (call durations, journal syncs,
  // registration times); expose telemetry().registry().
  Telemetry& telemetry() { return telemetry_; }
  // Behind /readyz: registered with the kubelet for every resource, and
  // the state directory writable (with one).
  std::vector<HealthCheck> Readiness();
  // Called on the housekeeping thread at the end of every pass (at least
  // once a second): the systemd watchdog's keep-alive comes from the thread
  // that would hang. Set before Start().
  void SetHousekeepingHook(std::function<void()> hook) { housekeeping_hook_ = std::move(hook); }
  // How often a status with devices was built, and how many housekeeping
  // passes ran (tests: an idle proxy builds nothing).
  int64_t status_builds() const { return status_builds_.load(); }
  int64_t housekeeping_passes() const { return housekeeping_passes_.load(); }
  int64_t save_passes() const { return save_passes_.load(); }
  // The kubelet-facing socket of a resource ("" if unknown).
  std::string KubeletSocketOf(const std::string& resource);

  // Takes a connected backend (from the registration socket or a static
  // backend) and makes it serve its resource.
  absl::Status AttachBackend(std::shared_ptr<Backend> backend);

  // A configuration reload (SIGHUP): `next` is valid (ValidateConfig).
  // Applies what can change while running, one change at a time with an
  // event each, and reports the rest, which takes effect at the next start
  // (reloader.h says which is which). Resources whose settings did not
  // change are untouched.
  using ReloadResult = Reloader::Result;
  ReloadResult Reload(const ProxyConfig& next) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Handoff between two dpproxy processes (proxy/handoff/handoff.proto)
  // With a state directory, dpproxy serves <state_dir>/handoff.sock; one
  // started with takeover calls it instead of waiting for the lock. Called
  // once this dpproxy has handed everything over (the new one is
  // registered): the caller stops it. Set before Start().
  void SetHandedOverHook(std::function<void()> hook) { handed_over_hook_ = std::move(hook); }
  // Taking over: called once the new dpproxy is registered, just before
  // it tells the old one to finish (systemd learns the new main process).
  // Set before Start().
  void SetBeforeFinishHook(std::function<void()> hook) { before_finish_hook_ = std::move(hook); }
  bool handed_over() const { return handover_ != nullptr && handover_->handed_over(); }
  // Released to a new dpproxy that never served (handoff_abandoned): this
  // one stops (the same hook) and its main exits non-zero.
  bool handoff_failed() const { return handover_ != nullptr && handover_->failed(); }
  // The HTTP listener (metrics and probes) a dpproxy taking over from this
  // one is handed (listener_share.h); -1: none. Set before Start().
  void SetSharedListener(int fd) { shared_listener_fd_ = fd; }
  // The kubelet-facing socket generation (KubeletSideOptions): the other
  // one than the predecessor's after a takeover.
  int socket_generation() const { return socket_generation_; }
  // Takeover side: whether the predecessor was told to finish (tests).
  bool WaitForTakeover(absl::Duration timeout);

 private:
  struct Entry {
    std::unique_ptr<Resource> resource;
    // Every allocation of the resource, from either side (allocator.h).
    std::unique_ptr<Allocator> allocator;
    std::unique_ptr<KubeletEndpoint> endpoint;  // null in DRA mode
    // Dialled by dpproxy (a reload may add or drop it).
    std::atomic<bool> static_backend{false};
    StaticBackendConfig static_config;  // under mu_
    bool connecting = false;           // a static connect is running
    std::string restored_kubelet_api;  // from the state file, until registered
    // The plugin's resource name: the current backend's, or the last
    // one's (from the state file after a restart); "" if none yet.
    std::string backend_resource;
    // Its static backend was removed from the configuration (and no plugin
    // registered for it since): its devices are shown Unhealthy.
    bool static_removed = false;
    // Its static backend cannot be dialled: why (the last failure), how
    // often in a row, and when that was last logged. Under mu_.
    std::string static_error;
    int64_t static_failures = 0;
    absl::Time static_logged_at = absl::InfinitePast();
  };

  // The resource's entry, made and handed to the registrar if new. With
  // `attach`, a new entry gets that backend before the registrar sees it,
  // so that its first registration carries the backend's options (1.10-1.24
  // kubelets read them from RegisterRequest only).
  Entry* EnsureEntry(const std::string& name, std::shared_ptr<Backend> attach = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Entry*> Entries() ABSL_LOCKS_EXCLUDED(mu_);
  // Steering away from forgotten devices (KubeletEndpoint::steering): the
  // allocator's refusals alone where there is no endpoint (DRA mode).
  static KubeletEndpoint::SteeringCounts SteeringOf(Entry* e);
  // The kubelet-facing name of a plugin's resource, after renames as a
  // reload left them.
  std::string ServedName(const std::string& backend_resource) ABSL_LOCKS_EXCLUDED(mu_);
  // What a reload changes (reloader.h). A reload's renames, ID maps and
  // compact IDs: each resource they change gets its backend dialled again,
  // under its new name or with its new IDs (as a restart would do for it
  // alone).
  void ApplyLossPolicy(const ProxyConfig& next) override;
  void ApplyCallSettings(const ProxyConfig& next) override;
  void ApplyServedNames(const ProxyConfig& next) override ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveStaticBackend(const StaticBackendConfig& b) override;
  void AddStaticBackend(const StaticBackendConfig& b) override;
  void StaticBackendsApplied(const ProxyConfig& next) override;
  // Quarantines, renamed names and devices held under another name or ID
  // (held_elsewhere.h), shown Unhealthy; when any of them changed.
  void ApplyQuarantine();
  void Wake();
  void HousekeepingLoop();
  void SaverLoop();
  void CheckpointLoop();
  // Resource timers and static backends that are away (on the workers).
  void TickResources(absl::Time now);
  void ConnectStatic(Entry* e);
  // A static backend's dial failed (logged at the first failure, then once
  // a minute), or succeeded after failures.
  void NoteStaticDial(Entry* e, const StaticBackendConfig& sb, const absl::Status& s);
  absl::Status RestoreState();
  // What status and the saved resources are made of, in O(resources):
  // change counters and the few small values that have none.
  std::string Fingerprint();
  // Each returns true if it did the work (something changed).
  bool PersistResources(const std::string& fingerprint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(saver_mu_);
  bool WriteStatusIfChanged(const std::string& fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(saver_mu_);
  // The handoff's running side (handover.h) on this dpproxy's parts.
  std::vector<KubeletEndpoint*> HandoverEndpoints() override;
  absl::Duration AllocateWait() override;
  void StopWriting() override;
  absl::StatusOr<int> ResumeWriting() override;
  // Released to a new dpproxy: nothing more is saved or written.
  bool released() const { return handover_ != nullptr && handover_->released(); }
  // The taking-over side, stopping or failing before it finished: close
  // the journal, unlock and hand the state back to the predecessor.
  void GiveStateBack(const std::string& why);
  // Started with --takeover, and the predecessor released.
  bool taking_over() const { return takeover_ != nullptr && takeover_->released(); }
  // Shutdown() has begun.
  bool stopping();

  const ProxyConfig config_;
  // config_ with what reloads applied: what the next reload compares with,
  // and the loss policy new resources get.
  ProxyConfig live_config_ ABSL_GUARDED_BY(mu_);
  EventLog events_{"dpproxy"};
  Telemetry telemetry_;
  LossCounter losses_;
  // The state directory's lock (state_dir/lock), held for this object's
  // life: declared before keeper_ so it is released after the journal is
  // closed. Two dpproxy processes must never write one journal.
  struct LockFd {
    int fd = -1;
    ~LockFd();
  } state_lock_;
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<BackendRegistrationServer> registration_;
  std::unique_ptr<DirWatcher> watcher_;
  // Blocking work handed off by housekeeping (Register, static connects).
  std::unique_ptr<WorkQueue> workers_;
  std::unique_ptr<Registrar> registrar_;
  std::unique_ptr<Reconciler> reconciler_;  // with a state directory only
  std::unique_ptr<DraSide> dra_;  // DRA mode only
  Reloader reloader_{this, &events_, config_.dra.enabled};

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ForgottenStatus> forgotten_rows_ ABSL_GUARDED_BY(mu_);
  // Grows each time ApplyQuarantine stores the rows above (Fingerprint).
  std::atomic<uint64_t> rows_version_{0};
  std::vector<HeldElsewhereStatus> held_elsewhere_rows_ ABSL_GUARDED_BY(mu_);
  // Kubelet name -> the name it is served as now, for renamed ones.
  std::map<std::string, std::string> renamed_ ABSL_GUARDED_BY(mu_);
  // Grows when what ApplyQuarantine reads changes other than through the
  // keeper: a backend attached, a reload of names or IDs.
  std::atomic<uint64_t> served_version_{0};

  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool save_wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool checkpoint_wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  // Kubelet restarts seen by housekeeping, for the checkpoint thread.
  std::vector<Reconciler::RestartSeen> restarts_seen_ ABSL_GUARDED_BY(wake_mu_);
  std::thread housekeeping_;
  std::thread saver_;
  std::thread checkpoint_;  // with a reconciler only

  // Housekeeping thread only.
  absl::Time next_retry_ = absl::InfiniteFuture();
  std::function<void()> housekeeping_hook_;  // set before Start()
  // ApplyQuarantine's (housekeeping, and a backend attaching).
  absl::Mutex quarantine_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t applied_quarantine_ ABSL_GUARDED_BY(quarantine_mu_) = 0;
  uint64_t applied_released_ ABSL_GUARDED_BY(quarantine_mu_) = 0;
  uint64_t applied_served_ ABSL_GUARDED_BY(quarantine_mu_) = 0;
  // The saver's pass, and a handoff's last save: what was last saved and
  // written.
  absl::Mutex saver_mu_;
  std::string persisted_fingerprint_ ABSL_GUARDED_BY(saver_mu_);
  std::string written_fingerprint_ ABSL_GUARDED_BY(saver_mu_);
  // The status file could not be written: tried again at status_retry_at_.
  bool status_failing_ ABSL_GUARDED_BY(saver_mu_) = false;
  absl::Time status_retry_at_ ABSL_GUARDED_BY(saver_mu_);

  // Handoff: the running side (with a state directory, not in DRA mode),
  // and the taking-over side (--takeover only).
  std::unique_ptr<Handover> handover_;
  int shared_listener_fd_ = -1;
  // Takeover side: why Start failed (given to the predecessor with the
  // state), and the takeover (--takeover only).
  std::string start_error_;
  std::unique_ptr<Takeover> takeover_;
  int socket_generation_ = 0;  // set before the first entry
  std::function<void()> handed_over_hook_;  // set before Start()
  std::function<void()> before_finish_hook_;  // set before Start()

  std::atomic<int64_t> status_builds_{0};
  std::atomic<int64_t> housekeeping_passes_{0};
  // When the last housekeeping pass ended (absl::ToUnixNanos).
  std::atomic<int64_t> housekeeping_at_ns_{0};
  std::atomic<int64_t> save_passes_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
