// File: forgotten_allocations.h
//
// The one home of the allocations a restarted kubelet forgot. A kubelet
// that restarts without its device-manager checkpoint counts the devices of
// running containers free. The reconciler finds such allocations (it
// compares what was live with what the new kubelet lists) and marks them
// here (Mark: `quarantined` in state.proto). From then on:
//
//  - they keep their devices' real health: a restarted kubelet re-admits
//    running pods against allocatable and would kill them if it dropped;
//  - new pods are steered away from them (the status rows and the devices
//    by resource, which the server hands to each Resource), and an
//    Allocate naming one is refused while its holder runs (CheckForgotten,
//    the core's ForgottenDevices);
//  - a kubelet re-admitting its running containers (before 1.25 it
//    allocates again for each) gets each container's own devices back
//    (ReadmissionPick), and the forgotten record gives way to the new one;
//  - each ends as soon as its holder is gone (HolderGone): the kubelet's
//    pod directory removed, the container runtime running no such
//    container, the pod-resources List no longer naming it, or no source
//    naming its pod within the grace.
//
// Thread-safe. CheckForgotten, StillForgotten and ReadmissionPick block (a
// pod-resources List, a CRI ListContainers, each with a 2 s deadline).
#ifndef DPPROXY_PROXY_HOLDERS_FORGOTTEN_ALLOCATIONS_H_
#define DPPROXY_PROXY_HOLDERS_FORGOTTEN_ALLOCATIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/forgotten_devices.h"
#include "proxy/events/event_log.h"
#include "proxy/state/state_keeper.h"
#include "proxy/status/status_model.h"
#include "proxy/util/files.h"

namespace dpproxy {

// What one pod-resources List said: pods and their containers.
struct PodList {
  std::map<std::pair<std::string, std::string>, std::set<std::string>> containers;
  bool HasPod(const std::string& ns, const std::string& name) const {
    return containers.count({ns, name}) > 0;
  }
};

// The containers the container runtime runs now, by pod UID and by pod
// namespace and name (the kubelet's labels on each container).
struct RuntimeView {
  std::set<std::pair<std::string, std::string>> by_uid;  // (pod UID, container)
  std::set<std::tuple<std::string, std::string, std::string>> by_name;  // (ns, pod, container)
  std::set<std::string> pod_uids;
  std::set<std::pair<std::string, std::string>> pods;
  // Whether a container of the pod runs (`container` "": any).
  bool Runs(const std::string& uid, const std::pair<std::string, std::string>& pod,
            const std::string& container) const;
};

class ForgottenAllocations : public ForgottenDevices {
 public:
  struct Options {
    KubeletSideOptions kubelet;
    // A forgotten allocation whose pod no source ever named is released
    // this long after it was marked.
    absl::Duration grace = absl::Minutes(5);
    // Within this long of kubelet.sock's creation, a pod missing from the
    // kubelet's List is not taken as gone unless it was listed since.
    absl::Duration restart_grace = absl::Seconds(10);
    // The container runtime's CRI socket; "": not asked.
    std::string container_runtime_socket;
  };
  // `changed` is called (no locks held) when the set of forgotten
  // allocations changed, or a caller's view of it is stale.
  ForgottenAllocations(Options options, StateKeeper* keeper, EventLog* events,
                       std::function<void()> changed);
  ForgottenAllocations(const ForgottenAllocations&) = delete;
  ForgottenAllocations& operator=(const ForgottenAllocations&) = delete;

  // Marks allocations forgotten with `reason`, logs and reports each (and
  // any device the kubelet has handed out again meanwhile, as held twice).
  void Mark(const std::vector<uint64_t>& ids, const std::string& reason);
  // Releases forgotten allocations whose holder is gone, saying why (one
  // reason per id).
  void Release(const std::vector<uint64_t>& ids, const std::vector<std::string>& why);

