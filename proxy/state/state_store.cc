#include "proxy/state/state_store.h"

#include <stdio.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/encoding.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

constexpr char kMagic[8] = {'D', 'P', 'P', 'S', 'T', 'A', 'T', 'E'};
constexpr size_t kHeaderSize = kStateFileHeaderSize;

// A top-level field of a State's encoding: where it lies, and where an
// `allocations` entry's own bytes lie.
struct TopField {
  size_t begin = 0, end = 0;
  bool allocation = false;
  size_t value_begin = 0;
};

// Reads a varint of at most `max_bytes` bytes at `*pos`, minimally encoded.
bool ReadPlainVarint(absl::string_view in, size_t* pos, int max_bytes, uint64_t* out) {
  uint64_t v = 0;
  for (int i = 0; i < max_bytes && *pos < in.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      if (i > 0 && b == 0) return false;  // not minimal
      *out = v;
      return true;
    }
  }
  return false;
}

// The top-level fields of `payload`, if each is framed the way protobuf
// itself writes: minimal tags and lengths, no groups, nothing cut short.
// Anything else (which protobuf's parser may read or refuse by rules of
// its own) is left to that parser: false.
bool SplitPlainFields(absl::string_view payload, std::vector<TopField>* out) {
  constexpr uint64_t kAllocationsTag = (state::State::kAllocationsFieldNumber << 3) | 2;
  size_t pos = 0;
  while (pos < payload.size()) {
    TopField f;
    f.begin = pos;
    uint64_t tag = 0;
    if (!ReadPlainVarint(payload, &pos, 5, &tag) || tag > 0xffffffffu || (tag >> 3) == 0) {
      return false;
    }
    uint64_t n = 0;
    switch (tag & 7) {
      case 0:
        if (!ReadPlainVarint(payload, &pos, 10, &n)) return false;
        break;
      case 1:
      case 5:
        n = (tag & 7) == 1 ? 8 : 4;
        if (payload.size() - pos < n) return false;
        pos += n;
        break;
      case 2:
        if (!ReadPlainVarint(payload, &pos, 5, &n) || n > 0x7fffffff ||
            payload.size() - pos < n) {
          return false;
        }
        f.allocation = tag == kAllocationsTag;
        f.value_begin = pos;
        pos += n;
        break;
      default:  // groups, and wire types that do not exist
        return false;
    }
    f.end = pos;
    out->push_back(f);
  }
  return true;
}

// Parses a State's encoding into `out`, each `allocations` entry going to
// `take` instead, in order. The rest is parsed by protobuf, as are the
// allocations (by `take`): what it refuses whole is refused.
bool ParseTakingAllocations(absl::string_view payload, const AllocationSink& take,
                            state::State* out) {
  std::vector<TopField> fields;
  if (!SplitPlainFields(payload, &fields)) {
    // Framed in a way protobuf never writes: read whole, then handed over.
    if (!out->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return false;
    for (const state::Allocation& a : out->allocations()) {
      if (!take(a.SerializeAsString())) return false;
    }
    out->clear_allocations();
    return true;
  }
  std::string rest;
  for (const TopField& f : fields) {
    if (!f.allocation) {
      rest.append(payload.data() + f.begin, f.end - f.begin);
    } else if (!take(payload.substr(f.value_begin, f.end - f.value_begin))) {
      return false;
    }
  }
  return out->ParseFromString(rest);
}

}  // namespace

std::string EncodeStateFile(const state::State& s) {
  std::string payload;
  s.SerializeToString(&payload);
  return EncodeStateFilePayload(payload);
}

std::string EncodeStateFilePayload(const std::string& payload) {
  std::string out(kHeaderSize, '\0');
  out += payload;
  SealStateFile(&out);
  return out;
}

void SealStateFile(std::string* file) {
  const absl::string_view payload = absl::string_view(*file).substr(kHeaderSize);
  std::string head(kMagic, sizeof(kMagic));
  PutLittleEndian<uint32_t>(&head, kStateFormatVersion);
  PutLittleEndian<uint64_t>(&head, payload.size());
  PutLittleEndian<uint64_t>(&head, Fnv64(payload));
  file->replace(0, kHeaderSize, head);
}

absl::StatusOr<state::State> DecodeStateFile(const std::string& bytes,
                                             const AllocationSink& take) {
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
  const absl::string_view payload = absl::string_view(bytes).substr(kHeaderSize);
  if (Fnv64(payload) != GetLittleEndian<uint64_t>(bytes, 20)) {
    return absl::DataLossError("checksum mismatch");
  }
  state::State s;
  if (take != nullptr ? !ParseTakingAllocations(payload, take, &s)
                      : !s.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("checksum matches but the payload does not parse");
  }
  return s;
}

absl::StatusOr<state::State> FileStateStore::Load(const AllocationSink& take) {
  absl::StatusOr<std::string> bytes = ReadOwnFile(path_);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kNotFound) return state::State();
    // Not proven corrupt (EIO, EMFILE, EACCES, a directory or a link in its
    // place): the file may be fine, so it is neither moved nor replaced.
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read the state file: ", bytes.status().message(),
        "; it is left as it is (only a file proven corrupt is moved aside)"));
  }
  absl::StatusOr<state::State> s = DecodeStateFile(*bytes, take);
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
