// File: state_keeper.h
//
// dpproxy's durable state in memory and on disk. Allocations are recorded
// in an append-only journal (journal_file.h): the kubelet's Allocate is
// answered only after its record is synced, so every allocation the kubelet
// received an answer for survives a crash.
//
// Group commit (journal_writer.h): concurrent Records queue up; whoever
// finds the journal free writes every queued record with one write and one
// fdatasync, then tells the others the result. No lock is held across the
// disk I/O.
//
// Snapshots (state_store.h) take in the journal: the state is encoded under
// the lock, written without it while records keep arriving, and then only
// the records the snapshot covers are dropped from the journal. Compaction
// (every kCompactAfter records) runs on a thread of its own, so no Allocate
// waits for a snapshot. Resource snapshots (devices, backend, negotiated
// version) are saved when they change, at most a second late (the
// registrar's cadence). Thread-safe; snapshot saves are serialized.
#ifndef DPPROXY_PROXY_STATE_STATE_KEEPER_H_
#define DPPROXY_PROXY_STATE_STATE_KEEPER_H_

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/events/event_log.h"
#include "proxy/state/allocation_journal.h"
#include "proxy/state/allocation_table.h"
#include "proxy/state/hold_index.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/journal_writer.h"
#include "proxy/state/previous_generation.h"
#include "proxy/state/saved_resources.h"
#include "proxy/state/snapshot_files.h"
#include "proxy/state/state_loader.h"
#include "proxy/state/state_store.h"

namespace dpproxy {

class StateKeeper : public ClaimJournal, private JournalWriter::Owner {
 public:
  // `path` is the snapshot (<state_dir>/state.pb); the journal is
  // journal.wal beside it.
  StateKeeper(std::string path, EventLog* events);
  ~StateKeeper() override;
  StateKeeper(const StateKeeper&) = delete;
  StateKeeper& operator=(const StateKeeper&) = delete;

  // dpproxy serves the kubelet both as device plugins and through DRA
  // (ProxyConfig::paths): each device has one holder across the two paths,
  // whatever the resource's path is now (a resource whose path changed
  // keeps the other path's holders until they end). A device a claim holds
  // is refused to an allocation without a claim, and one an allocation
  // without a claim holds (a pod of the extended resource, until
  // reconciliation finds it gone) is refused to a claim, each refusal
  // naming the holder. Off: each path rules its own devices. Set before
  // the first Record.
  void SetOneHolderAcrossPaths(bool on);
  // How many allocations DRA claims made, and how many the device-plugin
  // path made (those without a claim).
  struct Kinds {
    int claims = 0, others = 0;
  };
  Kinds AllocationKinds();
  absl::Status CheckOtherPath(const std::string& resource, const v1beta1::AllocateRequest& req,
                              bool claim) override;
  // With one holder across paths, each resource with allocations: the
  // devices DRA claims hold (by_claims; by_pod_claims those of claims the
  // scheduler made for pods' extended-resource requests, a subset), and
  // those allocations without a claim hold (recorded ones). What the other
  // side must not offer (Resource::SetHeldAcrossPaths). A resource stays
  // listed, with nothing held, once its last allocation goes.
  using HeldAcross = HoldIndex::HeldAcross;
  std::map<std::string, HeldAcross> HeldAcrossPaths();
  // Grows whenever HeldAcrossPaths() changes; `changed` is called then,
  // under the keeper's lock: it may only wake someone up.
  uint64_t held_across_version() const { return held_across_version_.load(); }
  void SetHeldAcrossObserver(std::function<void()> changed) {
    held_across_observer_ = std::move(changed);
  }

  // Called with the duration of each journal write and its fdatasync (on
  // the writing thread, no lock held). Set before the first Record.
  void SetSyncObserver(std::function<void(absl::Duration)> observe) {
    writer_.SetSyncObserver(std::move(observe));
  }

  // Journal records that start a compaction: this many, or as many as
  // there are allocations if that is more. A compaction encodes every
  // allocation, so each record pays for at most one allocation's encoding
  // however large the state grows, and a replay at start-up reads no more
  // records than the snapshot holds.
  static constexpr size_t kCompactAfter = 1000;
  // How long an answer written to the journal may wait for the next synced
  // batch before it is synced on its own.
  static constexpr absl::Duration kAnswerSyncDelay = JournalWriter::kAnswerSyncDelay;

