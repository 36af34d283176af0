#include "proxy/state/journal_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "proxy/common/encoding.h"
#include "proxy/common/files.h"
#include "proxy/state/state_store.h"

namespace dpproxy {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'P', 'J', 'R', 'N', 'L', '1'};
constexpr size_t kRecordHeader = 4 + 8;

absl::Status Errno(const std::string& what) {
  int err = errno;
  std::string msg = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

void MergeJournal(const std::vector<state::Allocation>& records, state::State* st);

absl::StatusOr<JournalContents> ParseJournal(const std::string& bytes) {
  JournalContents out;
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a dpproxy journal (bad magic)");
  }
  size_t pos = sizeof(kMagic);
  while (pos + kRecordHeader <= bytes.size()) {
    const uint32_t len = GetLittleEndian<uint32_t>(bytes, pos);
    const uint64_t sum = GetLittleEndian<uint64_t>(bytes, pos + 4);
    if (pos + kRecordHeader + len > bytes.size()) break;  // torn
    const char* payload = bytes.data() + pos + kRecordHeader;
    if (Fnv64(absl::string_view(payload, len)) != sum) break;  // torn
    state::Allocation a;
    if (!a.ParseFromArray(payload, static_cast<int>(len))) break;
    out.records.push_back(std::move(a));
    pos += kRecordHeader + len;
  }
  out.valid_bytes = pos;
  out.cut_bytes = bytes.size() - pos;
  return out;
}

absl::StatusOr<state::State> ReadStateDir(const std::string& dir) {
  state::State st;
  absl::StatusOr<std::string> snap = ReadFile(JoinPath(dir, "state.pb"));
  if (snap.ok()) {
    absl::StatusOr<state::State> decoded = DecodeStateFile(*snap);
    if (!decoded.ok()) {
      return absl::DataLossError(
          absl::StrCat(JoinPath(dir, "state.pb"), ": ", decoded.status().message()));
    }
    st = *std::move(decoded);
  } else if (snap.status().code() != absl::StatusCode::kNotFound) {
    return snap.status();
  }
  absl::StatusOr<std::string> journal = ReadFile(JoinPath(dir, "journal.wal"));
  if (journal.ok() && !journal->empty()) {
    absl::StatusOr<JournalContents> j = ParseJournal(*journal);
    if (!j.ok()) {
      return absl::DataLossError(
          absl::StrCat(JoinPath(dir, "journal.wal"), ": ", j.status().message()));
    }
    MergeJournal(j->records, &st);
  }
  return st;
}

void MergeJournal(const std::vector<state::Allocation>& records, state::State* st) {
  uint64_t max_id = st->next_allocation_id();
  std::set<uint64_t> known;
  for (const auto& a : st->allocations()) {
    known.insert(a.id());
    max_id = std::max<uint64_t>(max_id, a.id());
  }
  for (const auto& a : records) {
    // Records saved into a snapshot before a crash could reset the journal
    // are in both: keep one.
    if (!known.insert(a.id()).second) continue;
    *st->add_allocations() = a;
    max_id = std::max<uint64_t>(max_id, a.id());
  }
  st->set_next_allocation_id(max_id);
}

JournalFile::~JournalFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<JournalFile::Replay> JournalFile::Open() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) return Errno(absl::StrCat("open ", path_));
  absl::StatusOr<std::string> bytes = ReadFile(path_);
  if (!bytes.ok()) return bytes.status();
  Replay replay;
  if (bytes->empty()) {
    std::string magic(kMagic, sizeof(kMagic));
    if (absl::Status s = WriteAll(fd_, magic, path_); !s.ok()) return s;
    if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
    // The new file's directory entry must be durable too.
    const size_t slash = path_.rfind('/');
    if (absl::Status s = SyncDir(slash == std::string::npos ? "." : path_.substr(0, slash));
        !s.ok()) {
      return s;
    }
    size_ = magic.size();
    records_ = 0;
    return replay;
  }
  absl::StatusOr<JournalContents> contents = ParseJournal(*bytes);
  if (!contents.ok()) {
    return absl::DataLossError(absl::StrCat(path_, ": ", contents.status().message()));
  }
  replay.records = std::move(contents->records);
  replay.cut_bytes = contents->cut_bytes;
  const size_t pos = contents->valid_bytes;
  if (replay.cut_bytes > 0) {
    if (::ftruncate(fd_, static_cast<off_t>(pos)) != 0) {
      return Errno(absl::StrCat("truncate ", path_));
    }
    if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  }
  size_ = pos;
  records_ = replay.records.size();
  return replay;
}

absl::Status JournalFile::Append(const std::vector<state::Allocation>& records) {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  std::string data;
  for (const state::Allocation& a : records) {
    std::string payload;
    a.SerializeToString(&payload);
    PutLittleEndian<uint32_t>(&data, static_cast<uint32_t>(payload.size()));
    PutLittleEndian<uint64_t>(&data, Fnv64(payload));
    data += payload;
  }
  if (::lseek(fd_, static_cast<off_t>(size_), SEEK_SET) < 0) {
    return Errno(absl::StrCat("seek ", path_));
  }
  absl::Status s = WriteAll(fd_, data, path_);
  if (s.ok() && ::fdatasync(fd_) != 0) s = Errno(absl::StrCat("fdatasync ", path_));
  if (!s.ok()) {
    // Nothing of this append may survive: it was not acknowledged.
    (void)!::ftruncate(fd_, static_cast<off_t>(size_));
    return s;
  }
  size_ += data.size();
  records_ += records.size();
  return absl::OkStatus();
}

absl::Status JournalFile::Reset() {
  if (fd_ < 0) return absl::FailedPreconditionError("journal is not open");
  if (::ftruncate(fd_, static_cast<off_t>(sizeof(kMagic))) != 0) {
    return Errno(absl::StrCat("truncate ", path_));
  }
  if (::fdatasync(fd_) != 0) return Errno(absl::StrCat("fdatasync ", path_));
  size_ = sizeof(kMagic);
  records_ = 0;
  return absl::OkStatus();
}

}  // namespace dpproxy
