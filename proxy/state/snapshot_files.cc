#include "proxy/state/snapshot_files.h"

#include <glog/logging.h>

#include "absl/status/statusor.h"

namespace dpproxy {

SnapshotFiles::Saved SnapshotFiles::Write(std::string* file, const JournalFile* journal,
                                          size_t covered_bytes, size_t covered_records) {
  SealStateFile(file);
  Saved out;
  const bool rotated = previous_.Rotate();
  out.snapshot = store_.SaveEncoded(*file);
  if (!out.snapshot.ok()) return out;
  if (journal != nullptr && covered_records > 0) {
    absl::StatusOr<std::string> taken_in = journal->RecordBytes(covered_bytes);
    out.previous =
        taken_in.ok() ? previous_.KeepRecords(*taken_in, rotated) : taken_in.status();
  } else if (rotated) {
    // Nothing taken in since the snapshot that is the previous one now.
    out.previous = previous_.KeepRecords("", true);
  }
  if (!out.previous.ok()) {
    LOG(WARNING) << "cannot keep the previous generation of the state ("
                 << previous_.records_path() << "): " << out.previous.message()
                 << "; the journal keeps those records until the next save";
  }
  return out;
}

}  // namespace dpproxy
