// File: reconciler.h
//
// Keeps dpproxy's journal in step with what the kubelet holds, the way the
// kubelet's device manager keeps its checkpoint in step with active pods:
//
//  - pod-resources (1.15+): every interval, the kubelet's List names the
//    container of each allocation; entries no pod holds in two answers in a
//    row (and older than the grace) are released.
//  - the kubelet's checkpoint (every release, the only source on 1.9):
//    parsed whenever it changes and on the interval; names pod UIDs and, where
//    pod-resources is absent, releases the same way.
//  - after a kubelet restart: once the new kubelet has written its
//    checkpoint, allocations that were live before and that it no longer
//    lists are marked forgotten (it lost them; it counts their devices
//    free although their containers still run). What follows for them is
//    forgotten_allocations.h's; each pass releases those whose holder is
//    gone.
//
// Owns its thread (the periodic pod-resources pass); the checkpoint checks
// run on the caller's (the server's checkpoint thread).
#ifndef DPPROXY_PROXY_HOLDERS_RECONCILER_H_
#define DPPROXY_PROXY_HOLDERS_RECONCILER_H_

#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/podresources/api.pb.h"
#include "proxy/config/proxy_config.h"
#include "proxy/events/event_log.h"
#include "proxy/kubelet/kubelet_checkpoint.h"
#include "proxy/holders/forgotten_allocations.h"
#include "proxy/holders/holdings.h"
#include "proxy/state/state_keeper.h"
#include "proxy/util/files.h"

namespace dpproxy {

class Reconciler {
 public:
  struct Options {
    KubeletSideOptions kubelet;
    absl::Duration interval = absl::Minutes(1);  // 0: no periodic passes
    absl::Duration grace = absl::Minutes(5);
    // After a kubelet (re)start its pod-resources List is empty, then
    // incomplete, for about a second (observed on a 1.36.2 node): within this
    // long of kubelet.sock's creation a pod missing from it is not taken
    // as gone unless it was listed since.
    absl::Duration restart_grace = absl::Seconds(10);
    // The container runtime's CRI socket (containerd's, CRI-O's); "" or a
    // path where nothing listens: not asked. With it, the holder of a
    // forgotten allocation is checked against what the runtime runs: a
    // container it does not run (never started, e.g. CreateContainerError,
    // or ended) uses no device, whatever pod-resources lists.
    std::string container_runtime_socket;
    // Whether someone waits on what a pass releases (a device that pods
    // of the device plugin hold while the resource is served through DRA
    // too: its pool lacks it until then): passes come every
    // `hurried_interval` then, not every `interval`. Called on the
    // reconciler's thread; empty: never.
    std::function<bool()> hurry;
    absl::Duration hurried_interval = absl::Seconds(10);
    // How soon after a Nudge the pass comes (while `hurry` holds): the
    // kubelet lists a pod in pod-resources once its admission, which the
    // Allocate is part of, is done.
    absl::Duration nudge_delay = absl::Seconds(1);
    // Called (reconciler's thread, no locks held) after a parse of the
    // kubelet's checkpoint, whose text and parse are dropped then: as large
    // as every registered device's ID. Empty: never.
    std::function<void()> freed = nullptr;
  };
  // `changed` is called (no locks held) when the quarantine changed.
  Reconciler(Options options, StateKeeper* keeper, EventLog* events,
             std::function<void()> changed);
  ~Reconciler();

  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Starts the periodic pod-resources passes (first one 10 s after start).
  void Start();
  void Stop();

  // A device-plugin allocation was made (or a holder changed): if `hurry`
  // holds, a pass comes `nudge_delay` from now, not at the next interval.
  // It names the new allocation's pod while the pod runs, so that the pass
  // after its end (`hurried_interval` later at most) releases its devices
  // to the claims that wait for them; a pod no pass ever listed keeps them
  // for the whole grace. Cheap and lock-free for the caller's purposes: it
  // may be called under the state keeper's lock.
  void Nudge();

  // One pod-resources pass now. kUnavailable if the API did not answer
  // (nothing is released then).
  absl::Status ReconcileOnce();
  // One checkpoint pass now. kUnavailable if the checkpoint cannot be read.
  absl::Status ReconcileCheckpointOnce();

