// File: resource.h
//
// One resource as the kubelet sees it: the backend currently serving it, the
// last device list (the kubelet-facing truth, cached so a re-registering
// kubelet gets it at once), and the policy for a backend that goes away.
// Thread-safe. Calls to the backend are made without holding the lock.
//
// Device IDs never change because a backend went away: on loss the cached
// devices stay, with their health set by the loss policy, until the backend
// (or its replacement) sends a new list.
#ifndef DPPROXY_PROXY_CORE_RESOURCE_H_
#define DPPROXY_PROXY_CORE_RESOURCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/core/backend.h"
#include "proxy/core/backend_watchdog.h"
#include "proxy/core/flap_damper.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/device_list.h"
#include "proxy/core/forgotten_devices.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/events/event_log.h"

namespace dpproxy {

struct ResourceHooks {
  // Called (without locks held) after every device-list or backend change.
  std::function<void()> on_change;
  // Whether a device is held by an allocation in the journal: a device the
  // backend stops reporting stays listed (Unhealthy) while it is.
  std::function<bool(const std::string& id)> is_allocated;
  // Asked about the devices the kubelet forgot (SetForgotten): whether
  // an Allocate may have them, which still have running holders, what a
  // re-admission gets. Outlives the resource; null: nothing is forgotten.
  ForgottenDevices* forgotten = nullptr;
};

// The short ID the kubelet is shown for `backend_id` under
// ResourcePolicy::compact_ids: "c" and 13 base32 characters of its 64-bit
// FNV-1a hash. The same in every run and on every node.
std::string CompactDeviceId(absl::string_view backend_id);

class Resource {
 public:
  // The list is immutable once published: every kubelet stream writes the
  // same bytes, and taking a snapshot copies a pointer, not the list.
  struct Snapshot {
    uint64_t version = 0;
    std::shared_ptr<const DeviceList> list = DeviceList::Empty();
    // What the device-plugin side streams: `list` itself, unless DRA
    // claims hold some of its devices (SetHeldAcrossPaths), which it shows
    // Unhealthy.
    std::shared_ptr<const DeviceList> to_device_plugins = DeviceList::Empty();
    // Devices pods of the extended resource hold, which the DRA side
    // leaves out of its pool (SetHeldAcrossPaths). Never null.
    std::shared_ptr<const std::set<std::string>> left_out_of_pool =
        std::make_shared<const std::set<std::string>>();
  };

  // What a kubelet accepts in one message (kubelet_rules.h).
  static constexpr size_t kKubeletMaxListBytes = ::dpproxy::kKubeletMaxListBytes;

  // `name` is the kubelet-facing name (after any rename).
  Resource(std::string name, ResourcePolicy policy, EventLog* events,
           ResourceHooks hooks = ResourceHooks());
  ~Resource();

  // What a backend's loss does from now on (a configuration reload). A
  // backend lost and held now is marked Unhealthy at once if the new
  // policy would have done so by now.
  void SetLossPolicy(LossPolicy policy, absl::Duration hold, absl::Duration grace);
  // Flap damping from now on (a configuration reload); turned off, every
  // device held for flapping is shown as its plugin reports it again.
  void SetFlapDamping(const FlapDamping& settings);
  // The devices held Unhealthy for flapping now.
  std::set<std::string> damped();
  // How the watchdog asks the backend from now on (a configuration reload).
  void SetProbe(const BackendProbe& probe) { watchdog_.SetSettings(probe); }
  // The current backend holds its stream but answers no call (the
  // watchdog): it is treated as lost until it answers again.
  bool backend_silent();

  const std::string& name() const { return name_; }

