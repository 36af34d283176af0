// File: snapshot_files.h
//
// The snapshot (state_store.h) and its previous generation
// (previous_generation.h), written together as the first steps of a save:
// the newest snapshot becomes the previous one, the new one is written, and
// the journal records it took in are kept beside the previous one before
// the journal may drop them. Not thread-safe: the keeper's savers take
// turns (save_mu_).
#ifndef DPPROXY_PROXY_STATE_SNAPSHOT_FILES_H_
#define DPPROXY_PROXY_STATE_SNAPSHOT_FILES_H_

#include <stddef.h>

#include <string>

#include "absl/status/status.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/previous_generation.h"
#include "proxy/state/state_store.h"

namespace dpproxy {

class SnapshotFiles {
 public:
  // `path`: the snapshot (<state_dir>/state.pb).
  explicit SnapshotFiles(const std::string& path) : store_(path), previous_(path) {}

  FileStateStore* store() { return &store_; }
  PreviousGeneration* previous() { return &previous_; }
  const std::string& path() const { return store_.path(); }

  struct Saved {
    absl::Status snapshot;  // the new snapshot's write
    absl::Status previous;  // keeping the records it took in (logged)
    // The journal may drop the records the snapshot covers.
    bool ok() const { return snapshot.ok() && previous.ok(); }
  };
  // Seals `file` (its first kStateFileHeaderSize bytes reserved) and writes
  // it as the newest snapshot. The records it took in, those of `journal`
  // before `covered_bytes` (`covered_records` of them; `journal` null:
  // none), are kept in the previous generation. They lie where appends
  // never write, so the journal is read while records go on being appended.
  Saved Write(std::string* file, const JournalFile* journal, size_t covered_bytes,
              size_t covered_records);

 private:
  FileStateStore store_;
  PreviousGeneration previous_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_SNAPSHOT_FILES_H_
