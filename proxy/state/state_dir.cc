#include "proxy/state/state_dir.h"

#include <limits.h>
#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proxy/state/journal_file.h"
#include "proxy/state/previous_generation.h"
#include "proxy/state/state_store.h"
#include "proxy/util/files.h"

namespace dpproxy {

absl::StatusOr<state::State> ReadStateDir(const std::string& dir) {
  StateDirReport r = InspectStateDir(dir);
  if (r.refuses_start) {
    return absl::FailedPreconditionError(r.problems.empty() ? "unusable" : r.problems[0]);
  }
  if (r.untrusted) return absl::DataLossError(r.problems.empty() ? "untrusted" : r.problems[0]);
  return std::move(r.state);
}

namespace {

// A damaged snapshot: what the previous generation gives instead.
// `what` says what is wrong with the snapshot and what dpproxy does with
// it ("is not trusted (...): dpproxy moves it aside and").
void FallBack(const std::string& snap_path, const std::string& what, StateDirReport* r) {
  const PreviousGeneration prev(snap_path);
  PreviousGeneration::Fallback f = prev.Read();
  if (!f.unreadable.ok()) {
    r->refuses_start = true;
    r->problems.push_back(absl::StrCat(
        snap_path, " needs the previous generation, which cannot be read (",
        f.unreadable.message(), "): dpproxy refuses to start"));
    return;
  }
  if (f.snapshot.has_value()) r->state = *std::move(f.snapshot);
  const int from_snapshot = r->state.allocations_size();
  MergeJournal(f.records, &r->state);
  r->problems.push_back(absl::StrCat(
      snap_path, " ", what, " falls back to ",
      f.snapshot.has_value() ? absl::StrCat(prev.snapshot_path(), " (", from_snapshot,
                                            " allocation(s))")
                             : std::string("no previous snapshot"),
      " and ", f.records.size(), " record(s) in ", prev.records_path(),
      ", then the journal; it also learns back from the kubelet what they lack"));
  for (const std::string* problem : {&f.snapshot_problem, &f.records_problem}) {
    if (!problem->empty()) {
      r->problems.push_back(absl::StrCat("the previous generation is damaged too: ", *problem));
    }
  }
}

}  // namespace

StateDirReport InspectStateDir(const std::string& dir) {
  StateDirReport r;
  const std::string snap_path = JoinPath(dir, "state.pb");
  const std::string journal_path = JoinPath(dir, "journal.wal");
  absl::StatusOr<std::string> snap = ReadOwnFile(snap_path);
  if (snap.ok()) {
    absl::StatusOr<state::State> decoded = DecodeStateFile(*snap);
    if (decoded.ok()) {
      r.state = *std::move(decoded);
    } else {
      r.untrusted = true;
      FallBack(snap_path,
               absl::StrCat("is not trusted (", decoded.status().message(),
                            "): dpproxy moves it aside and"),
               &r);
    }
  } else if (snap.status().code() == absl::StatusCode::kNotFound &&
             PreviousGeneration(snap_path).Exists()) {
    r.untrusted = true;
    FallBack(snap_path,
             "is missing while its previous generation is there (the directory was used "
             "before: this is damage, not a first start): dpproxy",
             &r);
  } else if (snap.status().code() != absl::StatusCode::kNotFound) {
    r.refuses_start = true;
    r.problems.push_back(absl::StrCat(snap.status().message(), ": dpproxy refuses to start"));
  }
  const bool snapshot_saved = snap.ok() && !r.untrusted && r.state.saved_unix_ms() != 0;
  absl::StatusOr<std::string> journal = ReadOwnFile(journal_path);
  if (journal.ok() && !journal->empty()) {
    absl::StatusOr<JournalContents> j = ParseJournal(*journal);
    if (!j.ok()) {
      r.untrusted = true;
      r.problems.push_back(absl::StrCat(journal_path, " is not trusted (", j.status().message(),
                                        "): dpproxy moves it aside and starts without it"));
    } else {
      if (j->damaged_bytes > 0) {
        r.problems.push_back(absl::StrCat(
            journal_path, " is damaged", j->header_damaged ? " (its header among them)" : "",
            ": ", j->damaged_bytes, " bad byte(s) in ", j->damaged_regions,
            " place(s) before intact records; dpproxy keeps the ", j->records.size(),
            " intact record(s), copies the file aside and rewrites it"));
      }
      if (j->cut_bytes > 0) {
        r.problems.push_back(absl::StrCat(
            journal_path, " ends in a torn record (", j->cut_bytes,
            " byte(s), never acknowledged): dpproxy cuts it at start"));
      }
      MergeJournal(j->records, &r.state);
    }
  } else if (!journal.ok() && journal.status().code() != absl::StatusCode::kNotFound) {
    r.refuses_start = true;
    r.problems.push_back(absl::StrCat(journal.status().message(), ": dpproxy refuses to start"));
  } else if (snapshot_saved) {
    r.problems.push_back(absl::StrCat(
        journal_path, " is missing or empty beside a saved snapshot: the allocations recorded "
        "since the snapshot are gone from dpproxy's copy; it learns them back from the kubelet"));
  }
  return r;
}

}  // namespace dpproxy

namespace dpproxy {
namespace {

// The state directory as one name: its canonical path where it exists.
std::string CanonicalDir(const std::string& dir) {
  char buf[PATH_MAX];
  return ::realpath(dir.c_str(), buf) != nullptr ? std::string(buf) : dir;
}

// The note's "state_dir" and "since" lines.
struct StateNote {
  std::string state_dir;
  std::string since;
};

std::optional<StateNote> ReadStateNote(const std::string& plugin_dir) {
  absl::StatusOr<std::string> text = ReadFileUpTo(JoinPath(plugin_dir, kStateNoteName), 64 << 10);
  if (!text.ok()) return std::nullopt;
  StateNote note;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, "state_dir: ")) note.state_dir = std::string(line);
    if (absl::ConsumePrefix(&line, "since: ")) note.since = std::string(line);
  }
  if (note.state_dir.empty()) return std::nullopt;
  return note;
}

}  // namespace

bool StateDirEmpty(const std::string& dir) {
  for (const char* name : {"state.pb", "journal.wal"}) {
    const std::string path = JoinPath(dir, name);
    if (PathExists(path) || PathExists(path + ".prev")) return false;
  }
  return true;
}

absl::Status NoteStateDirInUse(const std::string& plugin_dir, const std::string& state_dir) {
  const std::string dir = CanonicalDir(state_dir);
  std::optional<StateNote> note = ReadStateNote(plugin_dir);
  if (note.has_value() && note->state_dir == dir) return absl::OkStatus();
  return WriteFileAtomic(
      JoinPath(plugin_dir, kStateNoteName),
      absl::StrCat("# dpproxy: the state directory this plugin directory's dpproxy uses. If\n"
                   "# that directory is found without its files, they were lost (not a first\n"
                   "# start), and dpproxy learns back from the kubelet.\n",
                   "state_dir: ", dir, "\n", "since: ",
                   absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()), "\n"),
      0644);
}

std::optional<std::string> StateDirNotedSince(const std::string& plugin_dir,
                                              const std::string& state_dir) {
  std::optional<StateNote> note = ReadStateNote(plugin_dir);
  if (!note.has_value() || note->state_dir != CanonicalDir(state_dir)) return std::nullopt;
  return note->since.empty() ? std::string("an unknown time") : note->since;
}

}  // namespace dpproxy