  // A kubelet restart as it was seen: the new kubelet.sock and the
  // checkpoint then on disk (the stopped kubelet's final view, unless the
  // new one has rewritten it already).
  struct RestartSeen {
    FileId kubelet;
    absl::Time seen_at;
    std::optional<FileId> checkpoint_before;
    std::optional<std::string> checkpoint_text;
  };
  // Called as the restart is detected (a stat and a read): what
  // OnKubeletRestart needs, taken before the new kubelet rewrites it.
  RestartSeen NoteKubeletRestart(const FileId& kubelet) const;
  // Checkpoint thread: remembers what was live for the kubelet that
  // stopped, checked by CheckCheckpoint. O(allocations).
  void OnKubeletRestart(const RestartSeen& seen);
  // Checkpoint thread: the check after a kubelet restart when it is due,
  // else a checkpoint pass if the checkpoint changed or the interval passed.
  // O(allocations) when it passes; the server runs it on a thread of its
  // own, so that detecting and serving a kubelet restart never waits for it.
  void CheckCheckpoint();

  // The allocations the kubelet forgot: what the core asks of them, their
  // status and counts.
  ForgottenAllocations* forgotten() { return &forgotten_; }

  // For `window` from now, each checkpoint pass and each pod-resources
  // pass journals the allocations the kubelet lists for a resource `serves`
  // names and the journal lacks (no journaled allocation holds any of their
  // devices): what a damaged state lost, learned back from the kubelet's
  // copies. The checkpoint is read first (the checkpoint thread starts at
  // once); pod-resources also holds what the kubelet keeps in memory only,
  // or in a checkpoint dpproxy cannot read. Pods are named at the next
  // pass, and learned allocations are released as any other once their
  // pods are gone (the grace counts from now).
  void LearnBack(absl::Duration window, std::function<bool(const std::string&)> serves)
      ABSL_LOCKS_EXCLUDED(learn_mu_);
  // Learned back in all, and from each source ("kubelet_checkpoint",
  // "pod_resources").
  int64_t allocations_recovered() const {
    return recovered_checkpoint_.load() + recovered_pod_resources_.load();
  }
  std::map<std::string, int64_t> allocations_recovered_by_source() const {
    return {{"kubelet_checkpoint", recovered_checkpoint_.load()},
            {"pod_resources", recovered_pod_resources_.load()}};
  }
  // Listed by the kubelet, lacking from the journal, and not learned back:
  // some of their devices are journaled under another allocation, or the
  // journal refused the record. Counted once per entry and source.
  int64_t allocations_unrecoverable() const { return unrecoverable_.load(); }

 private:
  // Every allocation but DRA claims': those are the kubelet's to end, with
  // NodeUnprepareResources, and its device manager never lists them.
  state::State DevicePluginAllocations() const;

  std::string PodResourcesSocket() const;
  std::string CheckpointPath() const;
  void Loop();
  static Holdings CheckpointHoldings(const KubeletCheckpoint& ckpt);

  // A reconciliation pass (ReconcileOnce), step by step: the kubelet's
  // List; what it holds that the journal lacks, learned back; the pods and
  // holders it names; each allocation's verdict.
  absl::StatusOr<v1::ListPodResourcesResponse> ListPodResources() const;
  void LearnFromList(const v1::ListPodResourcesResponse& list);
  static void ViewsOfList(const v1::ListPodResourcesResponse& list, Holdings* holdings,
                          PodList* pods);
  struct Verdicts {
    std::vector<StateKeeper::Holder> annotate;  // listed: its holder's names
    std::vector<uint64_t> release;              // its pod is gone
    std::vector<uint64_t> contradicted;  // its pod is listed without its devices
    std::vector<std::string> contradicted_pods;
    std::vector<uint64_t> forgotten_gone;  // forgotten, and its holder is gone
    std::vector<std::string> forgotten_why;
    std::set<uint64_t> missing;  // missing from this List, once
    bool kubelet_starting = false;
  };
  Verdicts Classify(const state::State& st_now, const Holdings& holdings, PodList* pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_);
  // The verdict on an allocation the List does not name with its devices:
  // missing once (told at the next pass), its pod gone, or its pod listed
  // without them (the kubelet lost them).
  void ClassifyMissing(const state::Allocation& a, bool pod_listed, int64_t now_ms,
                       Verdicts* v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_);
  absl::Status CheckpointPass(const KubeletCheckpoint& ckpt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  // Each allocation's verdict from the kubelet's checkpoint (`holdings`);
  // where the pod-resources API exists it decides what is gone, and the
  // checkpoint only names holders. Notes which allocations it lists
  // (checkpoint_live_, checkpoint_newest_listed_).
  Verdicts ClassifyByCheckpoint(const state::State& st, const Holdings& holdings, int64_t now_ms,
                                bool pod_resources) ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_);
  const Options options_;
  StateKeeper* const keeper_;
  EventLog* const events_;
  const std::function<void()> changed_;

  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  bool nudged_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;

