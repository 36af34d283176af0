#include "proxy/state/state_store.h"

#include <stdio.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/encoding.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'P', 'S', 'T', 'A', 'T', 'E'};
constexpr size_t kHeaderSize = 8 + 4 + 8 + 8;

}  // namespace

std::string EncodeStateFile(const state::State& s) {
  std::string payload;
  s.SerializeToString(&payload);
  return EncodeStateFilePayload(payload);
}

std::string EncodeStateFilePayload(const std::string& payload) {
  std::string out(kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(&out, kStateFormatVersion);
  PutLittleEndian<uint64_t>(&out, payload.size());
  PutLittleEndian<uint64_t>(&out, Fnv64(payload));
  out += payload;
  return out;
}

absl::StatusOr<state::State> DecodeStateFile(const std::string& bytes) {
  if (bytes.size() < kHeaderSize) {
    return absl::DataLossError(absl::StrCat("truncated: ", bytes.size(),
                                            " bytes, shorter than the ", kHeaderSize,
                                            "-byte header"));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a dpproxy state file (bad magic)");
  }
  const uint32_t version = GetLittleEndian<uint32_t>(bytes, 8);
  if (version != kStateFormatVersion) {
    return absl::DataLossError(absl::StrCat("unknown format version ", version,
                                            " (this dpproxy reads version ",
                                            kStateFormatVersion, ")"));
  }
  const uint64_t length = GetLittleEndian<uint64_t>(bytes, 12);
  if (length != bytes.size() - kHeaderSize) {
    return absl::DataLossError(absl::StrCat("truncated or padded: header says ", length,
                                            " payload bytes, file has ",
                                            bytes.size() - kHeaderSize));
  }
  const std::string payload = bytes.substr(kHeaderSize);
  if (Fnv64(payload) != GetLittleEndian<uint64_t>(bytes, 20)) {
    return absl::DataLossError("checksum mismatch");
  }
  state::State s;
  if (!s.ParseFromString(payload)) {
    return absl::DataLossError("checksum matches but the payload does not parse");
  }
  return s;
}

absl::StatusOr<state::State> FileStateStore::Load() {
  absl::StatusOr<std::string> bytes = ReadOwnFile(path_);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kNotFound) return state::State();
    // Not proven corrupt (EIO, EMFILE, EACCES, a directory or a link in its
    // place): the file may be fine, so it is neither moved nor replaced.
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read the state file: ", bytes.status().message(),
        "; it is left as it is (only a file proven corrupt is moved aside)"));
  }
  absl::StatusOr<state::State> s = DecodeStateFile(*bytes);
  if (s.ok()) return s;
  const std::string aside =
      absl::StrCat(path_, ".corrupt-", absl::ToUnixSeconds(absl::Now()));
  std::string where;
  if (::rename(path_.c_str(), aside.c_str()) == 0) {
    where = absl::StrCat("moved aside to ", aside);
  } else {
    where = absl::StrCat("could not be moved aside: ", ErrnoText(errno));
  }
  return absl::DataLossError(
      absl::StrCat("state file ", path_, " is not trusted (", s.status().message(), "); ",
                   where, "; starting without it"));
}

absl::Status FileStateStore::Save(const state::State& s) { return SaveEncoded(EncodeStateFile(s)); }

absl::Status FileStateStore::SaveEncoded(const std::string& bytes) {
  absl::Status st = WriteFileAtomic(path_, bytes, 0600);
  if (st.ok()) {
    ++saves_;
  } else {
    ++save_failures_;
  }
  return st;
}

}  // namespace dpproxy
