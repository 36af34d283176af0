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

namespace {

// Allocation.stage set to WHOLE (0), encoded: appended to a reservation's
// bytes, it ends the reservation.
const std::string& StageWhole() {
  static const std::string* const kBytes = [] {
    using google::protobuf::internal::WireFormatLite;
    static_assert(state::Allocation::WHOLE == 0, "the default stage");
    uint8_t bytes[6];
    uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
        WireFormatLite::MakeTag(state::Allocation::kStageFieldNumber,
                                WireFormatLite::WIRETYPE_VARINT),
        bytes);
    *end++ = 0;
    return new std::string(reinterpret_cast<const char*>(bytes),
                           static_cast<size_t>(end - bytes));
  }();
  return *kBytes;
}

std::string HeldKey(const std::string& resource, const std::string& id) {
  std::string k = resource;
  k.push_back('\0');
  k += id;
  return k;
}

std::string JournalPathFor(const std::string& snapshot) {
  size_t slash = snapshot.rfind('/');
  return slash == std::string::npos ? std::string("journal.wal")
                                    : snapshot.substr(0, slash + 1) + "journal.wal";
}

}  // namespace

StateKeeper::StateKeeper(std::string path, EventLog* events)
    : store_(path), previous_(path), events_(events), journal_(JournalPathFor(path)) {
  compactor_ = std::thread([this] {
    NameThisThread("dpp-compact");
    CompactLoop();
  });
  syncer_ = std::thread([this] {
    NameThisThread("dpp-syncer");
    SyncLoop();
  });
}

StateKeeper::~StateKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  compactor_.join();
  syncer_.join();
}

void StateKeeper::SyncLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Asleep until an answer is written and left unsynced.
    mu_.Await(absl::Condition(
        +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
          return k->unsynced_since_ != absl::InfiniteFuture() || k->stopping_;
        },
        this));
    // Then woken by the clock alone, not by each answer or sync: at the
    // oldest unsynced answer's due time, or every kAnswerSyncDelay while
    // answers keep being written and synced by the batches after them.
    // Asleep again once a delay passes with no answer written.
    for (;;) {
      if (stopping_) return;
      if (unsynced_since_ == absl::InfiniteFuture()) {
        const uint64_t seen = answer_writes_;
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), kAnswerSyncDelay);
        if (answer_writes_ == seen && unsynced_since_ == absl::InfiniteFuture()) break;
        continue;
      }
      const absl::Time due = unsynced_since_ + kAnswerSyncDelay;
      if (absl::Now() < due) {
        mu_.AwaitWithDeadline(absl::Condition(&stopping_), due);
        continue;
      }
      // A writer at work syncs them itself (WriteQueued syncs its next
      // batch once an answer written before it is due), so it is left to
      // go on: taking the journal from it would leave the calls it was
      // about to answer to this thread. The journal is taken when free.
      if (journal_busy_) {
        mu_.Await(absl::Condition(
            +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
              return !k->journal_busy_ || k->unsynced_since_ == absl::InfiniteFuture() ||
                     k->stopping_;
            },
            this));
        continue;
      }
      if (!journal_ok_) {
        unsynced_since_ = absl::InfiniteFuture();  // handed over (synced then) or never open
        continue;
      }
      journal_busy_ = true;
      if (unsynced_since_ == absl::InfiniteFuture()) {  // a batch synced them meanwhile
        ReleaseJournalLocked();  // writes what queued while savers waited
        continue;
      }
      SyncAnswersLocked();
    }
  }
}

void StateKeeper::SyncAnswersLocked() {
  unsynced_since_ = absl::InfiniteFuture();
  mu_.Unlock();
  const absl::Status synced = journal_.Sync();
  mu_.Lock();
  if (!synced.ok()) {
    NoteWrite(synced);
    LOG(ERROR) << "cannot sync answers in the journal " << journal_.path() << ": "
               << synced.message();
    events_->Emit("state_save_failed", {{"path", journal_.path()},
                                        {"error", std::string(synced.message())},
                                        {"failures", write_failures_.load()}});
  }
  ReleaseJournalLocked();
}

namespace {
absl::Status HandedOverError() {
  return absl::FailedPreconditionError(
      "the state directory was handed over to a new dpproxy; this one writes nothing more");
}
}  // namespace

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
    if (journal_ok_ && CompactDueLocked() && SaveLocked().ok()) {
      ++compactions_;
    }
    compacting_ = false;
  }
}

bool StateKeeper::WaitForQueued(size_t n, absl::Duration timeout) {
  struct Want {
    StateKeeper* k;
    size_t n;
  } want{this, n};
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](Want* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->k->mu_) {
            return w->k->queued_ >= w->n;
          },
          &want),
      timeout);
}