  // Changes the ID map and compact IDs (a configuration reload). The list
  // shown keeps its IDs until the backend's next list: the caller dials the
  // backend again for one. Devices an allocation holds under their old IDs
  // stay listed, Unhealthy, as any device the backend stops reporting.
  // Compact IDs that went on by themselves (a list over the kubelet's
  // limit) stay on whatever `compact_ids` says: the kubelet knows the
  // devices by them.
  void SetIdPolicy(std::map<std::string, std::string> id_map, bool compact_ids);
  // Compact IDs on, as they went on by themselves before a restart (the
  // state file says so): from now on, before any list.
  void KeepCompactIds();
  // "" (off), "configured" (compact_ids), or "on by itself" (a list over
  // the kubelet's limit turned them on; kept in the state).
  std::string compact_ids_mode();
  // Whether kubelet IDs may differ from the backend's (an ID map or compact IDs).
  bool maps_ids();

  // Makes `backend` the one serving this resource and starts its stream. A
  // previous backend is stopped. Returns true if the options the kubelet
  // must be told about changed (the caller registers again).
  bool AttachBackend(std::shared_ptr<Backend> backend);
  // The current backend once it has sent its first device list, or nullptr
  // (none connected, or its first list not in yet).
  std::shared_ptr<Backend> backend();
  // The connected backend, whether or not its first list is in.
  std::shared_ptr<Backend> attached_backend();
  // The current backend, waiting up to `timeout` for one to connect (a
  // plugin registering again after it and dpproxy restarted together);
  // nullptr if none did.
  std::shared_ptr<Backend> WaitForBackend(absl::Duration timeout);
  bool backend_connected();

  // Options to advertise to the kubelet: the current (or last) backend's,
  // with GetPreferredAllocation always offered (see backend_offers_preferred).
  v1beta1::DevicePluginOptions options();

  Snapshot Current();

  // Calls `on_publish` with every list published from now on (after the
  // resource's lock is released; versions only grow, but two publishers may
  // deliver out of order, so a watcher keeps the newest). The callback must
  // not block nor call back into this Resource. Returns an id for
  // RemoveWatcher, after which the callback is never called again.
  uint64_t AddWatcher(std::function<void(const Snapshot&)> on_publish);
  void RemoveWatcher(uint64_t id);

  // True if `id` is in the current device list.
  bool HasDevice(const std::string& id);
  // The health the kubelet currently sees for `id`, or nullopt if the
  // current list has no such device. O(1).
  std::optional<std::string> DeviceHealth(const std::string& id);

  // Device IDs between the kubelet's names and the current backend's (see
  // ResourcePolicy::id_map). Unknown IDs pass through.
  // Device IDs with control characters pass as they are unless the
  // resource's IDs are compact (a kubelet accepts them).
  std::string ToBackendId(const std::string& kubelet_id);
  std::string ToKubeletId(const std::string& backend_id);

  // Restores a remembered device list after a proxy restart, before any
  // backend is back: the devices keep their remembered health for
  // `trust_for` (0: Unhealthy at once), then turn Unhealthy unless a backend
  // has sent a list by then. `backend_endpoint`/`backend_api` describe the
  // backend the list came from.
  // `backend_options`: the options it was served with, if remembered (the
  // kubelet is then told them at once, not when the plugin is back).
  void Restore(std::shared_ptr<const DeviceList> devices, absl::Duration trust_for,
               const std::string& backend_endpoint, const std::string& backend_api,
               std::optional<v1beta1::DevicePluginOptions> backend_options = std::nullopt);

  // Until when the devices are trusted at their remembered health with no
  // backend connected since a restore (Restore's `trust_for`); nullopt
  // when a backend has connected since, or the trust is over.
  std::optional<absl::Time> trusted_until();
  // What the kubelet is shown of this resource's devices while no backend
  // is connected, for an error naming it ("its devices are ...").
  std::string ShownWhileAway();

  // The device list as the backend last reported it (or as restored), with
  // the backend's health, not the loss policy's: what the state file keeps,
  // so a restart never remembers devices as Unhealthy merely because their
  // backend was away when the state was saved.
  // Shared with the published list while the backend's health is shown.
  std::shared_ptr<const DeviceList> ReportedDevices();

