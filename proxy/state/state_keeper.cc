#include "proxy/state/state_keeper.h"

#include <glog/logging.h>

#include <stdio.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "proxy/state/allocation_response.h"
#include "proxy/util/buffers.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

namespace {

std::string JournalPathFor(const std::string& snapshot) {
  size_t slash = snapshot.rfind('/');
  return slash == std::string::npos ? std::string("journal.wal")
                                    : snapshot.substr(0, slash + 1) + "journal.wal";
}

}  // namespace

StateKeeper::StateKeeper(std::string path, EventLog* events)
    : files_(path), events_(events),
      writer_(JournalPathFor(path), &mu_, this) {
  compactor_ = std::thread([this] {
    NameThisThread("dpp-compact");
    CompactLoop();
  });
}

StateKeeper::~StateKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  compactor_.join();
}

absl::Status StateKeeper::HandedOverError() {
  return absl::FailedPreconditionError(
      "the state directory was handed over to a new dpproxy; this one writes nothing more");
}

void StateKeeper::CompactLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
            return k->compact_wanted_ || k->stopping_;
          },
          this));
      if (stopping_) return;
      compact_wanted_ = false;
      compacting_ = true;
    }
    absl::MutexLock save(&save_mu_);
    absl::MutexLock lock(&mu_);
    // Another save may have taken the journal in meanwhile. A failed
    // compaction is logged and counted, and tried again at the next record.
    if (writer_.open() && CompactDueLocked() && SaveLocked().ok()) {
      ++compactions_;
    }
    compacting_ = false;
  }
}

void StateKeeper::HandOver() {
  absl::MutexLock save(&save_mu_);  // after any compaction or save
  absl::MutexLock lock(&mu_);
  writer_.CloseLocked();
  handed_over_ = true;
  compact_wanted_ = false;
  LOG(INFO) << "state handed over: journal " << writer_.path() << " closed; nothing more is "
            << "written to " << files_.path();
}

absl::StatusOr<state::State> StateKeeper::TakeBack() {
  {
    absl::MutexLock lock(&mu_);
    handed_over_ = false;
  }
  return Load();
}

void StateKeeper::WaitForCompaction() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
        return !k->compact_wanted_ && !k->compacting_;
      },
      this));
}

state::State StateKeeper::FullStateLocked() const {
  state::State out = state_;
  allocations_.CopyTo(&out);
  resources_.AppendTo(&out);
  return out;
}

state::State StateKeeper::SummaryLocked() const {
  state::State out = AllocationsLocked(/*all_but_response=*/false);
  resources_.AppendTo(&out);
  return out;
}

void StateKeeper::NoteWrite(const absl::Status& s) {
  if (s.ok()) {
    writable_ = true;
    return;
  }
  ++write_failures_;
  writable_ = false;
  last_write_error_ = std::string(s.message());
}

std::string StateKeeper::last_write_error() {
  absl::MutexLock lock(&mu_);
  return last_write_error_;
}