void StateKeeper::HandOver() {
  absl::MutexLock save(&save_mu_);  // after any compaction or save
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) {
        return !k->journal_busy_ && k->queue_.empty();
      },
      this));
  handed_over_ = true;
  journal_ok_ = false;
  compact_wanted_ = false;
  if (absl::Status s = journal_.Sync(); !s.ok()) {
    LOG(ERROR) << "cannot sync the journal before handing it over: " << s.message();
  }
  journal_.Close();
  LOG(INFO) << "state handed over: journal " << journal_.path() << " closed; nothing more is "
            << "written to " << store_.path();
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
  if (!quarantined_held_.empty()) ++quarantine_version_;
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

namespace {

// Appends the devices of a ListAndWatchResponse's bytes (field 1, each
// length-delimited) as state::Resource's `devices` (field 4): the same
// entries under another tag, of the same one-byte size. Anything else in
// the bytes is not a device and is left out.
void AppendListAsDevices(absl::string_view wire, std::string* out) {
  using google::protobuf::internal::WireFormatLite;
  constexpr uint8_t kListDevices = (1 << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  constexpr uint8_t kResourceDevices =
      (state::Resource::kDevicesFieldNumber << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
  static_assert(state::Resource::kDevicesFieldNumber < 16, "a one-byte tag");
  out->reserve(out->size() + wire.size());
  size_t pos = 0;
  while (pos < wire.size()) {
    const uint8_t tag = static_cast<uint8_t>(wire[pos]);
    uint64_t len = 0;
    size_t at = pos + 1;
    for (int shift = 0; at < wire.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(wire[at++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    if (tag != kListDevices || len > wire.size() - at) return;  // not a list's bytes
    out->push_back(static_cast<char>(kResourceDevices));
    out->append(wire.data() + pos + 1, at - pos - 1 + len);
    pos = at + len;
  }
}

}  // namespace

std::string StateKeeper::SavedResource::Encoded() const {
  std::string out = bytes;
  if (list_wire != nullptr) AppendListAsDevices(*list_wire, &out);
  return out;
}

void StateKeeper::AddSavedResourcesLocked(state::State* out) const {
  for (const SavedResource& saved : resources_) {
    state::Resource* r = out->add_resources();
    r->ParseFromString(saved.Encoded());
    r->set_updated_unix_ms(saved.updated_unix_ms);
  }
}

state::State StateKeeper::FullStateLocked() const {
  state::State out = state_;
  allocations_.CopyTo(&out);
  AddSavedResourcesLocked(&out);
  return out;
}

state::State StateKeeper::SummaryLocked() const {
  state::State out = AllocationsLocked(/*all_but_response=*/false);
  AddSavedResourcesLocked(&out);
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
  // Each saved resource is a `resources` entry of State: its bytes, then
  // its updated_unix_ms (a field appended to a message's bytes is read as
  // part of it).
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  struct ResourceField {
    std::string encoded;
    size_t length;  // with the time field
  };
  std::vector<ResourceField> resource_fields;
  resource_fields.reserve(resources_.size());
  size_t total = kStateFileHeaderSize + state_.ByteSizeLong() + allocations_.StateFieldSize();
  for (const SavedResource& saved : resources_) {
    ResourceField f{saved.Encoded(), 0};
    f.length = f.encoded.size();
    if (saved.updated_unix_ms != 0) {
      f.length += WireFormatLite::TagSize(state::Resource::kUpdatedUnixMsFieldNumber,
                                          WireFormatLite::TYPE_INT64) +
                  WireFormatLite::Int64Size(saved.updated_unix_ms);
    }
    total += WireFormatLite::TagSize(state::State::kResourcesFieldNumber,
                                     WireFormatLite::TYPE_MESSAGE) +
             CodedOutputStream::VarintSize32(static_cast<uint32_t>(f.length)) + f.length;
    resource_fields.push_back(std::move(f));
  }
  // One buffer of the final size, its pages mapped at once: grown as it
  // is filled, a large state was laid out two and a half times over, each
  // time in pages faulted in one by one.
  std::string bytes;
  ReserveMapped(&bytes, total);
  bytes.assign(kStateFileHeaderSize, '\0');  // sealed after the unlock
  state_.AppendToString(&bytes);
  allocations_.AppendAsStateField(&bytes);
  for (size_t i = 0; i < resources_.size(); ++i) {
    const ResourceField& f = resource_fields[i];
    uint8_t head[20];  // a tag and a varint32; then a tag and a varint64
    uint8_t* end = WireFormatLite::WriteTagToArray(
        state::State::kResourcesFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, head);
    end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(f.length), end);
    bytes.append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    bytes.append(f.encoded);
    if (resources_[i].updated_unix_ms != 0) {
      end = WireFormatLite::WriteInt64ToArray(state::Resource::kUpdatedUnixMsFieldNumber,
                                              resources_[i].updated_unix_ms, head);
      bytes.append(reinterpret_cast<const char*>(head), static_cast<size_t>(end - head));
    }
  }
  DCHECK_EQ(bytes.size(), total);
  const size_t covered_bytes = journal_applied_bytes_;
  const size_t covered_records = journal_applied_records_;
  const bool journal_ok = journal_ok_;
  mu_.Unlock();
  SealStateFile(&bytes);
  if (test_hook_) test_hook_("snapshot_write");
  const bool rotated = previous_.Rotate();
  absl::Status s = store_.SaveEncoded(bytes);
  if (s.ok()) snapshot_bytes_ = static_cast<int64_t>(bytes.size());
  // The records the snapshot took in stay in the previous generation
  // (previous_generation.h), kept before the journal drops them. They lie
  // before `covered_bytes`, which appends never rewrite (only DropFront
  // does, below, under save_mu_): read and written without the journal,
  // so Allocates go on meanwhile.
  absl::Status k = absl::OkStatus();
  if (s.ok() && journal_ok && covered_records > 0) {
    absl::StatusOr<std::string> taken_in = journal_.RecordBytes(covered_bytes);
    k = taken_in.ok() ? previous_.KeepRecords(*taken_in, rotated) : taken_in.status();
  } else if (s.ok() && rotated) {
    // Nothing taken in since the snapshot that is the previous one now.
    k = previous_.KeepRecords("", true);
  }
  mu_.Lock();
  if (!k.ok()) NotePreviousFailed(k);
  // Records the previous generation could not keep stay in the journal
  // until the next save.
  if (s.ok() && k.ok() && journal_ok_ && covered_records > 0) {
    // Exclusive use of the journal: no append is in flight.
    // A writer with records still queued hands the journal over between
    // two batches, and this saver writes what is left when it is done.
    ++savers_waiting_;
    mu_.Await(absl::Condition(
        +[](StateKeeper* k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(k->mu_) { return !k->journal_busy_; },
        this));
    --savers_waiting_;
    journal_busy_ = true;
    mu_.Unlock();
    // A crash before this completes replays records the snapshot also holds;
    // Load() keeps one of each.
    const absl::Status r = journal_.DropFront(covered_bytes, covered_records);
    const size_t size = journal_.size(), records = journal_.records();
    mu_.Lock();
    ReleaseJournalLocked();
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
    LOG(ERROR) << "cannot save state to " << store_.path() << " (the previous file is intact): "
               << s.message();
    events_->Emit("state_save_failed", {{"path", store_.path()},
                                        {"error", std::string(s.message())},
                                        {"failures", write_failures_.load()}});
  }
  return s;
}

absl::Status StateKeeper::Record(const std::string& resource,
                                 const v1beta1::AllocateRequest& req,
                                 const v1beta1::AllocateResponse& resp,
                                 const BackendSide& backend) {
  absl::Notification recorded;
  absl::Status result;
  RecordAsync(resource, req, resp, backend, [&](absl::Status s) {
    result = std::move(s);
    recorded.Notify();
  });
  recorded.WaitForNotification();
  return result;
}

namespace {

// Who holds an allocation, as a refusal names it.
std::string HolderOf(const state::Allocation& a) {
  if (a.has_claim()) {
    return absl::StrCat("DRA claim ", a.claim().namespace_(), "/", a.claim().name(), " (UID ",
                        a.claim().uid(), ")");
  }
  if (!a.pod_name().empty()) {
    return absl::StrCat("pod ", a.pod_namespace(), "/", a.pod_name(), " container ",
                        a.container());
  }
  if (!a.pod_uid().empty()) return absl::StrCat("a container of pod UID ", a.pod_uid());
  return absl::StrCat("allocation ", a.id());
}

}  // namespace

void StateKeeper::SetOneHolderAcrossPaths(bool on) {
  absl::MutexLock lock(&mu_);
  one_holder_ = on;
  one_holder_set_ = on;
  RebuildIndexLocked();
  HeldAcrossChangedLocked();
}

StateKeeper::Kinds StateKeeper::AllocationKinds() {
  Kinds k;
  absl::MutexLock lock(&mu_);
  for (const auto& [uid, ids] : by_claim_) k.claims += static_cast<int>(ids.size());
  k.others = static_cast<int>(allocations_.size()) - k.claims;
  return k;
}

std::map<std::string, StateKeeper::HeldAcross> StateKeeper::HeldAcrossPaths() {
  std::map<std::string, HeldAcross> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [resource, devices] : both_held_) {
    HeldAcross& h = out[resource];
    for (const auto& [device, counts] : devices) {
      if (counts.claims > 0) h.by_claims.insert(device);
      if (counts.pod_claims > 0) h.by_pod_claims.insert(device);
      if (counts.others > 0) h.by_pods.insert(device);
    }
  }
  return out;
}

void StateKeeper::HeldAcrossChangedLocked() {
  ++held_across_version_;
  if (held_across_observer_) held_across_observer_();
}

absl::Status StateKeeper::CheckOtherPath(const std::string& resource,
                                         const v1beta1::AllocateRequest& req, bool claim) {
  if (!one_holder_set_.load()) return absl::OkStatus();  // no lock on every Allocate
  absl::MutexLock lock(&mu_);
  if (!one_holder_) return absl::OkStatus();
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      if (absl::Status s = CheckOtherPathLocked(resource, id, claim); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status StateKeeper::CheckOtherPathLocked(const std::string& resource,
                                               const std::string& device, bool claim) {
  const std::string key = HeldKey(resource, device);
  auto c = claim_held_.find(key);
  const size_t by_claims = c == claim_held_.end() ? 0 : c->second.size();
  auto f = in_flight_.find(key);
  const InFlight flying = f == in_flight_.end() ? InFlight() : f->second;
  std::string holder;
  if (!claim && (by_claims > 0 || flying.claims > 0)) {
    state::Allocation a;
    if (by_claims == 0) {
      holder = flying.claim_holder;
    } else if (allocations_.Get(*c->second.rbegin(), &a)) {
      holder = HolderOf(a);
    } else {
      holder = absl::StrCat("allocation ", *c->second.rbegin());
    }
  } else if (claim) {
    auto h = held_.find(key);
    const size_t held = h == held_.end() ? 0 : static_cast<size_t>(h->second);
    if (held <= by_claims && flying.others == 0) return absl::OkStatus();
    // The newest allocation without a claim that names it: read only on a
    // refusal.
    if (held > by_claims) {
      allocations_.ForEach([&](const state::Allocation& a) {
        if (a.has_claim() || a.resource() != resource) return;
        for (const std::string& d : a.device_ids()) {
          if (d == device) holder = HolderOf(a);
        }
      });
    }
    if (holder.empty()) holder = "an allocation being recorded";
    holder = absl::StrCat(holder, ", a pod of the extended resource");
  } else {
    return absl::OkStatus();
  }
  events_->Emit("device_held_twice",
                {{"resource", resource},
                 {"device", device},
                 {"first", holder},
                 {"second", claim ? "refused claim" : "refused Allocate"}});
  return absl::FailedPreconditionError(
      absl::StrCat("device ", device, " of ", resource, " is held by ", holder,
                   "; refused: a device has one holder"));
}

absl::Status StateKeeper::CheckRecordableLocked(const std::string& resource,
                                                const v1beta1::AllocateRequest& req, bool claim,
                                                bool readmission) {
  if (handed_over_) return HandedOverError();
  if (!journal_ok_) return absl::FailedPreconditionError("the allocation journal is not open");
  if (one_holder_) {
    for (const auto& c : req.container_requests()) {
      for (const std::string& id : c.devices_ids()) {
        if (absl::Status s = CheckOtherPathLocked(resource, id, claim); !s.ok()) return s;
      }
    }
  }
  if (readmission) return absl::OkStatus();
  // A pod the kubelet lost track of may still hold these devices.
  for (const auto& c : req.container_requests()) {
    for (const std::string& id : c.devices_ids()) {
      auto q = quarantined_held_.find(HeldKey(resource, id));
      if (q == quarantined_held_.end()) continue;
      std::string holder = absl::StrCat("allocation ", q->second);
      if (state::Allocation a; allocations_.Get(q->second, &a)) holder = HolderOf(a);
      events_->Emit("device_held_twice", {{"resource", resource},
                                          {"device", id},
                                          {"first", holder},
                                          {"second", "refused Allocate"}});
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", id, " of ", resource, " is still in use by ", holder,
          ", which the kubelet lost track of (it counts the device free); refused"));
    }
  }
  return absl::OkStatus();
}

std::vector<state::Allocation> StateKeeper::NewRecordsLocked(
    const std::string& resource, const v1beta1::AllocateRequest& req,
    const v1beta1::AllocateResponse* resp, const BackendSide& backend) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  std::vector<state::Allocation> records;
  records.reserve(req.container_requests_size());
  uint64_t next = state_.next_allocation_id();
  for (int i = 0; i < req.container_requests_size(); ++i) {
    state::Allocation a;
    a.set_id(++next);
    a.set_resource(resource);
    for (const std::string& id : req.container_requests(i).devices_ids()) {
      a.add_device_ids(id);
    }
    if (resp == nullptr) {
      a.set_stage(state::Allocation::RESERVED);
    } else if (i < resp->container_responses_size()) {
      SetResponse(&a, resp->container_responses(i));
    }
    a.set_backend_api(backend.api);
    a.set_backend_endpoint(backend.endpoint);
    a.set_backend_resource(backend.resource);
    if (backend.request != nullptr && i < backend.request->container_requests_size()) {
      const auto& ids = backend.request->container_requests(i).devices_ids();
      if (!std::equal(ids.begin(), ids.end(), a.device_ids().begin(), a.device_ids().end())) {
        *a.mutable_backend_device_ids() = ids;
      }
    }
    if (backend.claims != nullptr && i < static_cast<int>(backend.claims->size())) {
      *a.mutable_claim() = (*backend.claims)[static_cast<size_t>(i)];
    }
    a.set_allocated_unix_ms(now);
    records.push_back(std::move(a));
  }
  state_.set_next_allocation_id(next);
  return records;
}

void StateKeeper::AddInFlightLocked(Pending* p) {
  for (const state::Allocation& a : p->records) {
    p->in_flight = true;
    for (const std::string& d : a.device_ids()) {
      InFlight& f = in_flight_[HeldKey(a.resource(), d)];
      if (a.has_claim()) {
        ++f.claims;
        f.claim_holder = HolderOf(a);
      } else {
        ++f.others;
      }
    }
  }
}

void StateKeeper::EndInFlightLocked(const Pending& p) {
  if (!p.in_flight) return;
  for (const state::Allocation& a : p.records) {
    for (const std::string& d : a.device_ids()) {
      auto f = in_flight_.find(HeldKey(a.resource(), d));
      if (f == in_flight_.end()) continue;
      (a.has_claim() ? f->second.claims : f->second.others) -= 1;
      if (f->second.claims <= 0 && f->second.others <= 0) in_flight_.erase(f);
    }
  }
}

bool StateKeeper::EnqueueLocked(std::unique_ptr<Pending> p) {
  if (!p->written_only && one_holder_) AddInFlightLocked(p.get());
  p->encoded = JournalFile::Encode(p->records);
  queue_.push_back(std::move(p));
  ++queued_;
  // The writer at work takes this record with its next batch.
  if (journal_busy_) return false;
  journal_busy_ = true;
  return true;
}

void StateKeeper::Submit(const std::function<absl::Status(Pending*)>& build,
                         std::function<void(absl::Status)> done) {
  absl::Status refused;
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    auto me = std::make_unique<Pending>();
    refused = build(me.get());
    if (refused.ok()) {
      me->done = std::move(done);
      write = EnqueueLocked(std::move(me));
    }
  }
  if (!refused.ok()) {
    if (done) done(std::move(refused));
    return;
  }
  if (write) WriteQueued();
}

void StateKeeper::RecordAsync(const std::string& resource, const v1beta1::AllocateRequest& req,
                              const v1beta1::AllocateResponse& resp, const BackendSide& backend,
                              std::function<void(absl::Status)> done) {
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::Status refused =
            CheckRecordableLocked(resource, req, backend.claims != nullptr);
        if (refused.ok()) me->records = NewRecordsLocked(resource, req, &resp, backend);
        return refused;
      },
      std::move(done));
}

