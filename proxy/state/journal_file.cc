#include "proxy/state/journal_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "proxy/util/buffers.h"
#include "proxy/util/encoding.h"
#include "proxy/util/files.h"
#include "proxy/state/state_store.h"
#include <time.h>

namespace dpproxy {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'P', 'J', 'R', 'N', 'L', '1'};
constexpr size_t kRecordHeader = 4 + 8;
// The journal grows in steps of this many zero bytes, written and synced
// once, so that an append overwrites space the file already has and its
// fdatasync writes the record alone, not the file's new size.
constexpr size_t kPreallocate = 1 << 20;

absl::Status Errno(const std::string& what) {
  int err = errno;
  std::string msg = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// `count` zero bytes at `offset`, written from one block of zeros that is
// never written to, so its pages are the kernel's zero page: a buffer of
// zeros made for each step was a megabyte of fresh pages every time.
absl::Status WriteZerosAt(int fd, size_t count, off_t offset, const std::string& path) {
  static const char kZeros[64 * 1024] = {};
  while (count > 0) {
    const size_t n = std::min(count, sizeof(kZeros));
    if (absl::Status s = WriteAllAt(fd, absl::string_view(kZeros, n), offset, path); !s.ok()) {
      return s;
    }
    offset += static_cast<off_t>(n);
    count -= n;
  }
  return absl::OkStatus();
}

void AppendRecord(const state::Allocation& a, std::string* out) {
  std::string payload;
  a.SerializeToString(&payload);
  PutLittleEndian<uint32_t>(out, static_cast<uint32_t>(payload.size()));
  PutLittleEndian<uint64_t>(out, Fnv64(payload));
  *out += payload;
}

}  // namespace

namespace {

// The record at `pos`, if an intact one starts there.
bool RecordAt(const std::string& bytes, size_t pos, state::Allocation* out, size_t* size) {
  if (pos + kRecordHeader > bytes.size()) return false;
  const uint32_t len = GetLittleEndian<uint32_t>(bytes, pos);
  if (len > bytes.size() - pos - kRecordHeader) return false;
  const uint64_t sum = GetLittleEndian<uint64_t>(bytes, pos + 4);
  const char* payload = bytes.data() + pos + kRecordHeader;
  if (Fnv64(absl::string_view(payload, len)) != sum) return false;
  if (!out->ParseFromArray(payload, static_cast<int>(len))) return false;
  *size = kRecordHeader + len;
  return true;
}

}  // namespace

absl::StatusOr<JournalContents> ParseJournal(const std::string& bytes) {
  JournalContents out;
  // The zeros the file ends in: space written ahead for appends. Records
  // and torn records lie before them (a record's last byte may be a zero,
  // but it is parsed before this matters).
  size_t zeros_from = bytes.size();
  while (zeros_from > sizeof(kMagic) && bytes[zeros_from - 1] == '\0') --zeros_from;
  size_t pos = sizeof(kMagic);
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    // Each record carries its length and checksum, so it is read without
    // the header: a damaged header costs the header only. With no intact
    // record anywhere, this is not a journal.
    pos = 0;
    for (; pos < zeros_from; ++pos) {
      state::Allocation probe;
      size_t probe_size = 0;
      if (RecordAt(bytes, pos, &probe, &probe_size)) break;
    }
    if (pos >= zeros_from) return absl::DataLossError("not a dpproxy journal (bad magic)");
    out.header_damaged = true;
    out.damaged_bytes = pos;
    out.damaged_regions = 1;
  }
  while (pos < bytes.size()) {
    state::Allocation a;
    size_t size = 0;
    if (RecordAt(bytes, pos, &a, &size)) {
      out.records.push_back(std::move(a));
      pos += size;
      continue;
    }
    if (pos >= zeros_from) break;  // only space ahead from here
    // Bad bytes at `pos`. Look for an intact record further on: if there is
    // one, this is damage in the middle, not a torn tail. A false match
    // needs a 64-bit checksum to agree by chance and the bytes to parse.
    size_t next = pos + 1;
    for (; next < zeros_from; ++next) {
      state::Allocation probe;
      size_t probe_size = 0;
      if (RecordAt(bytes, next, &probe, &probe_size)) break;
    }
    if (next >= zeros_from) break;  // nothing intact after it
    out.damaged_bytes += next - pos;
    ++out.damaged_regions;
    pos = next;
  }
  out.valid_bytes = pos;
  const size_t end = std::max(zeros_from, pos);
  out.cut_bytes = end - pos;  // a torn tail
  out.preallocated_bytes = bytes.size() - end;
  return out;
}