  // Allocation ids missing from the last successful List (reconciler
  // thread; ReconcileOnce callers serialise on pass_mu_).
  absl::Mutex pass_mu_;
  std::set<uint64_t> missing_once_ ABSL_GUARDED_BY(pass_mu_);

  absl::Mutex checkpoint_mu_;  // one checkpoint pass at a time
  std::set<uint64_t> checkpoint_missing_once_ ABSL_GUARDED_BY(checkpoint_mu_);
  // What the kubelet's checkpoint listed at the last pass, and the newest
  // allocation any pass has listed. At a kubelet restart the former were
  // live for it, and so were those newer than the latter: the kubelet
  // writes a container's devices into its checkpoint after the plugin has
  // answered and before it admits the next container, so a read may come
  // before the newest allocations are written, never before older ones.
  // An older allocation the checkpoint does not list belongs to a pod that
  // ended.
  bool checkpoint_seen_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  std::set<uint64_t> checkpoint_live_ ABSL_GUARDED_BY(checkpoint_mu_);
  uint64_t checkpoint_newest_listed_ ABSL_GUARDED_BY(checkpoint_mu_) = 0;

  // Checkpoint thread only: the check pending after a kubelet restart, and
  // the checkpoint last parsed.
  struct RestartCheck {
    std::set<uint64_t> live;  // allocations live when the restart was seen
    std::optional<FileId> checkpoint_before;
    absl::Time deadline;
  };
  std::optional<RestartCheck> restart_check_;
  // The check after a kubelet restart, once its checkpoint is written (or
  // the deadline passed): the allocations live before that it no longer
  // lists are forgotten ones, unless it kept its checkpoint at all.
  void FinishRestartCheck(const RestartCheck& check, const std::string& path,
                          const std::optional<FileId>& id);
  std::optional<FileId> last_checkpoint_;
  absl::Time last_checkpoint_parse_ = absl::InfinitePast();

  ForgottenAllocations forgotten_;
  // LearnBack: until when, and which resources. Held across a learning
  // pass, so the two sources never journal one allocation twice.
  absl::Mutex learn_mu_ ABSL_ACQUIRED_AFTER(checkpoint_mu_, pass_mu_);
  absl::Time learn_until_ ABSL_GUARDED_BY(learn_mu_) = absl::InfinitePast();
  std::function<bool(const std::string&)> serves_ ABSL_GUARDED_BY(learn_mu_);
  std::atomic<int64_t> recovered_checkpoint_{0};
  std::atomic<int64_t> recovered_pod_resources_{0};
  std::atomic<int64_t> unrecoverable_{0};
  // Entries already counted as unrecoverable: "source|resource|devices".
  std::set<std::string> unrecoverable_seen_ ABSL_GUARDED_BY(learn_mu_);
  // What one of the kubelet's copies lists for one container.
  struct Listed {
    std::string resource;
    std::vector<std::string> device_ids;
    std::string who;  // for the log: "pod UID container" or "namespace/name container"
  };
  // Journals what `listed` holds and the journal lacks, if the LearnBack
  // window is open. `from`: the source's name in the event and the log.
  void Learn(const std::vector<Listed>& listed, bool from_checkpoint)
      ABSL_LOCKS_EXCLUDED(learn_mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_RECONCILER_H_