AllocationJournal::Reservation StateKeeper::ReserveAsync(
    const std::string& resource, const v1beta1::AllocateRequest& req, const BackendSide& backend,
    std::function<void(absl::Status)> durable, bool readmission) {
  Reservation r;
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::Status refused =
            CheckRecordableLocked(resource, req, backend.claims != nullptr, readmission);
        if (!refused.ok()) return refused;
        me->records = NewRecordsLocked(resource, req, nullptr, backend);
        r.count = static_cast<int>(me->records.size());
        r.first_id = r.count > 0 ? me->records.front().id() : 0;
        return absl::OkStatus();
      },
      std::move(durable));
  return r;
}

void StateKeeper::AnswerAsync(const Reservation& r, const v1beta1::AllocateResponse& resp,
                              std::function<void(absl::Status)> done,
                              const std::vector<state::DraClaim>* claims) {
  Submit(
      [&](Pending* me) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (handed_over_) return HandedOverError();
        if (!journal_ok_) {
          return absl::FailedPreconditionError("the allocation journal is not open");
        }
        me->written_only = true;
        for (int i = 0; i < r.count; ++i) {
          state::Allocation a;
          a.set_id(r.first_id + static_cast<uint64_t>(i));
          a.set_stage(state::Allocation::ANSWERED);
          if (i < resp.container_responses_size()) {
            SetResponse(&a, resp.container_responses(i));
          }
          if (claims != nullptr && i < static_cast<int>(claims->size())) {
            *a.mutable_claim() = (*claims)[static_cast<size_t>(i)];
          }
          // In memory at once: a snapshot taken before the record is
          // written holds the response, and the record replays onto it
          // unchanged.
          if (!a.has_claim()) {
            // The reservation has no response: the answer's fields appended
            // to its bytes set it, and stage, set to WHOLE, ends the
            // reservation's.
            state::Allocation answer;
            answer.set_response(a.response());
            std::string fields = answer.SerializeAsString();
            fields += StageWhole();
            allocations_.AppendFields(a.id(), fields);
          } else {
            std::string was;  // the claim the reservation named
            if (allocations_.Update(a.id(), [&](state::Allocation* held) {
                  if (held->has_claim()) was = held->claim().uid();
                  *held->mutable_response() = a.response();
                  *held->mutable_claim() = a.claim();
                  held->clear_stage();
                }) &&
                was != a.claim().uid()) {
              if (auto c = by_claim_.find(was); c != by_claim_.end()) {
                c->second.erase(a.id());
                if (c->second.empty()) by_claim_.erase(c);
              }
              by_claim_[a.claim().uid()].insert(a.id());
            }
          }
          me->records.push_back(std::move(a));
        }
        return absl::OkStatus();
      },
      std::move(done));
}