void MergeJournal(const std::vector<state::Allocation>& records, state::State* st) {
  AllocationTable held;
  held.TakeFrom(st);
  uint64_t last_id = st->next_allocation_id();
  held.RenumberDuplicates(&last_id);
  MergeJournal(records, &held, &last_id);
  held.CopyTo(st);
  st->set_next_allocation_id(last_id);
}

namespace {

// What the journal wrote of an allocation: what a snapshot adds later (its
// response, annotations, a quarantine) is not part of it.
std::string JournalIdentity(const state::Allocation& a) {
  state::Allocation c = a;
  c.clear_response();
  c.clear_stage();
  c.clear_pod_namespace();
  c.clear_pod_name();
  c.clear_container();
  c.clear_pod_uid();
  c.clear_quarantined();
  c.clear_quarantine_reason();
  c.clear_quarantined_unix_ms();
  // A DRA claim's CDI names and spec come with its answer.
  if (c.has_claim()) {
    c.mutable_claim()->clear_cdi_ids();
    c.mutable_claim()->clear_cdi_spec();
  }
  return c.SerializeAsString();
}

}  // namespace

void MergeJournal(const std::vector<state::Allocation>& records, AllocationTable* held,
                  uint64_t* last_id) {
  uint64_t max_id = std::max(*last_id, held->max_id());
  // Only the held allocations a record may repeat are compared: a start
  // with a large state and a short journal encodes none of the rest.
  std::map<uint64_t, std::string> known;
  for (const auto& a : records) {
    max_id = std::max<uint64_t>(max_id, a.id());
    if (a.stage() == state::Allocation::ANSWERED || a.stage() == state::Allocation::WITHDRAWN) {
      continue;
    }
    if (state::Allocation h; known.count(a.id()) == 0 && held->Get(a.id(), &h)) {
      known[a.id()] = JournalIdentity(h);
    }
  }
  // Ids this merge gave a record that collided, for its answer or
  // withdrawal.
  std::map<uint64_t, uint64_t> renumbered;
  auto current = [&](uint64_t id) {
    auto r = renumbered.find(id);
    return r == renumbered.end() ? id : r->second;
  };
  for (const auto& a : records) {
    if (a.stage() == state::Allocation::ANSWERED) {
      // Its reservation may be gone: released or withdrawn in a snapshot.
      held->Update(current(a.id()), [&a](state::Allocation* h) {
        *h->mutable_response() = a.response();
        if (a.has_claim()) *h->mutable_claim() = a.claim();
        h->clear_stage();
      });
      continue;
    }
    if (a.stage() == state::Allocation::WITHDRAWN) {
      const uint64_t id = current(a.id());
      if (held->Erase(id)) known.erase(id);
      continue;
    }
    renumbered.erase(a.id());
    auto it = known.find(a.id());
    if (it != known.end()) {
      // Saved into a snapshot before a crash could reset the journal: keep
      // one. A different allocation under the same id is never dropped: it
      // gets a fresh id.
      if (it->second == JournalIdentity(a)) continue;
      state::Allocation moved = a;
      moved.set_id(++max_id);
      renumbered[a.id()] = moved.id();
      known[moved.id()] = JournalIdentity(moved);
      held->Put(moved);
      continue;
    }
    known[a.id()] = JournalIdentity(a);
    held->Put(a);
  }
  *last_id = max_id;
}

JournalFile::~JournalFile() { Close(); }

void JournalFile::Close() {
  if (fd_ < 0) return;
  // Best effort: a caller that must know syncs first (Sync).
  if (synced_ < size_) (void)!::fdatasync(fd_);
  ::close(fd_);
  fd_ = -1;
}