absl::Status StateKeeper::SaveLocked() {
  if (handed_over_) return HandedOverError();
  state_.set_saved_unix_ms(absl::ToUnixMillis(absl::Now()));
  // Laid out under mu_ (one buffer, no copy of the message graph); its
  // checksum taken and the file written without it, so Records go on
  // meanwhile. The snapshot covers the journal through the last applied
  // record; records appended during the write stay in the journal.
  //
  // Each saved resource is a `resources` entry of State (SavedResources).
  const SavedResources::Fields resource_fields = resources_.EncodeFields();
  const size_t total = kStateFileHeaderSize + state_.ByteSizeLong() +
                       allocations_.StateFieldSize() + resource_fields.size;
  // One buffer of the final size, its pages mapped at once: grown as it
  // is filled, a large state was laid out two and a half times over, each
  // time in pages faulted in one by one.
  std::string bytes;
  ReserveMapped(&bytes, total);
  bytes.assign(kStateFileHeaderSize, '\0');  // sealed after the unlock
  state_.AppendToString(&bytes);
  allocations_.AppendAsStateField(&bytes);
  resources_.AppendFields(resource_fields, &bytes);
  DCHECK_EQ(bytes.size(), total);
  const size_t covered_bytes = journal_applied_bytes_;
  const size_t covered_records = journal_applied_records_;
  const bool journal_ok = writer_.open();
  mu_.Unlock();
  if (test_hook_) test_hook_("snapshot_write");
  const SnapshotFiles::Saved saved =
      files_.Write(&bytes, journal_ok ? writer_.file() : nullptr, covered_bytes, covered_records);
  const absl::Status& s = saved.snapshot;
  if (s.ok()) snapshot_bytes_ = static_cast<int64_t>(bytes.size());
  mu_.Lock();
  // Records the previous generation could not keep stay in the journal
  // until the next save.
  if (saved.ok() && writer_.open() && covered_records > 0) {
    // Exclusive use of the journal: no append is in flight.
    // A writer with records still queued hands the journal over between
    // two batches, and this saver writes what is left when it is done.
    writer_.AcquireLocked();
    mu_.Unlock();
    // A crash before this completes replays records the snapshot also holds;
    // Load() keeps one of each.
    JournalFile* journal = writer_.file();
    const absl::Status r = journal->DropFront(covered_bytes, covered_records);
    const size_t size = journal->size(), records = journal->records();
    mu_.Lock();
    writer_.ReleaseLocked();
    if (r.ok()) {
      journal_applied_bytes_ = size;
      journal_applied_records_ = records;
    } else {
      LOG(ERROR) << "cannot drop the records a snapshot holds from the journal (they are "
                    "kept; replay skips them): "
                 << r.message();
    }
  }
  NoteWrite(s);
  if (!s.ok()) {
    LOG(ERROR) << "cannot save state to " << files_.path() << " (the previous file is intact): "
               << s.message();
    events_->Emit("state_save_failed", {{"path", files_.path()},
                                        {"error", std::string(s.message())},
                                        {"failures", write_failures_.load()}});
  }
  return s;
}

absl::Status StateKeeper::SetResources(std::vector<state::Resource> resources) {
  std::sort(resources.begin(), resources.end(),
            [](const state::Resource& a, const state::Resource& b) { return a.name() < b.name(); });
  std::vector<ResourceToSave> to_save;
  to_save.reserve(resources.size());
  for (state::Resource& r : resources) {
    r.clear_updated_unix_ms();
    to_save.push_back({r.SerializeAsString(), nullptr});
  }
  return SetResourcesToSave(std::move(to_save));
}

absl::Status StateKeeper::SetResourcesToSave(std::vector<ResourceToSave> to_save) {
  // Compared without the timestamps: only real changes are saved.
  {
    // The common case (nothing changed) never waits for a writer's
    // fdatasync.
    absl::MutexLock lock(&mu_);
    if (resources_.Same(to_save)) {
      // Nothing is saved, but the keeper holds the published lists' bytes
      // from now on instead of a copy of its own (a start loads them).
      resources_.Adopt(std::move(to_save));
      return absl::OkStatus();
    }
  }
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  if (resources_.Same(to_save)) {
    resources_.Adopt(std::move(to_save));
    return absl::OkStatus();
  }
  resources_.Replace(std::move(to_save), absl::ToUnixMillis(absl::Now()));
  return SaveLocked();
}

absl::Status StateKeeper::Release(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  ForgetLocked(ids);
  return SaveLocked();
}

bool StateKeeper::ForgetLocked(const std::vector<uint64_t>& ids) {
  bool lifted = false;
  std::vector<uint64_t> released;
  state::Allocation a;
  for (uint64_t id : std::set<uint64_t>(ids.begin(), ids.end())) {
    if (!allocations_.Erase(id, &a)) continue;
    UnindexLocked(a);
    lifted = lifted || a.quarantined();
    released.push_back(id);
  }
  if (lifted) {
    holds_.RebuildQuarantined(allocations_);
    ++quarantine_version_;
  }
  if (released.empty()) return false;
  allocation_count_ = static_cast<int>(allocations_.size());
  ++released_version_;
  JournalReleasedLocked(released);
  return true;
}

