#include "proxy/state/previous_generation.h"

#include <sys/stat.h>

#include <errno.h>
#include <unistd.h>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/state_store.h"
#include "proxy/util/files.h"

namespace dpproxy {

PreviousGeneration::PreviousGeneration(const std::string& snapshot)
    : dir_(DirName(snapshot)),
      newest_path_(snapshot),
      snapshot_path_(snapshot + ".prev"),
      records_path_(JoinPath(dir_, "journal.wal.prev")) {}

bool PreviousGeneration::Rotate() {
  const std::string staged = snapshot_path_ + ".tmp";
  ::unlink(staged.c_str());
  if (::link(newest_path_.c_str(), staged.c_str()) != 0) {
    if (errno != ENOENT) {
      LOG(WARNING) << "cannot keep " << newest_path_ << " as the previous generation ("
                   << ErrnoText(errno) << "); the one before it is kept";
    }
    return false;
  }
  if (::rename(staged.c_str(), snapshot_path_.c_str()) != 0) {
    LOG(WARNING) << "cannot keep " << newest_path_ << " as the previous generation ("
                 << ErrnoText(errno) << "); the one before it is kept";
    ::unlink(staged.c_str());
    return false;
  }
  return true;
}

absl::Status PreviousGeneration::KeepRecords(const std::string& record_bytes, bool rotated) {
  if (!rotated && record_bytes.empty()) return absl::OkStatus();  // nothing changes
  std::string contents;
  if (!rotated) {
    // What it held is still needed: the previous snapshot did not move.
    absl::StatusOr<std::string> old = ReadOwnFile(records_path_);
    if (old.ok() && ParseJournal(*old).ok()) contents = *std::move(old);
  }
  if (contents.empty()) {
    if (rotated && record_bytes.empty()) {
      // Nothing since the previous snapshot: no records file.
      if (::unlink(records_path_.c_str()) != 0 && errno != ENOENT) {
        return absl::InternalError(
            absl::StrCat("cannot remove ", records_path_, ": ", ErrnoText(errno)));
      }
      return absl::OkStatus();
    }
    contents = JournalFile::WithHeader(record_bytes);
  } else {
    // The records file ends at its last record: a journal's space written
    // ahead is not kept in it.
    contents += record_bytes;
  }
  return WriteFileAtomic(records_path_, contents, 0600);
}

bool PreviousGeneration::Exists() const {
  struct stat st;
  return ::lstat(snapshot_path_.c_str(), &st) == 0 || ::lstat(records_path_.c_str(), &st) == 0;
}

PreviousGeneration::Fallback PreviousGeneration::Read() const {
  Fallback out;
  absl::StatusOr<std::string> snap = ReadOwnFile(snapshot_path_);
  if (snap.ok()) {
    absl::StatusOr<state::State> decoded = DecodeStateFile(*snap);
    if (decoded.ok()) {
      out.snapshot = *std::move(decoded);
    } else {
      out.snapshot_problem = absl::StrCat(snapshot_path_, ": ", decoded.status().message());
    }
  } else if (snap.status().code() != absl::StatusCode::kNotFound) {
    out.snapshot_problem = std::string(snap.status().message());
    out.unreadable = snap.status();
  }
  absl::StatusOr<std::string> records = ReadOwnFile(records_path_);
  if (records.ok()) {
    absl::StatusOr<JournalContents> parsed = ParseJournal(*records);
    if (parsed.ok()) {
      out.records = std::move(parsed->records);
    } else {
      out.records_problem = absl::StrCat(records_path_, ": ", parsed.status().message());
    }
  } else if (records.status().code() != absl::StatusCode::kNotFound) {
    out.records_problem = std::string(records.status().message());
    if (out.unreadable.ok()) out.unreadable = records.status();
  }
  return out;
}

}  // namespace dpproxy