  // Why the holder of forgotten allocation `a` is gone, or "" if it may
  // still run. `list`: a List taken now (null if none). `runtime`: what
  // the container runtime runs now (null if not known). `pod_of_uid`: pod
  // names learnt for UIDs (an init container's record has only the UID).
  std::string HolderGone(const state::Allocation& a, const PodList* list,
                         const RuntimeView* runtime,
                         const std::map<std::string, std::pair<std::string, std::string>>& pod_of_uid,
                         absl::Time now);
  // Whether `now` is within restart_grace of the kubelet's start
  // (kubelet.sock's creation); a new start forgets what the last one named
  // and picked.
  bool InRestartWindow(absl::Time now);
  // One CRI ListContainers (running ones) now; nullopt if no runtime socket
  // is configured or it did not answer.
  std::optional<RuntimeView> RunningContainers() const;

  // ForgottenDevices, for the core.
  absl::StatusOr<bool> CheckForgotten(const std::string& resource,
                                      const std::vector<std::vector<std::string>>& per_container,
                                      bool readmission) override;
  std::set<std::string> StillForgotten(const std::string& resource,
                                       const std::vector<std::string>& ids) override;
  std::vector<std::string> ReadmissionPick(const std::string& resource, int size,
                                           const std::set<std::string>& available) override;

  // Forgotten devices by kubelet resource (kubelet ID -> holder), and with
  // `rows` their rows for the status.
  std::map<std::string, std::map<std::string, std::string>> Devices(
      std::vector<ForgottenStatus>* rows) const;
  // Bumped whenever the set of forgotten allocations changes.
  uint64_t version() const { return keeper_->quarantine_version(); }
  // Devices found held twice (a forgotten holder and one allocated since).
  int64_t devices_held_twice() const { return devices_held_twice_.load(); }
  // Released because their holder was gone when checked.
  int64_t released() const { return released_.load(); }

 private:
  // One List now; nullopt if there is no API or it did not answer.
  std::optional<PodList> ListPods() const;
  // HolderGone's answer from a List that names `pod`'s namespace and name.
  std::string GoneFromList(const state::Allocation& a,
                           const std::pair<std::string, std::string>& pod, const PodList& list,
                           absl::Time now);
  // The forgotten allocations of a kubelet resource, oldest first, and the
  // pod names learnt for UIDs (from every allocation). One pass over the
  // journal.
  struct View {
    std::vector<state::Allocation> all;
    std::map<std::string, std::pair<std::string, std::string>> pod_of_uid;
  };
  View Of(const std::string& resource) const;
  // A re-admission's containers (CheckForgotten with `readmission`, in the
  // window): each matched to the oldest forgotten container not yet
  // re-admitted. Exact matches go to `gone`/`why`; a request that does not
  // look like one goes back into `wanted`; whether one took other devices.
  bool MatchReadmissions(const std::string& resource,
                         const std::vector<std::vector<std::string>>& per_container,
                         const View& view, std::set<std::string>* wanted,
                         std::vector<uint64_t>* gone, std::vector<std::string>* why);

  const Options options_;
  StateKeeper* const keeper_;
  EventLog* const events_;
  const std::function<void()> changed_;
  std::atomic<int64_t> devices_held_twice_{0};
  std::atomic<int64_t> released_{0};

  // Forgotten allocations whose pod a List has named since the kubelet's
  // last start (the window in InRestartWindow), and those picked for and
  // matched to re-admissions.
  absl::Mutex window_mu_;
  std::optional<FileId> window_kubelet_ ABSL_GUARDED_BY(window_mu_);
  std::set<uint64_t> named_since_restart_ ABSL_GUARDED_BY(window_mu_);
  std::set<uint64_t> picked_since_restart_ ABSL_GUARDED_BY(window_mu_);
  std::set<uint64_t> readmitted_since_restart_ ABSL_GUARDED_BY(window_mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_FORGOTTEN_ALLOCATIONS_H_