  // Loads the snapshot and the journal (StateLoader: what a missing,
  // damaged or unreadable file does), then folds the journal's records
  // into a fresh snapshot. An error means the caller must not run on half
  // the state.
  //
  // Returns the state loaded: in full, or with `summary` the resources and,
  // of each allocation, its id and resource only (a start needs no more,
  // and a full copy of every allocation doubles the memory at its peak).
  absl::StatusOr<state::State> Load(bool summary = false);

  // Group commit (JournalWriter): a record that finds the journal free is
  // written at once by its caller's thread, which then goes on writing
  // whatever queued meanwhile, in batches, until none is left; a record
  // that finds the journal busy is queued and its caller returns at once.
  void RecordAsync(const std::string& resource, const v1beta1::AllocateRequest& req,
                   const v1beta1::AllocateResponse& resp, const BackendSide& backend,
                   std::function<void(absl::Status)> done) override;
  // The same, waiting for the outcome.
  absl::Status Record(const std::string& resource, const v1beta1::AllocateRequest& req,
                      const v1beta1::AllocateResponse& resp, const BackendSide& backend) override;
  // An allocation in two steps (AllocationJournal). Answers and
  // withdrawals are written with no sync to wait for (journal_writer.h).
  Reservation ReserveAsync(const std::string& resource, const v1beta1::AllocateRequest& req,
                           const BackendSide& backend, std::function<void(absl::Status)> durable,
                           bool readmission = false) override;
  void AnswerAsync(const Reservation& r, const v1beta1::AllocateResponse& resp,
                   std::function<void(absl::Status)> done,
                   const std::vector<state::DraClaim>* claims = nullptr) override;
  void Withdraw(const Reservation& r) override;
  absl::Status Record(const std::string& resource, const v1beta1::AllocateRequest& req,
                      const v1beta1::AllocateResponse& resp, const std::string& backend_api,
                      const std::string& backend_endpoint) {
    BackendSide backend;
    backend.api = backend_api;
    backend.endpoint = backend_endpoint;
    return Record(resource, req, resp, backend);
  }

  // Replaces the saved resource snapshots; saves if they changed.
  absl::Status SetResources(std::vector<state::Resource> resources);
  // One resource to save, as the saver has it (saved_resources.h). The
  // keeper holds the list's bytes shared, never a copy: they are written
  // as the resource's `devices` when a snapshot is saved.
  using ResourceToSave = SavedResources::ToSave;
  // The same as SetResources, in order of name.
  absl::Status SetResourcesToSave(std::vector<ResourceToSave> resources);

  // Forgets allocations (their pods are gone). Saves.
  absl::Status Release(const std::vector<uint64_t>& ids) override;
  // One reconciliation pass: names the holders of some allocations and
  // forgets others, with one save if anything changed (`persist_names`
  // false: names alone are kept in memory and go to disk with the next
  // save; they are learned again after a crash). Returns how many
  // annotations changed.
  struct Holder {
    uint64_t id = 0;
    std::string pod_namespace, pod_name, container;
    std::string pod_uid;  // from the kubelet's checkpoint; "" keeps the old
  };
  absl::StatusOr<int> Reconcile(const std::vector<Holder>& holders,
                                const std::vector<uint64_t>& release,
                                bool persist_names = true);

  // Marks allocations quarantined (see state.proto) with `reason`. Saves.
  // Returns how many were newly quarantined.
  absl::StatusOr<int> Quarantine(const std::vector<uint64_t>& ids, const std::string& reason);
  // Changes whenever the set of quarantined allocations changes.
  uint64_t quarantine_version() const { return quarantine_version_.load(); }
  // Changes whenever allocations are forgotten (Release, Reconcile).
  uint64_t released_version() const { return released_version_.load(); }

