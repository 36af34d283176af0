// File: registrar.h
//
// Keeps every resource's kubelet-facing server served and registered with
// the kubelet, as a device plugin that follows the kubelet's lifecycle must:
//
//  - a kubelet start removes every file in device-plugins/: a socket of ours
//    that is gone is served again at once (our signal of a kubelet restart);
//  - a new kubelet.sock (another inode) is the other signal: every resource
//    registers again, with the device list it already has;
//  - registrations run on the workers, never on the caller's thread (a
//    1.25+ kubelet dials back for up to 10 s), one at a time per resource,
//    retried with backoff (100 ms doubling to 5 s while the kubelet does not
//    answer, to 30 s when it refuses);
//  - options that changed since the last registration mean registering
//    again (kubelets up to 1.24 read them only there).
//
// In plugin-watcher mode the kubelet comes to us: only serving is done.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_REGISTRAR_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_REGISTRAR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/resource.h"
#include "proxy/events/event_log.h"
#include "proxy/events/telemetry.h"
#include "proxy/kubelet_side/device_plugin/device_plugin_server.h"
#include "proxy/util/health_check.h"
#include "proxy/util/files.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class Registrar {
 public:
  // How soon a resource whose list is over the kubelet's limit registers
  // again after the kubelet ended its stream.
  static constexpr absl::Duration kTooLargeRetry = absl::Seconds(30);

  // `wake` is called (no locks held) when a registration ended, so that the
  // caller runs Pass() again.
  Registrar(KubeletSideOptions kubelet, EventLog* events, WorkQueue* workers,
            std::function<void()> wake);

  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // Times each registration after a kubelet start (dpproxy_kubelet_
  // registration_seconds). Set before Add().
  void SetTelemetry(Telemetry* t) { telemetry_ = t; }

  // Starts keeping `endpoint` (of `resource`) served and registered. Both
  // outlive the registrar's workers. Any thread.
  void Add(Resource* resource, DevicePluginServer* endpoint);
  // Keeps it registered no more (its resource's path changed). The slot is
  // kept: a registration in flight may still end on it.
  void Remove(DevicePluginServer* endpoint);

  struct PassResult {
    // A kubelet.sock other than the one seen at the last pass.
    std::optional<FileId> kubelet_restarted;
    // When Pass() must run again for a retry (InfiniteFuture: no retry due).
    absl::Time next_retry = absl::InfiniteFuture();
  };
  // One pass: serves what a kubelet removed, notices a kubelet restart,
  // starts the registrations that are due. Never blocks on the kubelet.
  // One caller thread.
  PassResult Pass(absl::Time now);

  // Registers nothing more (sockets are still served again): this dpproxy
  // handed its resources over to a new one, whose registrations must win.
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }

  // Registers again, every resource, as soon as Pass() runs: this dpproxy
  // took its state back from a new one that may have registered (the
  // kubelet then serves from the new one's sockets).
  //
  // A resource a 1.25+ kubelet still streams from needs care: a 1.37
  // kubelet refuses a registration at a socket it streams from ("device
  // plugin already connected"), after which it never disconnects the
  // socket. If the new one never registered (`successor_registered`
  // false), the kubelet's client is still this one's, and it is left as
  // it is. If it had, a 1.25-1.36 kubelet dropped the resource by name
  // when the new one died, and keeps the old stream open, whose device
  // lists still reach it by name (its devices look Healthy while every
  // Allocate fails on the stopped endpoint); a 1.37 kubelet made the old
  // socket's client the resource's again. Either way dpproxy ends its
  // streams there, as a plugin that restarts does, and registers once the
  // kubelet's pod-resources API lists none of the resource's devices (a
  // 1.37 kubelet marks them Unhealthy as it lets the socket go), or after
  // kReclaimWait (a 1.25-1.36 kubelet lets it go without a word, and
  // accepts the registration whenever it comes).
  void Resume(bool successor_registered);
  static constexpr absl::Duration kReclaimWait = absl::Seconds(3);

  // Called (on a worker, no lock held) before each registration is sent
  // to the kubelet: once it returns, the kubelet may hold that
  // registration whatever becomes of this process. Set before Add().
  void SetBeforeRegisterHook(std::function<void()> hook) {
    before_register_hook_ = std::move(hook);
  }
  // Called (on the pass's thread, no lock held) when a removed socket has
  // just been served again, before the registrar notes it (a test lets a
  // registration end there). Set before Add().
  void SetAfterServedAgainHook(std::function<void()> hook) {
    after_served_again_hook_ = std::move(hook);
  }

  // For `window` from now, a stream the kubelet ends is answered with a
  // new registration at once, not after the settle time that tells a
  // restarting kubelet apart: a takeover's predecessor is exiting, and a
  // 1.25-1.36 kubelet then drops this resource's client by name.
  void ExpectDrop(absl::Duration window) {
    absl::MutexLock lock(&mu_);
    expect_drop_until_ = absl::Now() + window;
  }

  // One readiness check per resource, "registered:NAME": registered with
  // the kubelet listening now (at today's kubelet.sock; through the plugin
  // watcher, once the kubelet has called back), else why not. Any thread.
  std::vector<HealthCheck> RegistrationChecks();

 private:
  struct Slot {
    Resource* resource = nullptr;
    DevicePluginServer* endpoint = nullptr;
    std::optional<FileId> registered_with;  // kubelet.sock it registered at
    // Options sent in that registration (serialized).
    std::string registered_options;
    // Bumped each time the socket is served again: a Register that began
    // before does not count (the kubelet's stream is on the old server).
    uint64_t served = 0;
    // Registrations counted as made (registered_with set): one that ends
    // while the socket is being served again is judged once it is served.
    uint64_t registrations = 0;
    bool registering = false;  // at most one Register at a time
    // After a failed Register: not before retry_at, then backoff doubles.
    absl::Time retry_at = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
    // The kubelet ended our last stream while registered with it: register
    // again (OnStreamDropped).
    bool dropped = false;
    absl::Time last_drop = absl::InfinitePast();
    // The reason for the drops (a list over the kubelet's limit) was logged.
    bool too_large_said = false;
    // Taken back while the kubelet streamed from it (Resume): registered
    // again once the kubelet lists none of its devices, or at this time.
    absl::Time reclaim_at = absl::InfinitePast();
  };

  // The resources of which the kubelet's pod-resources API lists at least
  // one allocatable (Healthy) device; an error if it cannot be asked.
  absl::StatusOr<std::set<std::string>> AllocatableResources();
  // Resume's wait (kReclaimWait), for the slots still in it.
  void CheckReclaims(const std::vector<Slot*>& slots, absl::Time now);

  void OnStreamDropped(Slot* slot);

  void ServeRemoved(const std::vector<Slot*>& slots);
  // Pass's decision for one slot, at `kubelet` (whose socket is new at this
  // pass if `kubelet_restarted`): whether to register now. Resets what a
  // new kubelet makes moot, notes the next retry, and takes in `options`
  // when the kubelet keeps the ones it read. `listening`: whether the
  // kubelet accepts at its socket, asked at most once a pass (with mu_
  // released).
  bool RegistrationDueLocked(Slot* e, const FileId& kubelet, bool kubelet_restarted,
                             absl::Time now, std::string* options,
                             std::optional<bool>* listening) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterOnWorker(Slot* slot, FileId kubelet, std::string options, uint64_t served);
  // After a failed registration (`s`): when to try again. At once if the
  // kubelet was replaced meanwhile, or once when the socket was found not
  // serving; else with backoff (100 ms doubling, to 5 s for a kubelet that
  // is away, 30 s for a refusal).
  void ScheduleRetryLocked(Slot* e, const absl::Status& s, bool kubelet_replaced,
                           bool not_serving) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KubeletSideOptions kubelet_;
  EventLog* const events_;
  std::function<void()> before_register_hook_;
  std::function<void()> after_served_again_hook_;
  WorkQueue* const workers_;
  const std::function<void()> wake_;
  const absl::Time started_ = absl::Now();
  Telemetry* telemetry_ = nullptr;

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Slot>> removed_slots_ ABSL_GUARDED_BY(mu_);  // Remove()
  absl::Time next_retry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time expect_drop_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Pass() only.
  std::optional<FileId> last_kubelet_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_REGISTRAR_H_