void StateKeeper::Withdraw(const Reservation& r) {
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    const std::vector<state::Allocation> gone =
        allocations_.EraseRange(r.first_id, r.first_id + static_cast<uint64_t>(r.count));
    if (gone.empty()) return;  // never written, or released already
    for (const state::Allocation& a : gone) UnindexLocked(a);
    allocation_count_ = static_cast<int>(allocations_.size());
    ++released_version_;
    if (handed_over_ || !journal_ok_) return;  // the next start replays it as held
    auto me = std::make_unique<Pending>();
    me->written_only = true;
    for (int i = 0; i < r.count; ++i) {
      state::Allocation a;
      a.set_id(r.first_id + static_cast<uint64_t>(i));
      a.set_stage(state::Allocation::WITHDRAWN);
      me->records.push_back(std::move(a));
    }
    write = EnqueueLocked(std::move(me));
  }
  if (write) WriteQueued();
}

void StateKeeper::JournalReleasedLocked(const std::vector<uint64_t>& ids) {
  if (ids.empty() || handed_over_ || !journal_ok_) return;
  auto me = std::make_unique<Pending>();
  me->written_only = true;
  for (uint64_t id : ids) {
    state::Allocation a;
    a.set_id(id);
    a.set_stage(state::Allocation::WITHDRAWN);
    me->records.push_back(std::move(a));
  }
  if (!EnqueueLocked(std::move(me))) return;  // the writer at work takes them
  mu_.Unlock();
  WriteQueued();
  mu_.Lock();
}