absl::Status JournalFile::Sync() {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  if (synced_ >= size_) return absl::OkStatus();
  const size_t through = size_;
  if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  if (sync_hook_) sync_hook_();
  synced_ = std::max(synced_, through);
  return absl::OkStatus();
}

absl::Status JournalFile::Create(Replay* replay) {
  std::string magic(kMagic, sizeof(kMagic));
  if (absl::Status s = WriteAll(fd_, magic, path_); !s.ok()) return s;
  if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  // The new file's directory entry must be durable too.
  const size_t slash = path_.rfind('/');
  if (absl::Status s = SyncDir(slash == std::string::npos ? "." : path_.substr(0, slash));
      !s.ok()) {
    return s;
  }
  size_ = allocated_ = synced_ = magic.size();
  records_ = 0;
  replay->created = true;
  return absl::OkStatus();
}

absl::Status JournalFile::RewriteIntact(const std::string& bytes, Replay* replay) {
  replay->damaged_copy = absl::StrCat(path_, ".damaged-", ::time(nullptr));
  if (absl::Status w = WriteFileAtomic(replay->damaged_copy, bytes, 0600); !w.ok()) return w;
  std::string clean(kMagic, sizeof(kMagic));
  for (const state::Allocation& a : replay->records) AppendRecord(a, &clean);
  if (absl::Status w = WriteFileAtomic(path_, clean, 0600); !w.ok()) return w;
  ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) return Errno(absl::StrCat("open ", path_));
  size_ = allocated_ = synced_ = clean.size();
  records_ = replay->records.size();
  replay->cut_bytes = 0;
  return absl::OkStatus();
}

absl::StatusOr<JournalFile::Replay> JournalFile::Open() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          path_, " is a symbolic link; dpproxy does not follow links in its state directory"));
    }
    return Errno(absl::StrCat("open ", path_));
  }
  absl::StatusOr<std::string> bytes = ReadOwnFile(path_);
  if (!bytes.ok()) {
    ::close(fd_);
    fd_ = -1;
    return bytes.status();
  }
  Replay replay;
  if (bytes->empty()) {
    if (absl::Status s = Create(&replay); !s.ok()) return s;
    return replay;
  }
  absl::StatusOr<JournalContents> contents = ParseJournal(*bytes);
  if (!contents.ok()) {
    return absl::DataLossError(absl::StrCat(path_, ": ", contents.status().message()));
  }
  replay.records = std::move(contents->records);
  replay.cut_bytes = contents->cut_bytes;
  replay.damaged_bytes = contents->damaged_bytes;
  replay.damaged_regions = contents->damaged_regions;
  replay.header_damaged = contents->header_damaged;
  if (replay.damaged_bytes > 0) {
    // Keep the damaged file for inspection, then rewrite the journal with
    // the intact records only, so appends never follow bad bytes.
    if (absl::Status s = RewriteIntact(*bytes, &replay); !s.ok()) return s;
    return replay;
  }
  const size_t pos = contents->valid_bytes;
  if (replay.cut_bytes > 0) {
    if (::ftruncate(fd_, static_cast<off_t>(pos)) != 0) {
      return Errno(absl::StrCat("truncate ", path_));
    }
    if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  }
  size_ = pos;
  // A dpproxy killed after writing answers may have left them unsynced:
  // the first sync covers them.
  synced_ = 0;
  allocated_ = replay.cut_bytes > 0 ? pos : pos + contents->preallocated_bytes;
  records_ = replay.records.size();
  return replay;
}

std::string JournalFile::Encode(const std::vector<state::Allocation>& records) {
  std::string data;
  for (const state::Allocation& a : records) AppendRecord(a, &data);
  return data;
}

absl::string_view JournalFile::EncodedPayload(absl::string_view encoded, size_t* pos) {
  const uint32_t len = GetLittleEndian<uint32_t>(encoded, *pos);
  const absl::string_view payload = encoded.substr(*pos + kRecordHeader, len);
  *pos += kRecordHeader + len;
  return payload;
}

absl::Status JournalFile::Append(const std::vector<state::Allocation>& records) {
  return AppendEncoded(Encode(records), records.size());
}

