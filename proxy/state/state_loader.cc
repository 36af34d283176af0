#include "proxy/state/state_loader.h"

#include <glog/logging.h>

#include <stdio.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"

namespace dpproxy {

absl::StatusOr<StateLoader::Loaded> StateLoader::Load() {
  Loaded out;
  // The allocations go from the file's bytes into the table, never parsed
  // into messages that would be freed again at once.
  absl::StatusOr<state::State> s = store_->Load(
      [&out](absl::string_view wire) { return out.allocations.PutEncoded(wire); });
  if (!s.ok() && s.status().code() != absl::StatusCode::kDataLoss) {
    // Unreadable but not proven corrupt: never start empty over it.
    return s.status();
  }
  absl::StatusOr<JournalFile::Replay> replay = OpenJournal(&out);
  if (!replay.ok()) return replay.status();
  ReportJournal(*replay, s.ok() && s->saved_unix_ms() != 0, &out);
  out.journal_records = replay->records.size();
  if (s.ok() && s->saved_unix_ms() == 0 && !PathExists(store_->path()) && previous_->Exists()) {
    // The snapshot is gone and its previous generation is not: the
    // directory was used before, and the snapshot's allocations are in
    // that generation and the journal. Never a first start.
    events_->Emit("state_missing", {{"path", store_->path()},
                                    {"previous", previous_->snapshot_path()}});
    s = absl::DataLossError(absl::StrCat(
        "state file ", store_->path(), " is missing while its previous generation (",
        previous_->snapshot_path(), ") is there: the directory was used before; falling back "
        "to that generation and the journal, and learning back from the kubelet"));
  }
  if (!s.ok()) {
    LOG(ERROR) << s.status().message();
    events_->Emit("state_untrusted", {{"path", store_->path()},
                                      {"error", std::string(s.status().message())}});
    if (absl::Status f = FallBack(replay->records, &out); !f.ok()) return f;
    return out;
  }
  out.state = *std::move(s);
  uint64_t last_id = out.state.next_allocation_id();
  out.allocations.RenumberDuplicates(&last_id);
  MergeJournal(replay->records, &out.allocations, &last_id);
  out.state.set_next_allocation_id(last_id);
  LOG(INFO) << "state loaded from " << store_->path() << ": " << out.state.resources_size()
            << " resources, " << out.allocations.size() << " allocations";
  events_->Emit("state_loaded", {{"path", store_->path()},
                                 {"resources", out.state.resources_size()},
                                 {"allocations", out.allocations.size()}});
  return out;
}

absl::StatusOr<JournalFile::Replay> StateLoader::OpenJournal(Loaded* out) {
  absl::StatusOr<JournalFile::Replay> replay = journal_->Open();
  if (!replay.ok() && replay.status().code() == absl::StatusCode::kDataLoss) {
    // Not a journal at all: keep it aside, start a new one.
    const std::string aside =
        absl::StrCat(journal_->path(), ".corrupt-", absl::ToUnixSeconds(absl::Now()));
    LOG(ERROR) << replay.status().message() << "; moved aside to " << aside;
    out->damaged = true;
    events_->Emit("state_untrusted", {{"path", journal_->path()},
                                      {"error", std::string(replay.status().message())},
                                      {"moved_to", aside}});
    if (::rename(journal_->path().c_str(), aside.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot move the untrusted journal ", journal_->path(), " aside: ", ErrnoText(errno)));
    }
    replay = journal_->Open();
  }
  if (!replay.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open the allocation journal: ", replay.status().message(),
        "; dpproxy does not run without it (allocation IDs would collide with the records "
        "it holds)"));
  }
  return replay;
}

void StateLoader::ReportJournal(const JournalFile::Replay& replay, bool snapshot_saved,
                                Loaded* out) {
  if (replay.cut_bytes > 0) {
    LOG(WARNING) << "journal " << journal_->path() << ": cut " << replay.cut_bytes
                 << " bytes of a record torn by a crash (it was never acknowledged)";
    events_->Emit("journal_torn_tail", {{"path", journal_->path()},
                                        {"bytes", replay.cut_bytes}});
  }
  if (replay.created && snapshot_saved) {
    // A saved snapshot and no journal beside it: the records since the
    // snapshot are gone with it (the kubelet still lists them).
    out->damaged = true;
    LOG(ERROR) << "journal " << journal_->path() << " was missing or empty beside the snapshot "
               << store_->path() << "; the allocations recorded since that snapshot are learned "
               << "back from the kubelet";
    events_->Emit("journal_missing", {{"path", journal_->path()}});
  }
  if (replay.damaged_bytes > 0) {
    out->damaged = true;
    LOG(ERROR) << "journal " << journal_->path() << " was damaged"
               << (replay.header_damaged ? " (its header among them)" : "") << ": "
               << replay.damaged_bytes << " bad bytes in " << replay.damaged_regions
               << " place(s); kept all " << replay.records.size()
               << " intact records, the damaged file is at " << replay.damaged_copy;
    events_->Emit("journal_damaged", {{"path", journal_->path()},
                                      {"bytes", replay.damaged_bytes},
                                      {"regions", replay.damaged_regions},
                                      {"header", replay.header_damaged},
                                      {"intact_records", replay.records.size()},
                                      {"copy", replay.damaged_copy}});
  }
}

absl::Status StateLoader::FallBack(const std::vector<state::Allocation>& journal, Loaded* out) {
  out->damaged = true;
  out->fell_back = true;
  PreviousGeneration::Fallback prev = previous_->Read();
  if (!prev.unreadable.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the state must fall back to its previous generation, which cannot be read: ",
        prev.unreadable.message(),
        "; dpproxy refuses to start rather than run on half its state (fix the file or the "
        "disk, then start again)"));
  }
  state::State st = prev.snapshot.has_value() ? *std::move(prev.snapshot) : state::State();
  const int from_snapshot = st.allocations_size();
  // Every record is trusted alone (each has its own checksum): the ones
  // the damaged snapshot took in since the previous one, then the journal.
  MergeJournal(prev.records, &st);
  MergeJournal(journal, &st);
  if (!prev.snapshot.has_value()) st.clear_resources();
  const int merged = st.allocations_size();
  out->allocations.clear();
  out->allocations.TakeFrom(&st);
  out->state = std::move(st);
  for (const std::string* problem : {&prev.snapshot_problem, &prev.records_problem}) {
    if (!problem->empty()) LOG(ERROR) << "the previous generation is damaged too: " << *problem;
  }
  LOG(ERROR) << "state loaded from the previous generation: "
             << (prev.snapshot.has_value() ? previous_->snapshot_path()
                                           : std::string("no previous snapshot"))
             << " (" << from_snapshot << " allocations), " << prev.records.size()
             << " records since it, " << journal.size() << " journal records: " << merged
             << " allocations";
  events_->Emit("state_fell_back", {{"snapshot", prev.snapshot.has_value()
                                                     ? previous_->snapshot_path()
                                                     : std::string()},
                                    {"snapshot_allocations", from_snapshot},
                                    {"records", prev.records.size()},
                                    {"journal_records", journal.size()},
                                    {"allocations", merged}});
  return absl::OkStatus();
}

}  // namespace dpproxy