void StateKeeper::ReleaseJournalLocked() {
  if (queue_.empty()) {
    journal_busy_ = false;
    return;
  }
  mu_.Unlock();
  WriteQueued();  // still busy: this thread is the writer now
  mu_.Lock();
}

void StateKeeper::WriteQueued() {
  std::vector<std::unique_ptr<Pending>> batch;
  absl::MutexLock lock(&mu_);
  while (!queue_.empty() && savers_waiting_ == 0) {
    // One write and one fdatasync for every reservation and whole record
    // queued; answers and withdrawals first, in a write of their own that
    // nobody waits to sync (their reservations are on the disk already).
    batch.clear();
    const bool written_only =
        std::any_of(queue_.begin(), queue_.end(), [](const auto& p) { return p->written_only; });
    std::deque<std::unique_ptr<Pending>> rest;
    for (auto& p : queue_) {
      if (!written_only || p->written_only) {
        batch.push_back(std::move(p));
      } else {
        rest.push_back(std::move(p));
      }
    }
    queue_ = std::move(rest);
    // Answers left unsynced for kAnswerSyncDelay are synced with this
    // batch, whatever it holds: a writer kept at work by answers alone
    // keeps the syncer's promise itself.
    const bool synced = !written_only || (unsynced_since_ != absl::InfiniteFuture() &&
                                          absl::Now() >= unsynced_since_ + kAnswerSyncDelay);
    std::string data = unwritten_withdrawals_;  // a failed write's withdrawals first
    size_t count = unwritten_withdrawal_records_;
    for (const auto& p : batch) {
      data += p->encoded;
      count += p->records.size();
    }
    mu_.Unlock();
    if (test_hook_) test_hook_("journal_write");
    const absl::Time write_start = absl::Now();
    const absl::Status fault = write_fault_ ? write_fault_() : absl::OkStatus();
    const absl::Status s =
        !fault.ok() ? fault
                    : journal_.AppendEncoded(data, count,
                                             synced ? JournalFile::Durability::kSynced
                                                    : JournalFile::Durability::kWritten);
    if (sync_observer_ && synced) sync_observer_(absl::Now() - write_start);
    const size_t journal_size = journal_.size(), journal_count = journal_.records();
    mu_.Lock();
    ++journal_writes_;
    NoteWrite(s);
    for (const auto& p : batch) EndInFlightLocked(*p);
    if (s.ok()) {
      unwritten_withdrawals_.clear();
      unwritten_withdrawal_records_ = 0;
    } else {
      // Withdrawals and releases are gone from memory already: written
      // with the next batch, so that no reservation they end is left in
      // the journal once the disk takes writes again.
      for (const auto& p : batch) {
        if (!p->written_only) continue;
        const bool withdrawals =
            std::all_of(p->records.begin(), p->records.end(), [](const state::Allocation& a) {
              return a.stage() == state::Allocation::WITHDRAWN;
            });
        if (!withdrawals) continue;
        unwritten_withdrawals_ += p->encoded;
        unwritten_withdrawal_records_ += p->records.size();
      }
    }
    if (!s.ok()) {
      LOG(ERROR) << "cannot append to the journal " << journal_.path() << ": " << s.message();
      events_->Emit("state_save_failed", {{"path", journal_.path()},
                                          {"error", std::string(s.message())},
                                          {"failures", write_failures_.load()},
                                          {"allocations_refused", count}});
    } else {
      journal_records_ += static_cast<int64_t>(count);
      journal_applied_bytes_ = journal_size;
      journal_applied_records_ = journal_count;
      for (auto& p : batch) {
        if (p->written_only) continue;  // applied when it was queued
        size_t pos = 0;  // each record's encoding, as the journal holds it
        for (const state::Allocation& a : p->records) {
          IndexLocked(a);
          allocations_.PutOwnEncoding(a.id(), JournalFile::EncodedPayload(p->encoded, &pos));
        }
      }
    }
    allocation_count_ = static_cast<int>(allocations_.size());
    queued_ -= batch.size();
    // The records are durable in the journal; the snapshot that takes them
    // in is written by the compactor, off this path.
    if (s.ok() && CompactDueLocked() && !compacting_) compact_wanted_ = true;
    // Answers and withdrawals left unsynced are synced by the next synced
    // batch (one is usually on its way: the next Allocate's reservation),
    // by this writer's next batch once they are due, or by the syncer
    // after kAnswerSyncDelay.
    if (!synced && s.ok()) {
      ++answer_writes_;
      if (unsynced_since_ == absl::InfiniteFuture()) unsynced_since_ = write_start;
    } else if (s.ok()) {
      unsynced_since_ = absl::InfiniteFuture();
    }
    // The answers go out with no lock held (each may finish a kubelet's
    // call); an error refuses every record of the batch: none was recorded.
    mu_.Unlock();
    for (auto& p : batch) {
      if (p->done) p->done(s);
    }
    mu_.Lock();
  }
  journal_busy_ = false;
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
  // Compared without the timestamps: only real changes are saved. The
  // same list's bytes are the same pointer; otherwise (another list, or a
  // resource as loaded from the file, whole) the encodings are compared.
  auto same = [](const ResourceToSave& next, const SavedResource& held) {
    if (next.list_wire != nullptr && held.list_wire != nullptr) {
      return next.head == held.bytes &&
             (next.list_wire == held.list_wire || *next.list_wire == *held.list_wire);
    }
    return SavedResource{next.head, next.list_wire, 0}.Encoded() == held.Encoded();
  };
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (to_save.size() != resources_.size()) return true;
    for (size_t i = 0; i < to_save.size(); ++i) {
      if (!same(to_save[i], resources_[i])) return true;
    }
    return false;
  };
  // Unchanged: nothing is saved, but the keeper holds the published lists'
  // bytes from now on instead of a copy of its own (a start loads them).
  auto adopt = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < to_save.size(); ++i) {
      if (resources_[i].list_wire == to_save[i].list_wire) continue;
      resources_[i].bytes = std::move(to_save[i].head);
      resources_[i].list_wire = std::move(to_save[i].list_wire);
    }
  };
  {
    // The common case (nothing changed) never waits for a writer's
    // fdatasync.
    absl::MutexLock lock(&mu_);
    if (!changed()) {
      adopt();
      return absl::OkStatus();
    }
  }
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  if (!changed()) {
    adopt();
    return absl::OkStatus();
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  resources_.clear();
  for (ResourceToSave& r : to_save) {
    resources_.push_back({std::move(r.head), std::move(r.list_wire), now});
  }
  return SaveLocked();
}