absl::Status JournalFile::AppendEncoded(const std::string& data, size_t count, Durability d) {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  const size_t end = size_ + data.size();
  absl::Status s = WriteAllAt(fd_, data, static_cast<off_t>(size_), path_);
  if (s.ok() && end > allocated_) {
    // Space ahead for the next appends: zeros after the record, written
    // (not fallocate'd: unwritten extents would make every later fdatasync
    // convert them, metadata again) and synced with it. Only ever past the
    // record, and a disk too full for them still takes the record alone.
    const size_t ahead = (end + kPreallocate - 1) / kPreallocate * kPreallocate + kPreallocate;
    if (WriteZerosAt(fd_, ahead - end, static_cast<off_t>(end), path_).ok()) {
      allocated_ = ahead;
    } else if (::ftruncate(fd_, static_cast<off_t>(end)) == 0) {
      allocated_ = end;
    } else {
      s = Errno(absl::StrCat("truncate ", path_));
    }
  }
  if (s.ok() && d == Durability::kSynced) {
    if (::fdatasync(fd_) != 0) {
      s = Errno(absl::StrCat("fdatasync ", path_));
    } else if (sync_hook_) {
      sync_hook_();
    }
  }
  if (!s.ok()) {
    // Nothing of this append may survive: it was not acknowledged. (The
    // space written ahead goes with it; the next append writes it again.)
    (void)!::ftruncate(fd_, static_cast<off_t>(size_));
    allocated_ = size_;
    return s;
  }
  size_ = end;
  if (d == Durability::kSynced) synced_ = end;
  records_ += count;
  return absl::OkStatus();
}

absl::StatusOr<std::string> JournalFile::RecordBytes(size_t offset) const {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  // Not size_: appends may move it meanwhile; the bytes before `offset`
  // were written before it was taken.
  if (offset <= sizeof(kMagic)) return std::string();
  std::string out;
  ReserveMapped(&out, offset - sizeof(kMagic));
  out.resize(offset - sizeof(kMagic));
  ssize_t n = ::pread(fd_, out.data(), out.size(), static_cast<off_t>(sizeof(kMagic)));
  if (n != static_cast<ssize_t>(out.size())) {
    return n < 0 ? Errno(absl::StrCat("read ", path_))
                 : absl::DataLossError(absl::StrCat(path_, " is shorter than dpproxy wrote it"));
  }
  return out;
}

std::string JournalFile::WithHeader(const std::string& record_bytes) {
  std::string out;
  ReserveMapped(&out, sizeof(kMagic) + record_bytes.size());
  out.assign(kMagic, sizeof(kMagic));
  out += record_bytes;
  return out;
}

absl::Status JournalFile::DropFront(size_t offset, size_t count) {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  if (offset >= size_) return Reset();
  if (offset <= sizeof(kMagic)) return absl::OkStatus();
  // Records after `offset` are not in the snapshot yet: a new file holds
  // them alone, and replaces this one atomically (a crash leaves either
  // file, and the snapshot covers what the new one lacks).
  std::string tail(size_ - offset, '\0');
  ssize_t n = ::pread(fd_, tail.data(), tail.size(), static_cast<off_t>(offset));
  if (n != static_cast<ssize_t>(tail.size())) {
    return n < 0 ? Errno(absl::StrCat("read ", path_))
                 : absl::DataLossError(absl::StrCat(path_, " is shorter than dpproxy wrote it"));
  }
  std::string contents(kMagic, sizeof(kMagic));
  contents += tail;
  if (absl::Status w = WriteFileAtomic(path_, contents, 0600); !w.ok()) return w;
  const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Errno(absl::StrCat("open ", path_));
  ::close(fd_);
  fd_ = fd;
  size_ = allocated_ = synced_ = contents.size();
  records_ = count <= records_ ? records_ - count : 0;
  return absl::OkStatus();
}

absl::Status JournalFile::Reset() {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  if (::ftruncate(fd_, static_cast<off_t>(sizeof(kMagic))) != 0) {
    return Errno(absl::StrCat("truncate ", path_));
  }
  if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  // Cut, not zeroed in place: records after the end would be replayed.
  size_ = allocated_ = synced_ = sizeof(kMagic);
  records_ = 0;
  return absl::OkStatus();
}

}  // namespace dpproxy