  // A copy of everything (for dpctl-like views and tests).
  state::State Snapshot();
  // A copy of the allocations alone (and the next id), without the saved
  // device lists and without the allocations' responses: what
  // reconciliation and the checkpoint passes need, at a cost that does not
  // grow with devices nor with what plugins answered.
  state::State AllocationsSnapshot();
  // Calls `visit` with each allocation in place, under the keeper's lock
  // (records wait meanwhile): for a pass that keeps little of what it
  // reads. `visit` must not call back into the keeper.
  void ForEachAllocation(const std::function<void(const state::Allocation&)>& visit);
  // DRA mode: the allocations of one claim, oldest first (with their
  // responses).
  std::vector<state::Allocation> ClaimAllocations(const std::string& claim_uid) override;
  // DRA mode: every claim with allocations, each with its allocations
  // (oldest first).
  std::map<std::string, std::vector<state::Allocation>> Claims() override;
  // Load() found the state damaged (a file moved aside, or journal
  // records lost): allocations it held may be missing.
  bool damaged_at_load() const { return damaged_at_load_.load(); }
  // What Load() found lacks what it should hold, for a reason it cannot
  // see itself (the state directory lost every file): as damaged_at_load.
  void MarkDamagedAtLoad() { damaged_at_load_ = true; }
  // Cheap, for status and metrics.
  int AllocationCount();
  // Whether an allocation of `resource` in the journal names device `id`.
  bool HoldsDevice(const std::string& resource, const std::string& id);
  const std::string& path() const { return files_.path(); }
  // Failed writes of either kind: journal appends (each refused an
  // Allocate) and snapshot saves.
  int64_t save_failures() const { return write_failures_.load(); }
  // False after a failed write until the next one succeeds; the error.
  bool writable() const { return writable_.load(); }
  std::string last_write_error();
  // How many journal writes (each one fdatasync) and records there were,
  // and how many snapshots compaction wrote: batching shows as
  // journal_records() > journal_writes().
  int64_t journal_writes() const { return writer_.writes(); }
  // The journal's records in bytes (the space written ahead of them not
  // counted), and the snapshot's size as last written (0 until this
  // process writes one). O(1).
  int64_t journal_bytes() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(journal_applied_bytes_);
  }
  int64_t snapshot_bytes() const { return snapshot_bytes_.load(); }
  int64_t journal_records() const { return writer_.records(); }
  int64_t compactions() const { return compactions_.load(); }
  // Stops writing for good, for a new dpproxy that takes the state
  // directory over (proxy/handoff): waits for a compaction or save in
  // progress and for every queued record to be written, then closes the
  // journal. Everything is on disk when it returns; every later write (a
  // Record, a save) fails with kFailedPrecondition naming the handoff.
  void HandOver();
  // After HandOver, the state directory is this keeper's again (the new
  // dpproxy gave it back, or died): everything is read again from disk, as
  // Load() does, for the new one may have written to it.
  absl::StatusOr<state::State> TakeBack();

  // Waits until no compaction is wanted or running (tests, shutdown).
  void WaitForCompaction();

  // For tests: called with no lock held right before a group-commit
  // leader's journal write ("journal_write"), right after a journal
  // fdatasync returned ("journal_synced"), and before a snapshot write
  // ("snapshot_write"). Set before any Record.
  void SetTestHook(std::function<void(const char* where)> hook) {
    test_hook_ = hook;
    writer_.SetTestHook(std::move(hook));
  }
  // For tests: consulted right before each journal write; an error makes
  // that write fail with it, as a full disk would, writing nothing.
  void SetWriteFaultForTest(std::function<absl::Status()> fault) {
    writer_.SetWriteFaultForTest(std::move(fault));
  }
  // Whether `n` Records are queued for the journal (including one being
  // written) within `timeout`.
  bool WaitForQueued(size_t n, absl::Duration timeout) {
    return writer_.WaitForQueued(n, timeout);
  }