  // The backend that served this resource last (current or gone), for
  // status and state: endpoint and Register version (empty if none yet),
  // and the options it was served with (nullopt if unknown: restored from
  // a state file that did not keep them).
  struct LastBackend {
    std::string endpoint;
    std::string api;
    std::optional<v1beta1::DevicePluginOptions> options;
  };
  LastBackend last_backend();

  // Devices the kubelet must see Unhealthy whatever their health: a
  // resource renamed or removed while pods hold its devices, or devices
  // held under another name or ID (held_elsewhere.h). Replaces the
  // previous set; publishes a new list if anything changed.
  void SetShownUnhealthy(std::set<std::string> ids);

  // Where dpproxy serves the kubelet both ways (ProxyConfig::paths): the
  // devices DRA claims hold are shown Unhealthy to the device-plugin side
  // only (no pod of the extended resource is admitted onto them, and
  // allocatable drops), and the devices pods of the extended resource hold
  // are left out of the DRA side's pool only. Each side keeps the real
  // health of its own holders' devices. Publishes if anything changed.
  //
  // Of the claims' devices, those in `by_pod_claims` (claims the scheduler
  // made for pods' extended-resource requests) keep their health: the
  // scheduler already counts such a pod's request against the node's
  // allocatable, and a drop would count the device twice. New pods are
  // steered away from them instead (steer_around()), and an Allocate
  // naming one is refused as any device of the other path.
  void SetHeldAcrossPaths(std::set<std::string> by_claims, std::set<std::string> by_pod_claims,
                          std::set<std::string> by_pods);
  // Withdrawn from the device-plugin side (KubeletSide::Withdraw): it
  // streams every device Unhealthy. Publishes if anything changed.
  void SetWithdrawnFromDevicePlugins(bool withdrawn);
  // What a GetPreferredAllocation answer avoids: the forgotten devices and
  // those extended-resource claims hold, with their holders. Never null.
  std::shared_ptr<const std::map<std::string, std::string>> steer_around();

  // Devices held by running containers the kubelet has forgotten (it
  // restarted without its checkpoint), by kubelet ID, with who holds them
  // ("namespace/pod/container"). They keep their real health, since a
  // restarted kubelet re-admits its running pods against allocatable and
  // would kill them if it dropped; instead new pods are steered away from
  // them (GetPreferredAllocation) and an Allocate naming one is checked
  // (ForgottenDevices::CheckForgotten). Never null.
  using Forgotten = std::map<std::string, std::string>;
  void SetForgotten(Forgotten held);
  std::shared_ptr<const Forgotten> forgotten();
  // ForgottenDevices' answers for this resource (ResourceHooks::forgotten):
  // OK(false), all of `ids` and empty without one. Blocking.
  absl::StatusOr<bool> CheckForgotten(
      const std::vector<std::vector<std::string>>& per_container, bool readmission);
  std::set<std::string> StillForgotten(const std::vector<std::string>& ids);
  std::vector<std::string> ReadmissionPick(int size, const std::set<std::string>& available);

  // Whether the backend answers GetPreferredAllocation itself. Toward the
  // kubelet dpproxy always offers it (options()): it answers for a backend
  // that does not, and steers every answer away from forgotten devices.
  bool backend_offers_preferred();

  // Grows whenever anything status or the state file show changes (the
  // list, the backend, its connection): callers compare it instead of the
  // lists. O(1).
  uint64_t changes() const { return changes_.load(); }
  // Why the backend's last list was refused (an empty ID, an ID listed
  // twice; the kubelet keeps the list before it), or "" once one is taken.
  std::string list_refused();
  // How many IDs of the last list taken contain control characters and are
  // shown to the kubelet as their compact IDs (compact_ids).
  int64_t ids_mapped();