absl::Status StateKeeper::Release(const std::vector<uint64_t>& ids) {
  if (ids.empty()) return absl::OkStatus();
  absl::MutexLock save(&save_mu_);
  absl::MutexLock lock(&mu_);
  bool lifted = false;
  std::vector<uint64_t> released;
  for (uint64_t id : std::set<uint64_t>(ids.begin(), ids.end())) {
    state::Allocation x;
    if (!allocations_.Erase(id, &x)) continue;
    UnindexLocked(x);
    lifted = lifted || x.quarantined();
    released.push_back(id);
  }
  allocation_count_ = static_cast<int>(allocations_.size());
  if (lifted) {
    RebuildQuarantineIndexLocked();
    ++quarantine_version_;
  }
  ++released_version_;
  JournalReleasedLocked(released);
  return SaveLocked();
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
  bool lifted = false;
  std::vector<uint64_t> released;
  for (uint64_t id : std::set<uint64_t>(release.begin(), release.end())) {
    if (!allocations_.Erase(id, &a)) continue;
    UnindexLocked(a);
    lifted = lifted || a.quarantined();
    released.push_back(id);
  }
  if (lifted) {
    RebuildQuarantineIndexLocked();
    ++quarantine_version_;
  }
  if (!released.empty()) {
    allocation_count_ = static_cast<int>(allocations_.size());
    ++released_version_;
    JournalReleasedLocked(released);
  }
  if (released.empty() && (changed == 0 || !persist_names)) return changed;
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
  RebuildQuarantineIndexLocked();
  // Kept in memory even if the save fails: the devices stay away from new
  // pods in this run either way.
  if (absl::Status s = SaveLocked(); !s.ok()) return s;
  return added;
}

