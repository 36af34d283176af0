// StateKeeper's start (state_keeper.h): the snapshot and the journal read
// back, and the fall-back to the previous snapshot when the newest is
// damaged.
#include "proxy/state/state_keeper.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

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

absl::StatusOr<state::State> StateKeeper::Load(bool summary) {
  // The allocations go from the file's bytes into the table, never parsed
  // into messages that would be freed again at once.
  AllocationTable loaded;
  absl::StatusOr<state::State> s =
      store_.Load([&loaded](absl::string_view wire) { return loaded.PutEncoded(wire); });
  if (!s.ok() && s.status().code() != absl::StatusCode::kDataLoss) {
    // Unreadable but not proven corrupt: never start empty over it.
    return s.status();
  }
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JournalFile::Replay> replay = journal_.Open();
  if (!replay.ok() && replay.status().code() == absl::StatusCode::kDataLoss) {
    // Not a journal at all: keep it aside, start a new one.
    const std::string aside =
        absl::StrCat(journal_.path(), ".corrupt-", absl::ToUnixSeconds(absl::Now()));
    LOG(ERROR) << replay.status().message() << "; moved aside to " << aside;
    damaged_at_load_ = true;
    events_->Emit("state_untrusted", {{"path", journal_.path()},
                                      {"error", std::string(replay.status().message())},
                                      {"moved_to", aside}});
    if (::rename(journal_.path().c_str(), aside.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot move the untrusted journal ", journal_.path(), " aside: ", ErrnoText(errno)));
    }
    replay = journal_.Open();
  }
  if (!replay.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open the allocation journal: ", replay.status().message(),
        "; dpproxy does not run without it (allocation IDs would collide with the records "
        "it holds)"));
  }
  journal_ok_ = true;
  journal_applied_bytes_ = journal_.size();
  journal_applied_records_ = journal_.records();
  if (replay->cut_bytes > 0) {
    LOG(WARNING) << "journal " << journal_.path() << ": cut " << replay->cut_bytes
                 << " bytes of a record torn by a crash (it was never acknowledged)";
    events_->Emit("journal_torn_tail", {{"path", journal_.path()},
                                        {"bytes", replay->cut_bytes}});
  }
  if (replay->created && s.ok() && s->saved_unix_ms() != 0) {
    // A saved snapshot and no journal beside it: the records since the
    // snapshot are gone with it (the kubelet still lists them).
    damaged_at_load_ = true;
    LOG(ERROR) << "journal " << journal_.path() << " was missing or empty beside the snapshot "
               << store_.path() << "; the allocations recorded since that snapshot are learned "
               << "back from the kubelet";
    events_->Emit("journal_missing", {{"path", journal_.path()}});
  }
  if (replay->damaged_bytes > 0) {
    damaged_at_load_ = true;
    LOG(ERROR) << "journal " << journal_.path() << " was damaged"
               << (replay->header_damaged ? " (its header among them)" : "") << ": "
               << replay->damaged_bytes << " bad bytes in " << replay->damaged_regions
               << " place(s); kept all " << replay->records.size()
               << " intact records, the damaged file is at " << replay->damaged_copy;
    events_->Emit("journal_damaged", {{"path", journal_.path()},
                                      {"bytes", replay->damaged_bytes},
                                      {"regions", replay->damaged_regions},
                                      {"header", replay->header_damaged},
                                      {"intact_records", replay->records.size()},
                                      {"copy", replay->damaged_copy}});
  }
  if (s.ok() && s->saved_unix_ms() == 0 && !PathExists(store_.path()) && previous_.Exists()) {
    // The snapshot is gone and its previous generation is not: the
    // directory was used before, and the snapshot's allocations are in
    // that generation and the journal. Never a first start.
    events_->Emit("state_missing", {{"path", store_.path()},
                                    {"previous", previous_.snapshot_path()}});
    s = absl::DataLossError(absl::StrCat(
        "state file ", store_.path(), " is missing while its previous generation (",
        previous_.snapshot_path(), ") is there: the directory was used before; falling back "
        "to that generation and the journal, and learning back from the kubelet"));
  }
  if (s.ok()) {
    state_ = *std::move(s);
    allocations_ = std::move(loaded);
    uint64_t last_id = state_.next_allocation_id();
    allocations_.RenumberDuplicates(&last_id);
    MergeJournal(replay->records, &allocations_, &last_id);
    state_.set_next_allocation_id(last_id);
    LOG(INFO) << "state loaded from " << store_.path() << ": " << state_.resources_size()
              << " resources, " << allocations_.size() << " allocations";
    events_->Emit("state_loaded", {{"path", store_.path()},
                                   {"resources", state_.resources_size()},
                                   {"allocations", allocations_.size()}});
    TakeResourcesLocked();
  } else {
    LOG(ERROR) << s.status().message();
    events_->Emit("state_untrusted", {{"path", store_.path()},
                                      {"error", std::string(s.status().message())}});
    if (absl::Status f = FallBackLocked(replay->records); !f.ok()) return f;
  }
  RebuildIndexLocked();
  if (holds_.AnyQuarantined()) ++quarantine_version_;
  // Fold what the journal held into a fresh snapshot. A disk that takes no
  // write (full) does not stop the start: the records stay in the journal
  // (a failed save drops none), what was loaded is served, Allocates are
  // refused while nothing can be written, and a later save folds them.
  if (!replay->records.empty()) {
    if (absl::Status save = SaveLocked(); !save.ok()) {
      LOG(ERROR) << "cannot fold the journal into a new snapshot at start (" << save.message()
                 << "): dpproxy starts on the " << allocations_.size()
                 << " allocation(s) it loaded, the journal keeps their records, and new "
                    "Allocates are refused until the state directory takes writes again";
    }
  }
  return summary ? SummaryLocked() : FullStateLocked();
}

