#include "proxy/state/journal_file.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "proxy/common/files.h"
#include "proxy/state/state_store.h"

namespace dpproxy {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'P', 'J', 'R', 'N', 'L', '1'};
constexpr size_t kRecordHeader = 4 + 8;

uint64_t Fnv64(const char* data, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ULL;
  }
  return h;
}

template <typename T>
void PutLe(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <typename T>
T GetLe(const std::string& in, size_t pos) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  }
  return v;
}

absl::Status Errno(const std::string& what) {
  int err = errno;
  std::string msg = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(absl::StrCat("write ", path));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
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
    const uint32_t len = GetLe<uint32_t>(bytes, pos);
    const uint64_t sum = GetLe<uint64_t>(bytes, pos + 4);
    if (pos + kRecordHeader + len > bytes.size()) break;  // torn
    const char* payload = bytes.data() + pos + kRecordHeader;
    if (Fnv64(payload, len) != sum) break;  // torn
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
    const std::string dir = path_.substr(0, path_.rfind('/') == std::string::npos ? 0 : path_.rfind('/'));
    int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
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
    PutLe<uint32_t>(&data, static_cast<uint32_t>(payload.size()));
    PutLe<uint64_t>(&data, Fnv64(payload.data(), payload.size()));
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
