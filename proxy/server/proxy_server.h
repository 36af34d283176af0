// File: proxy_server.h
//
// dpproxy, wired: toward the kubelet a device plugin per resource or a DRA
// driver, a kubelet toward vendor plugins. The server builds the parts,
// starts and stops them in order, and runs the housekeeping thread; each
// part does one job:
//
//   BackendRegistrationServer  plugins register here (backends/)
//   ResourceTable              the resources served (resource_table.h): each
//                              one's Resource and Allocator (core/)
//   StaticBackends             the backends dpproxy dials itself
//   KubeletSide                serves the resources to the kubelet, keeps
//                              them registered and notices its restarts:
//                              DevicePluginSide, DraSide, or a SplitSide
//                              of both where resources' paths differ
//                              (kubelet_side/, ProxyConfig::paths)
//   Reconciler                 keeps the journal in step with the kubelet
//   Withheld                   what a resource must not hand out
//   StateKeeper                the durable state (state/)
//   Reporter, Saver            what dpproxy reports (status_model.h), and
//                              the thread that saves and writes it
//   Handover, Takeover         the two sides of a handoff between two
//                              dpproxy processes (handover.h, takeover.h)
//   Reloader                   what a SIGHUP changes, and in which order
//
// The housekeeping thread wakes on a change (a device list, a backend, a
// file in device-plugins/) or once a second, and then: runs the resources'
// timers, dials static backends that are away, applies what is withheld and
// lets the kubelet side serve and register. It never waits on the disk or on
// the kubelet's checkpoint: after each pass the saver thread saves what
// changed, and the checkpoint thread reads the checkpoint.
#ifndef DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
#define DPPROXY_PROXY_SERVER_PROXY_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/registration_server.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/backend.h"
#include "proxy/events/event_log.h"
#include "proxy/events/telemetry.h"
#include "proxy/kubelet_side/device_plugin/device_plugin_side.h"
#include "proxy/kubelet_side/dra/dra_side.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/kubelet_side/split_side.h"
#include "proxy/server/handover.h"
#include "proxy/server/housekeeping.h"
#include "proxy/server/withheld.h"
#include "proxy/control/control_server.h"
#include "proxy/holders/cordon_control.h"
#include "proxy/state/cordon_book.h"
#include "proxy/server/redialer.h"
#include "proxy/holders/reconciler.h"
#include "proxy/server/reload_actions.h"
#include "proxy/server/reloader.h"
#include "proxy/server/reporter.h"
#include "proxy/server/resource_table.h"
#include "proxy/server/saver.h"
#include "proxy/server/static_backends.h"
#include "proxy/status/status_model.h"
#include "proxy/server/takeover.h"
#include "proxy/holders/pod_resources_view.h"
#include "proxy/state/state_keeper.h"
#include "proxy/translate/translate.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class ProxyServer : private Handover::Host {
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
  // Called on a registration worker just before each Register goes to the
  // kubelet at kubelet.sock (a test restarts the kubelet there). Set before
  // Start().
  void SetBeforeKubeletRegisterHook(std::function<void()> hook) {
    before_register_hook_ = std::move(hook);
  }
  // Called on the pass's thread when a resource's socket, removed (a
  // kubelet's start), has just been served again, before the registrar
  // notes it. Set before Start().
  void SetAfterServedAgainHook(std::function<void()> hook) {
    after_served_again_hook_ = std::move(hook);
  }
  // How often a status with devices was built, and how many housekeeping
  // passes ran (tests: an idle proxy builds nothing).
  int64_t status_builds() const { return reporter_ ? reporter_->status_builds() : 0; }
  int64_t housekeeping_passes() const { return housekeeping_.passes().Get(); }
  int64_t save_passes() const { return saver_ ? saver_->passes().Get() : 0; }
  // Wait until `n` passes in all have run (or a static backend was dialled
  // `n` times in all); false after `timeout`.
  bool WaitForHousekeepingPasses(int64_t n, absl::Duration timeout) const {
    return housekeeping_.passes().WaitFor(n, timeout);
  }
  bool WaitForSavePasses(int64_t n, absl::Duration timeout) const {
    return saver_ != nullptr && saver_->passes().WaitFor(n, timeout);
  }
  bool WaitForStaticDials(int64_t n, absl::Duration timeout) const {
    return statics_ != nullptr && statics_->dials().WaitFor(n, timeout);
  }
  // The kubelet-facing socket of a resource ("" if unknown).
  std::string KubeletSocketOf(const std::string& resource);

  // A stop was asked for while Start() runs (SIGTERM during a start that
  // waits on a slow API server): the API calls in flight end within a
  // second and later ones fail at once, so Start() returns soon. Any
  // thread; the caller then shuts down as usual.
  void CancelStart();

  // Takes a connected backend (from the registration socket or a static
  // backend) and makes it serve its resource.
  absl::Status AttachBackend(std::shared_ptr<Backend> backend);

  // A configuration reload (SIGHUP): `next` is valid (ValidateConfig).
  // Applies what can change while running, one change at a time with an
  // event each, and reports the rest, which takes effect at the next start
  // (reloader.h says which is which). Resources whose settings did not
  // change are untouched.
  using ReloadResult = Reloader::Result;
  ReloadResult Reload(const ProxyConfig& next);

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
  // The resource's entry, made and handed to the registrar if new. With
  // `attach`, a new entry gets that backend before the registrar sees it,
  // so that its first registration carries the backend's options (1.10-1.24
  // kubelets read them from RegisterRequest only).
  ServedResource* EnsureEntry(const std::string& name, std::shared_ptr<Backend> attach = nullptr);
  std::unique_ptr<ServedResource> MakeEntry(const std::string& name);
  // Start's steps: the state directory (locked, taken over, restored),
  // then the parts that serve.
  absl::Status OpenState();
  absl::Status LockState();
  // OpenState's steps: the state directory's files were lost while the
  // plugin directory's note names it (in use since `in_use_since`);
  // device-plugin pods and DRA claims share one holder per device where
  // both paths may hold devices (true: device-plugin pods are to be
  // reconciled); the reconciler of device-plugin pods.
  void ReportStateLost(const std::string& in_use_since);
  // The cordon book (an unreadable one fails the start) and the control
  // socket that changes it (a failure to serve it is logged: the kubelet
  // is served all the same).
  absl::Status OpenCordons();
  void StartControl();
  bool ShareDevicesAcrossPaths();
  void MakeReconciler();
  absl::Status StartServing();
  // StartServing's parts: where plugins register (and the plugins that
  // served before this start, and the static ones), and dpproxy's own
  // pod-resources socket (--pod_resources_socket).
  absl::Status StartPluginRegistrations();
  absl::Status StartPodResourcesView();
  // The kubelet-facing side, made once the socket generation is known: the
  // device plugins', DRA's, or both split by each resource's path.
  absl::Status MakeSide();
  std::unique_ptr<DraSide> MakeDraSide();
  std::unique_ptr<SplitSide> MakeSplitSide(std::unique_ptr<KubeletSide> device_plugins,
                                           std::unique_ptr<DraSide> dra);
  // Start failed: why is kept for a predecessor taking its state back.
  absl::Status FailStart(absl::Status s);
  absl::Status RestoreState();
  void ApplyWithheld() {
    if (withheld_) withheld_->Apply();
  }
  void Wake();
  // The handoff's running side (handover.h) on this dpproxy's parts.
  std::vector<KubeletGate*> HandoverGates() override;
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
  // <state_dir>/handoff.registered: written by a dpproxy taking over
  // before it first registers with the kubelet, read by the running one
  // if it takes the state back (Registrar::Resume).
  std::string SuccessorRegisteredMarker() const;
  void NoteRegisteringWhileTakingOver();
  // Shutdown() has begun.
  bool stopping() const { return stopping_.load(); }

  const ProxyConfig config_;
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
  // Every resource served, and the configuration as reloads left it.
  ResourceTable table_{config_};
  std::unique_ptr<BackendRegistrationServer> registration_;
  // Blocking work handed off by housekeeping (Register, static connects).
  std::unique_ptr<WorkQueue> workers_;
  std::unique_ptr<StaticBackends> statics_;
  // The plugins the state file remembers (RestoreState), dialled again
  // once the registration socket is served.
  std::vector<Redialer::Remembered> remembered_;
  std::unique_ptr<Redialer> redialer_;
  // Stopped (Shutdown) and kept until the side that points at them is
  // gone (the destructor).
  std::map<std::string, std::unique_ptr<ServedResource>> retired_;
  std::unique_ptr<KubeletSide> side_;
  DraSide* dra_ = nullptr;                  // side_'s DRA side, if it has one
  // CancelStart: asked, and dra_ for another thread once made.
  std::atomic<bool> start_cancelled_{false};
  std::atomic<DraSide*> dra_live_{nullptr};
  SplitSide* split_ = nullptr;              // side_, where it has both
  std::unique_ptr<Reconciler> reconciler_;  // with a state directory only
  std::unique_ptr<Withheld> withheld_;  // with a state directory only
  SharedIds shared_ids_{&table_, &events_};
  std::unique_ptr<CordonBook> cordon_book_;        // ditto
  std::unique_ptr<CordonControl> cordon_control_;  // ditto
  std::unique_ptr<ControlServer> control_;         // ditto, while this one writes
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<Saver> saver_;
  std::unique_ptr<PodResourcesView> pod_resources_view_;  // --pod_resources_socket
  ReloadActions reload_actions_;
  Reloader reloader_{&reload_actions_, &events_, ServesDra(config_),
                     ServesDevicePlugins(config_) && ServesDra(config_)};

  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;

  Housekeeping housekeeping_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> marked_registered_{false};  // NoteRegisteringWhileTakingOver
  std::function<void()> housekeeping_hook_;  // set before Start()
  std::function<void()> before_register_hook_;  // set before Start()
  std::function<void()> after_served_again_hook_;  // set before Start()

  // Handoff: the running side (with a state directory),
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

};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_PROXY_SERVER_H_