 private:
  // What every write returns once the state was handed over.
  static absl::Status HandedOverError();
  using Pending = JournalWriter::Entry;
  // Records queued and not yet written, with one holder across paths,
  // hold their devices in the index already (HoldIndex::StartInFlight).
  void AddInFlightLocked(Pending* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndInFlightLocked(const Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records of `req` (ids taken now; a failed write leaves a gap, never a
  // reuse), WHOLE with `resp`, or RESERVED without it.
  std::vector<state::Allocation> NewRecordsLocked(const std::string& resource,
                                                  const v1beta1::AllocateRequest& req,
                                                  const v1beta1::AllocateResponse* resp,
                                                  const BackendSide& backend)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_, `build` fills a Pending or says why not; the Pending is
  // queued with `done` (written by this thread if the journal is free), or
  // `done` gets the refusal.
  void Submit(const std::function<absl::Status(Pending*)>& build,
              std::function<void(absl::Status)> done) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `p` (JournalWriter::EnqueueLocked), its records holding their
  // devices meanwhile; true if the caller is to write the queue.
  bool EnqueueLocked(std::unique_ptr<Pending> p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JournalWriter::Owner: a batch applied to the allocations once written,
  // or its failure reported.
  void BatchWrittenLocked(const JournalWriter::Batch& batch,
                          const JournalWriter::Written& written) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncFailedLocked(const absl::Status& s) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Why a Record of `req` may not be journaled (the journal is not open, a
  // device is quarantined), or OK.
  // `claim`: the request is a DRA claim's.
  absl::Status CheckRecordableLocked(const std::string& resource,
                                     const v1beta1::AllocateRequest& req, bool claim,
                                     bool readmission = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetOneHolderAcrossPaths' rule for the devices of `req`; OK if they may
  // be recorded, else the refusal, reported as a `device_held_twice` event.
  absl::Status CheckOtherPathLocked(const std::string& resource,
                                    const v1beta1::AllocateRequest& req, bool claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A refusal of the hold index, as an event and a status.
  absl::Status Refuse(const std::string& resource, const std::string& device,
                      const HoldIndex::Refusal& r, bool claim)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes a snapshot of the state and drops the journal records it
  // covers. Releases mu_ during the I/O; save_mu_ keeps other savers out.
  absl::Status SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_, mu_);
  void NoteWrite(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The hold index from every allocation.
  void RebuildIndexLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The hold index without `a`, removed from allocations_.
  void UnindexLocked(const state::Allocation& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompactLoop();
  // Forgets the allocations of `ids` (those it holds): out of the index,
  // quarantine lifted with them, WITHDRAWN records queued
  // (JournalReleasedLocked). Whether any was held. The caller saves.
  bool ForgetLocked(const std::vector<uint64_t>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_, mu_);
  // Released allocations, as WITHDRAWN records (written, not synced): the
  // snapshot saved next drops them, and the previous generation's records
  // carry the release, so a fallback does not bring them back. Called with
  // save_mu_ held, before the snapshot is encoded; may release mu_ to write.
  void JournalReleasedLocked(const std::vector<uint64_t>& ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The snapshot, the one before it and the records since that one.
  SnapshotFiles files_;
  EventLog* const events_;
  // Held by snapshot savers, before mu_, across the snapshot's I/O. Record
  // never takes it.
  absl::Mutex save_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  // The journal's size and record count through the last record applied
  // to state_: what a snapshot encoded now covers.
  size_t journal_applied_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> snapshot_bytes_{0};
  size_t journal_applied_records_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the journal holds enough records for a compaction.
  bool CompactDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return journal_applied_records_ >=
           std::max(kCompactAfter, allocations_.size());
  }
  // Everything but the resources and the allocations, which are kept
  // serialized: the resources in resources_ (saved_resources.h), the
  // allocations in allocations_.
  state::State state_ ABSL_GUARDED_BY(mu_);
  AllocationTable allocations_ ABSL_GUARDED_BY(mu_);
  SavedResources resources_ ABSL_GUARDED_BY(mu_);
  // state_ and resources_ as one State.
  state::State FullStateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The resources, and each allocation's id and resource.
  state::State SummaryLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocations and the next id: each allocation's id and resource,
  // or with `all_but_response` every field but the response.
  state::State AllocationsLocked(bool all_but_response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Who holds which device, of allocations_ and of the records queued:
  // added to as records join allocations_, taken from by removals.
  HoldIndex holds_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> held_across_version_{0};
  std::function<void()> held_across_observer_;
  void HeldAcrossChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::atomic<bool> one_holder_set_{false};  // holds_'s rule, read without the lock
  // The hold index with `a`, added to allocations_.
  void IndexLocked(const state::Allocation& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::atomic<int> allocation_count_{0};
  std::atomic<bool> damaged_at_load_{false};
  std::atomic<int64_t> write_failures_{0};
  std::atomic<uint64_t> quarantine_version_{0};
  std::atomic<uint64_t> released_version_{0};
  std::atomic<bool> writable_{true};
  std::atomic<int64_t> compactions_{0};
  std::string last_write_error_ ABSL_GUARDED_BY(mu_);
  bool compact_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool compacting_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool handed_over_ ABSL_GUARDED_BY(mu_) = false;
  std::thread compactor_;
  std::function<void(const char*)> test_hook_;
  // Last, so that its syncer thread, which may call back into the keeper,
  // stops first.
  JournalWriter writer_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_STATE_KEEPER_H_
