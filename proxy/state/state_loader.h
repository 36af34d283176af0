// File: state_loader.h
//
// What a start reads back: the snapshot (state_store.h), the journal's
// records since it (journal_file.h), and, when the snapshot is proven
// damaged or missing while the directory was used before, the previous
// generation (previous_generation.h) with its records and the journal's.
//
// A missing file is a fresh start; one proven corrupt is moved aside and
// reported (the journal's intact records are still loaded). Damage in the
// middle of the journal keeps every intact record, copies the file aside
// and is reported. Anything else that keeps the state from being read or
// the journal from being opened for writing (EIO, EACCES, a read-only
// filesystem, a directory or a link in place of a file) is an error: the
// caller must not run on half the state.
//
// Reads only, with one exception: a journal that is not a journal at all
// is renamed aside so that a new one can be opened. Not thread-safe; the
// keeper calls it under its locks, before any record is written.
#ifndef DPPROXY_PROXY_STATE_STATE_LOADER_H_
#define DPPROXY_PROXY_STATE_STATE_LOADER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "proxy/events/event_log.h"
#include "proxy/state/allocation_table.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/previous_generation.h"
#include "proxy/state/state.pb.h"
#include "proxy/state/state_store.h"

namespace dpproxy {

class StateLoader {
 public:
  struct Loaded {
    // The state without its allocations (the resources included).
    state::State state;
    // Every allocation: the snapshot's and the journal's records merged,
    // duplicate ids renumbered; next_allocation_id in `state` past them.
    AllocationTable allocations;
    // What was read shows damage: allocations it held may be missing.
    bool damaged = false;
    // The state is the previous generation's (the snapshot was damaged or
    // gone); without a previous snapshot, no resources are known.
    bool fell_back = false;
    // How many journal records were replayed: a fresh snapshot should
    // fold them in.
    size_t journal_records = 0;
  };

  // Each outlives the loader; `journal` is opened by Load for writing.
  StateLoader(FileStateStore* store, JournalFile* journal, PreviousGeneration* previous,
              EventLog* events)
      : store_(store), journal_(journal), previous_(previous), events_(events) {}

  absl::StatusOr<Loaded> Load();

 private:
  // Opens the journal, moving aside one that is no journal at all.
  absl::StatusOr<JournalFile::Replay> OpenJournal(Loaded* out);
  // Reports a torn tail, a journal missing beside a snapshot, damage.
  void ReportJournal(const JournalFile::Replay& replay, bool snapshot_saved, Loaded* out);
  // The snapshot is proven damaged: the state is the previous
  // generation's snapshot, the records since it and `journal`. An error,
  // and nothing loaded, when a file of that generation cannot be read (an
  // unreadable file is not proof of damage).
  absl::Status FallBack(const std::vector<state::Allocation>& journal, Loaded* out);

  FileStateStore* const store_;
  JournalFile* const journal_;
  PreviousGeneration* const previous_;
  EventLog* const events_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_STATE_LOADER_H_