absl::StatusOr<int> StateKeeper::Reconcile(const std::vector<Holder>& holders,
                                           const std::vector<uint64_t>& release,
                                           bool persist_names) {
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, const Holder*> by_id;  // the last one named for each id
  for (const Holder& h : holders) by_id[h.id] = &h;
  int changed = 0;
  state::Allocation a;
  for (const auto& [id, holder] : by_id) {
    if (!allocations_.Get(id, &a)) continue;
    const Holder& h = *holder;
    bool touched = false;
    if (!h.pod_name.empty() && (a.pod_namespace() != h.pod_namespace ||
                                a.pod_name() != h.pod_name || a.container() != h.container)) {
      a.set_pod_namespace(h.pod_namespace);
      a.set_pod_name(h.pod_name);
      a.set_container(h.container);
      touched = true;
    }
    if (!h.pod_uid.empty() && a.pod_uid() != h.pod_uid) {
      a.set_pod_uid(h.pod_uid);
      if (a.container().empty()) a.set_container(h.container);
      touched = true;
    }
    if (!touched) continue;
    allocations_.Put(a);
    ++changed;
  }
  const bool released = ForgetLocked(release);
  if (!released && (changed == 0 || !persist_names)) return changed;
  if (absl::Status s = SaveLocked(); !s.ok()) return s;
  return changed;
}

absl::StatusOr<int> StateKeeper::Quarantine(const std::vector<uint64_t>& ids,
                                            const std::string& reason) {
  if (ids.empty()) return 0;
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  const std::set<uint64_t> wanted(ids.begin(), ids.end());
  const int64_t now = absl::ToUnixMillis(absl::Now());
  int added = 0;
  for (uint64_t id : wanted) {
    allocations_.Update(id, [&](state::Allocation* a) {
      if (a->quarantined()) return;
      a->set_quarantined(true);
      a->set_quarantine_reason(reason);
      a->set_quarantined_unix_ms(now);
      ++added;
    });
  }
  if (added == 0) return 0;
  ++quarantine_version_;
  holds_.RebuildQuarantined(allocations_);
  // Kept in memory even if the save fails: the devices stay away from new
  // pods in this run either way.
  if (absl::Status s = SaveLocked(); !s.ok()) return s;
  return added;
}

int StateKeeper::AllocationCount() { return allocation_count_.load(); }

state::State StateKeeper::AllocationsSnapshot() {
  absl::MutexLock lock(&mu_);
  return AllocationsLocked(/*all_but_response=*/true);
}

state::State StateKeeper::AllocationsLocked(bool all_but_response) const {
  state::State out;
  out.mutable_allocations()->Reserve(static_cast<int>(allocations_.size()));
  if (all_but_response) {
    // Every field but the response, which no pass reads: each parsed
    // straight into its place, not into a message to copy from.
    allocations_.ForEachEncoded([&](uint64_t id, absl::string_view wire) {
      state::Allocation* c = out.add_allocations();
      if (!c->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
        LOG(DFATAL) << "allocation " << id << " held in memory does not parse";
      }
      c->clear_response();
    });
  } else {
    allocations_.ForEach([&](const state::Allocation& a) {
      state::Allocation* c = out.add_allocations();
      c->set_id(a.id());
      c->set_resource(a.resource());
    });
  }
  out.set_next_allocation_id(state_.next_allocation_id());
  return out;
}

void StateKeeper::ForEachAllocation(
    const std::function<void(const state::Allocation&)>& visit) {
  absl::MutexLock lock(&mu_);
  allocations_.ForEach(visit);
}

state::State StateKeeper::Snapshot() {
  absl::MutexLock lock(&mu_);
  return FullStateLocked();
}

}  // namespace dpproxy