void StateKeeper::RebuildIndexLocked() {
  held_.clear();
  quarantined_held_.clear();
  by_claim_.clear();
  claim_held_.clear();
  both_held_.clear();
  allocations_.ForEach([this](const state::Allocation& a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    IndexLocked(a);
    if (!a.quarantined()) return;
    for (const std::string& d : a.device_ids()) quarantined_held_[HeldKey(a.resource(), d)] = a.id();
  });
  allocation_count_ = static_cast<int>(allocations_.size());
}

void StateKeeper::RebuildQuarantineIndexLocked() {
  quarantined_held_.clear();
  allocations_.ForEach([this](const state::Allocation& a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!a.quarantined()) return;
    for (const std::string& d : a.device_ids()) quarantined_held_[HeldKey(a.resource(), d)] = a.id();
  });
}

void StateKeeper::IndexLocked(const state::Allocation& a) {
  for (const std::string& d : a.device_ids()) ++held_[HeldKey(a.resource(), d)];
  if (one_holder_) {
    auto& devices = both_held_[a.resource()];
    for (const std::string& d : a.device_ids()) {
      HeldCounts& counts = devices[d];
      (a.has_claim() ? counts.claims : counts.others) += 1;
      if (a.has_claim() && a.claim().extended_resource()) ++counts.pod_claims;
    }
    HeldAcrossChangedLocked();
  }
  if (!a.has_claim()) return;
  by_claim_[a.claim().uid()].insert(a.id());
  for (const std::string& d : a.device_ids()) claim_held_[HeldKey(a.resource(), d)].insert(a.id());
}