  // Applies the hold expiry of the loss policy; call about once a second.
  void Tick(absl::Time now);
  // From now on a lost backend leaves the devices at their last health,
  // whatever the loss policy: this dpproxy handed its state over, and the
  // new one answers for the devices while the kubelet moves to it (the
  // plugin may drop this one's stream as it registers with the new one).
  // false: the loss policy applies again (the new one gave the state back).
  void KeepHealthOnLoss(bool keep = true);

  // Stops the current backend as if it was lost (`why`: backend_down's
  // reason): the loss policy applies until another one attaches. A
  // configuration reload that no longer wants it.
  void DetachBackend(const std::string& why);

  // Stops the backend. Idempotent.
  void Shutdown();

 private:
  void OnDevices(uint64_t generation, std::shared_ptr<const DeviceList> devices);
  void OnLost(uint64_t generation, const std::string& why);
  // The watchdog's verdicts on the backend of `generation`: silent (the
  // loss policy applies, as if it was lost, but its stream is kept), and
  // answering again (its last list is shown again).
  void OnSilent(uint64_t generation, absl::Duration silent_for);
  void OnAnswering(uint64_t generation, absl::Duration silent_for);
  // Logs and tells flap episodes that started or ended.
  void TellFlapsLocked(const FlapDamper::Changes& changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the loss of the backend (`why`), tells it as `event` (with
  // `fields`), and applies the policy.
  void LoseBackendLocked(const std::string& why, const char* event,
                         Json fields = Json::object()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkAllLocked(const std::string& health) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishBaseLocked(std::shared_ptr<const DeviceList> base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holds mu_ for a change; on release, delivers a list published under it
  // to the watchers.
  class ABSL_SCOPED_LOCKABLE ChangeLock {
   public:
    explicit ChangeLock(Resource* r) ABSL_EXCLUSIVE_LOCK_FUNCTION(r->mu_);
    ~ChangeLock() ABSL_UNLOCK_FUNCTION();

   private:
    Resource* const r_;
    uint64_t before_;
  };

  struct IdPolicy {
    std::map<std::string, std::string> id_map;
    bool compact_ids = false;  // configured, or on by itself
    bool compact_by_itself = false;
  };

  // A backend's list on its way to the kubelet (OnDevices), step by step.
  // A list dpproxy refuses (empty or repeated IDs): logged and counted;
  // true if refused.
  bool RefuseMalformed(uint64_t generation, const DeviceList& devices);
  // Entries under an ID listed before: one device, Healthy if any is.
  std::shared_ptr<const DeviceList> CollapseDuplicates(std::shared_ptr<const DeviceList> devices);
  // Health other than Healthy or Unhealthy: Unhealthy, as the kubelet reads it.
  std::shared_ptr<const DeviceList> RelabelUnknownHealth(
      std::shared_ptr<const DeviceList> devices);
  // The ID policy for this list: compact IDs go on by themselves, for good,
  // for a list over the kubelet's limit whose devices no allocation holds.
  std::shared_ptr<const IdPolicy> IdPolicyFor(const DeviceList& devices);
  // IDs with control characters served as they are: said once.
  void WarnOfControlCharacters(const IdPolicy& ids, const DeviceList& devices);
  // The list under the kubelet's IDs (the ID map, or compact IDs) and the
  // way back to the backend's.
  struct Renamed {
    std::shared_ptr<const DeviceList> list;
    absl::flat_hash_map<std::string, std::string> to_backend;
    int mapped = 0;  // IDs with control characters shown compact
    std::string first_mapped;
  };
  Renamed ApplyIdPolicy(const IdPolicy& ids, std::shared_ptr<const DeviceList> devices);
  // Of the devices in `before` that `now` does not list, those an
  // allocation holds (their positions in `before`, and IDs) and the rest.
  // Asks is_allocated: call without mu_.
  struct Vanished {
    std::vector<int> keep_at;
    std::vector<std::string> kept, dropped;
  };
  Vanished FindVanished(const DeviceList& before, const DeviceList& now);
  // Logs and tells that `r` shows IDs with control characters compact.
  void TellMapped(const Renamed& r);
  // Shows `r` to the kubelet, with the devices it no longer lists that an
  // allocation holds kept as Unhealthy. False if the backend was replaced
  // meanwhile.
  bool Publish(uint64_t generation, Renamed r);

  const std::string name_;
  const ResourcePolicy policy_;  // its loss policy and hold: the two below
  EventLog* const events_;
  const ResourceHooks hooks_;

  absl::Mutex mu_;
  LossPolicy loss_policy_ ABSL_GUARDED_BY(mu_);
  absl::Duration hold_ ABSL_GUARDED_BY(mu_);
  absl::Duration grace_ ABSL_GUARDED_BY(mu_);
  // How long a lost backend's devices keep their health: the hold, or
  // kUnhealthy's grace.
  absl::Duration LossHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return loss_policy_ == LossPolicy::kHold ? hold_ : grace_;
  }
  // policy_'s id_map and compact_ids as a reload left them.
  std::shared_ptr<const IdPolicy> ids_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Backend> backend_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  // The current backend has sent its first device list (backend() and
  // WaitForBackend wait for it).
  bool listed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> lost_at_ ABSL_GUARDED_BY(mu_);
  // Hold for the current absence, when it is not the loss policy's (restore).
  std::optional<absl::Duration> hold_override_ ABSL_GUARDED_BY(mu_);
  bool keep_health_ ABSL_GUARDED_BY(mu_) = false;  // KeepHealthOnLoss()
  // The current backend is attached but silent (OnSilent); connected_ is
  // false meanwhile.
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_endpoint_ ABSL_GUARDED_BY(mu_);
  std::string last_api_ ABSL_GUARDED_BY(mu_);
  std::optional<v1beta1::DevicePluginOptions> last_options_ ABSL_GUARDED_BY(mu_);
  v1beta1::DevicePluginOptions options_ ABSL_GUARDED_BY(mu_);
  Snapshot snapshot_ ABSL_GUARDED_BY(mu_);
  // The list before health overrides (what snapshot_ shows without them).
  std::shared_ptr<const DeviceList> base_ ABSL_GUARDED_BY(mu_) = DeviceList::Empty();
  std::set<std::string> shown_unhealthy_ ABSL_GUARDED_BY(mu_);
  // Devices whose health flaps, held Unhealthy in what is shown.
  FlapDamper damper_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> held_by_claims_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> held_by_pod_claims_ ABSL_GUARDED_BY(mu_);
  bool withdrawn_from_device_plugins_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const Forgotten> forgotten_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const Forgotten>();
  // forgotten_ and held_by_pod_claims_ together (steer_around()).
  std::shared_ptr<const Forgotten> steer_around_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const Forgotten>();
  void UpdateSteerAroundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool over_kubelet_limit_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> changes_{0};
  std::shared_ptr<const DeviceList> reported_ ABSL_GUARDED_BY(mu_) = DeviceList::Empty();
  // Kubelet ID -> current backend's ID, for the mapped devices it reports.
  absl::flat_hash_map<std::string, std::string> to_backend_ ABSL_GUARDED_BY(mu_);
  std::string list_refused_ ABSL_GUARDED_BY(mu_);
  // Entries of the last list collapsed into an ID listed before them.
  int ids_collapsed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ids_mapped_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> warned_raw_control_{false};  // logged once per resource
  // Taken after mu_ is released; held while watchers are called.
  absl::Mutex watch_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<uint64_t, std::function<void(const Snapshot&)>> watchers_ ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watcher_ ABSL_GUARDED_BY(watch_mu_) = 0;
  // Last: destroyed first, after Shutdown() withdrew its ask.
  BackendWatchdog watchdog_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_RESOURCE_H_