absl::Status StateKeeper::FallBackLocked(const std::vector<state::Allocation>& journal) {
  damaged_at_load_ = true;
  PreviousGeneration::Fallback prev = previous_.Read();
  if (!prev.unreadable.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the state must fall back to its previous generation, which cannot be read: ",
        prev.unreadable.message(),
        "; dpproxy refuses to start rather than run on half its state (fix the file or the "
        "disk, then start again)"));
  }
  state_ = prev.snapshot.has_value() ? *std::move(prev.snapshot) : state::State();
  const int from_snapshot = state_.allocations_size();
  // Every record is trusted alone (each has its own checksum): the ones
  // the damaged snapshot took in since the previous one, then the journal.
  MergeJournal(prev.records, &state_);
  MergeJournal(journal, &state_);
  if (prev.snapshot.has_value()) {
    TakeResourcesLocked();
  } else {
    resources_.clear();
    state_.clear_resources();
  }
  const int merged = state_.allocations_size();
  TakeAllocationsLocked();
  for (const std::string* problem : {&prev.snapshot_problem, &prev.records_problem}) {
    if (!problem->empty()) LOG(ERROR) << "the previous generation is damaged too: " << *problem;
  }
  LOG(ERROR) << "state loaded from the previous generation: "
             << (prev.snapshot.has_value() ? previous_.snapshot_path()
                                           : std::string("no previous snapshot"))
             << " (" << from_snapshot << " allocations), " << prev.records.size()
             << " records since it, " << journal.size() << " journal records: " << merged
             << " allocations";
  events_->Emit("state_fell_back", {{"snapshot", prev.snapshot.has_value()
                                                     ? previous_.snapshot_path()
                                                     : std::string()},
                                    {"snapshot_allocations", from_snapshot},
                                    {"records", prev.records.size()},
                                    {"journal_records", journal.size()},
                                    {"allocations", merged}});
  return absl::OkStatus();
}

void StateKeeper::NotePreviousFailed(const absl::Status& s) {
  LOG(WARNING) << "cannot keep the previous generation of the state ("
               << previous_.records_path() << "): " << s.message()
               << "; the journal keeps those records until the next save";
}

void StateKeeper::TakeResourcesLocked() {
  resources_.clear();
  resources_.reserve(static_cast<size_t>(state_.resources_size()));
  for (state::Resource& r : *state_.mutable_resources()) {
    SavedResource saved;
    saved.updated_unix_ms = r.updated_unix_ms();
    r.clear_updated_unix_ms();
    r.SerializeToString(&saved.bytes);
    resources_.push_back(std::move(saved));
  }
  state_.clear_resources();
}

void StateKeeper::TakeAllocationsLocked() {
  allocations_.clear();
  allocations_.TakeFrom(&state_);
}

}  // namespace dpproxy
