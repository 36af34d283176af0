// File: previous_generation.h
//
// The state's previous generation, so that a damaged snapshot is not the
// only copy of what it held. Beside the snapshot (state.pb) and the journal
// (journal.wal), a state directory keeps:
//
//   state.pb.prev      the snapshot before the newest one (a hard link to
//                      the file the newest replaced);
//   journal.wal.prev   the journal records the newest snapshot took in
//                      since that one, in the journal's format.
//
// Together they hold every allocation the newest snapshot holds, so a
// newest snapshot proven damaged falls back to
//   state.pb.prev + journal.wal.prev + journal.wal
// and loses no acknowledged allocation. Allocations released in between
// come back held: the reconciler releases them again once it finds their
// pods gone, so the fallback errs on keeping devices, never on handing one
// out twice.
//
// The pair stays consistent across a crash at any point of a save:
//   1. Rotate(): state.pb is linked to state.pb.prev (link, rename);
//   2. the new state.pb is written (temporary file, fsync, rename);
//   3. KeepRecords(): journal.wal.prev is replaced by the records the new
//      snapshot took in, or, when nothing was rotated (no state.pb before
//      it: a first save, or one after a fallback), extended by them;
//   4. the journal drops those records.
// A crash before 3 leaves the old records file, whose records the
// journal still holds; a crash between 3 and 4 holds them twice, and a
// load keeps one of each.
//
//   PreviousGeneration prev("/var/lib/dpproxy/state.pb");
//   const bool rotated = prev.Rotate();
//   ... save state.pb ...
//   prev.KeepRecords(journal.RecordBytes(covered), rotated);
#ifndef DPPROXY_PROXY_STATE_PREVIOUS_GENERATION_H_
#define DPPROXY_PROXY_STATE_PREVIOUS_GENERATION_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

class PreviousGeneration {
 public:
  // `snapshot`: the newest snapshot's path (<state_dir>/state.pb).
  explicit PreviousGeneration(const std::string& snapshot);

  const std::string& snapshot_path() const { return snapshot_path_; }
  const std::string& records_path() const { return records_path_; }

  // The newest snapshot becomes the previous one, before it is replaced.
  // False if there is none, or it could not be linked (logged): then the
  // previous generation stays as it was.
  bool Rotate();
  // The records (JournalFile::RecordBytes) the newest snapshot took in
  // since the previous one: they replace the records file if `rotated`,
  // and are added to it otherwise. Synced before the journal drops them.
  absl::Status KeepRecords(const std::string& record_bytes, bool rotated);

  // What a damaged newest snapshot falls back to, read only.
  struct Fallback {
    std::optional<state::State> snapshot;  // nullopt: none, or damaged
    std::string snapshot_problem;          // why not, if there was a file
    std::vector<state::Allocation> records;
    std::string records_problem;           // a records file that is not one
    // A file that is there and cannot be read (EIO, permissions, a
    // directory or a link in its place): not proof of damage, so nothing
    // may be started on without it. OK otherwise.
    absl::Status unreadable;
  };
  Fallback Read() const;
  // Whether either file of the previous generation is there: the state
  // directory was used, and saved in, before (a snapshot missing beside it
  // is damage, not a first start).
  bool Exists() const;

 private:
  const std::string dir_;
  const std::string newest_path_;
  const std::string snapshot_path_;
  const std::string records_path_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_PREVIOUS_GENERATION_H_
