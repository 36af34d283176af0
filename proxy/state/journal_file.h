// File: journal_file.h
//
// An append-only log of allocation records beside the state snapshot
// (<state_dir>/journal.wal), so that recording an allocation costs one small
// write and one fdatasync instead of rewriting the snapshot:
//
//   "DPPJRNL1"                       8 bytes, magic and format version 1
//   records: uint32 payload length, uint64 FNV-1a 64 of the payload,
//            payload (a serialized dpproxy.state.Allocation)
//   zeros:   space written ahead, 1 MiB at a time, that appends overwrite
//            (so an fdatasync writes the record, not the file's size)
//
// What holds a device (a WHOLE or RESERVED record) is acknowledged only
// after fdatasync returns. An ANSWERED or WITHDRAWN record is acknowledged
// once written, before its sync (the next append's or its own): a dpproxy
// crash keeps it (the page cache does), a power loss within that sync may
// not. Replay tells two kinds of bad bytes apart:
//   - a torn tail: bad bytes with no intact record after them, the last
//     append interrupted by a crash. Cut; no reservation acknowledged is
//     lost (an answer's response may be).
//   - damage in the middle: bad bytes followed by intact records (a bad
//     disk, a stray write). Every intact record is kept, the damaged file is
//     kept aside for inspection, and the damage is reported. A damaged
//     magic is damage like any other: each record carries its length and
//     checksum, so the records behind it are read without it.
#ifndef DPPROXY_PROXY_STATE_JOURNAL_FILE_H_
#define DPPROXY_PROXY_STATE_JOURNAL_FILE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proxy/state/allocation_table.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

struct JournalContents {
  std::vector<state::Allocation> records;
  size_t valid_bytes = 0;    // through the last intact record
  size_t cut_bytes = 0;      // torn tail after it
  // Zeros after it, to the end: space written ahead for appends (not torn).
  size_t preallocated_bytes = 0;
  // Bad bytes before the last intact record (damage in the middle), and in
  // how many separate places.
  size_t damaged_bytes = 0;
  int damaged_regions = 0;
  // The magic was damaged and intact records follow it: they are kept
  // (each record is read alone), and the header counts as damage.
  bool header_damaged = false;
};

// Parses journal bytes without touching any file. kDataLoss on a bad magic
// with no intact record after it.
absl::StatusOr<JournalContents> ParseJournal(const std::string& bytes);

// Adds journal records to a snapshot's allocations, skipping ids already
// there, and advances next_allocation_id.
void MergeJournal(const std::vector<state::Allocation>& records, state::State* st);
// The same with the snapshot's allocations in `held` and its
// next_allocation_id in `*last_id`.
void MergeJournal(const std::vector<state::Allocation>& records, AllocationTable* held,
                  uint64_t* last_id);

class JournalFile {
 public:
  explicit JournalFile(std::string path) : path_(std::move(path)) {}
  ~JournalFile();

  struct Replay {
    std::vector<state::Allocation> records;
    // Bytes cut from the end (a torn, never acknowledged record); 0 if none.
    size_t cut_bytes = 0;
    // Damage in the middle: bad bytes between intact records. The file was
    // copied to `damaged_copy` and rewritten with the intact records only.
    size_t damaged_bytes = 0;
    int damaged_regions = 0;
    std::string damaged_copy;
    bool header_damaged = false;  // the magic, counted in damaged_bytes
    bool created = false;         // the file was missing or empty
  };

  // Opens (creating if needed, mode 0600, never through a link) and reads
  // every intact record, cutting a torn tail and rewriting around damage in
  // the middle. kDataLoss if the file exists but is not a journal (bad
  // magic); any other error (EIO, EROFS, a directory in its place) is
  // returned as it is: the journal is then not usable and nothing is
  // changed.
  absl::StatusOr<Replay> Open();

  // Whether an append returns after its fdatasync (kSynced) or after its
  // write (kWritten: a later Sync, or the next synced append, makes it
  // durable).
  enum class Durability { kSynced, kWritten };

  // Appends the records and syncs; on failure the file is cut back to where
  // it was and nothing is recorded.
  absl::Status Append(const std::vector<state::Allocation>& records);
  // The same with the records already encoded (Encode), so a caller can
  // encode under its lock and write without it; `count` records.
  static std::string Encode(const std::vector<state::Allocation>& records);
  // The encoding of the allocation in the record at `*pos` of what Encode
  // returned; `*pos` moves to the next record.
  static absl::string_view EncodedPayload(absl::string_view encoded, size_t* pos);
  absl::Status AppendEncoded(const std::string& data, size_t count,
                             Durability d = Durability::kSynced);
  // Makes every append durable (fdatasync), if one is not yet. A failure
  // cuts nothing: the records were acknowledged once written.
  absl::Status Sync();

  // The bytes of the records before file offset `offset` (size() when
  // they were appended), without the header: what DropFront(offset, ...)
  // would forget. Safe beside appends (they write after `offset`), not
  // beside DropFront or Open.
  absl::StatusOr<std::string> RecordBytes(size_t offset) const;
  // A journal file's contents made of record bytes (RecordBytes): the
  // header, then them.
  static std::string WithHeader(const std::string& record_bytes);

  // Forgets the first `count` records, which end at file offset `offset`
  // (size() when they were appended), after they went into a saved
  // snapshot. Records appended after them are kept.
  absl::Status DropFront(size_t offset, size_t count);

  // Empties the journal (after its records went into a saved snapshot).
  absl::Status Reset();

  // Syncs what is not yet synced and closes the file; appends fail after.
  void Close();

  // For tests: called right after each fdatasync of the journal returns
  // OK (what a power loss would leave is the file as it is then).
  void SetSyncHook(std::function<void()> hook) { sync_hook_ = std::move(hook); }

  // Whether Open succeeded and Close has not been called since.
  bool is_open() const { return fd_ >= 0; }
  size_t records() const { return records_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  // Open's two ways besides a plain replay: a new file (the magic, synced
  // with its directory entry), and a damaged one kept aside as
  // <path>.damaged-<time> and rewritten with its intact records.
  absl::Status Create(Replay* replay);
  absl::Status RewriteIntact(const std::string& bytes, Replay* replay);
  const std::string path_;
  int fd_ = -1;
  size_t size_ = 0;       // through the last record
  size_t allocated_ = 0;  // the file's size: size_ and zeros written ahead
  size_t synced_ = 0;     // through the last record known durable
  std::function<void()> sync_hook_;
  size_t records_ = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_JOURNAL_FILE_H_