void StateKeeper::UnindexLocked(const state::Allocation& a) {
  if (auto r = both_held_.find(a.resource()); r != both_held_.end()) {
    for (const std::string& d : a.device_ids()) {
      auto c = r->second.find(d);
      if (c == r->second.end()) continue;
      (a.has_claim() ? c->second.claims : c->second.others) -= 1;
      if (a.has_claim() && a.claim().extended_resource()) --c->second.pod_claims;
      if (c->second.claims <= 0 && c->second.others <= 0) r->second.erase(c);
    }
    HeldAcrossChangedLocked();
  }
  for (const std::string& d : a.device_ids()) {
    auto h = held_.find(HeldKey(a.resource(), d));
    if (h != held_.end() && --h->second == 0) held_.erase(h);
  }
  if (!a.has_claim()) return;
  for (const std::string& d : a.device_ids()) {
    auto h = claim_held_.find(HeldKey(a.resource(), d));
    if (h == claim_held_.end()) continue;
    h->second.erase(a.id());
    if (h->second.empty()) claim_held_.erase(h);
  }
  auto c = by_claim_.find(a.claim().uid());
  if (c == by_claim_.end()) return;
  c->second.erase(a.id());
  if (c->second.empty()) by_claim_.erase(c);
}

bool StateKeeper::HoldsDevice(const std::string& resource, const std::string& id) {
  absl::MutexLock lock(&mu_);
  return held_.count(HeldKey(resource, id)) > 0;
}

std::vector<state::Allocation> StateKeeper::ClaimAllocations(const std::string& claim_uid) {
  std::vector<state::Allocation> out;
  absl::MutexLock lock(&mu_);
  auto c = by_claim_.find(claim_uid);
  if (c == by_claim_.end()) return out;
  for (uint64_t id : c->second) {  // ids grow with age: oldest first
    out.emplace_back();
    if (!allocations_.Get(id, &out.back())) out.pop_back();
  }
  return out;
}

std::map<std::string, std::vector<state::Allocation>> StateKeeper::Claims() {
  std::map<std::string, std::vector<state::Allocation>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [uid, ids] : by_claim_) {
    std::vector<state::Allocation>& held = out[uid];
    for (uint64_t id : ids) {
      held.emplace_back();
      if (!allocations_.Get(id, &held.back())) held.pop_back();
    }
  }
  return out;
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
