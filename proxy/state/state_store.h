// File: state_store.h
//
// Reads and writes dpproxy's state file. The file is
//
//   "DPPSTATE"                 8 bytes, magic
//   format version             uint32, little endian (kFormatVersion)
//   payload length             uint64, little endian
//   FNV-1a 64 of the payload   uint64, little endian
//   payload                    a serialized dpproxy.state.State
//
// written atomically (temporary file, fsync, rename, fsync of the
// directory): a crash leaves the old file or the new one, never a mix. A
// failed write leaves the previous file intact and is reported.
//
//   FileStateStore store("/var/lib/dpproxy/state.pb");
//   absl::StatusOr<state::State> s = store.Load();  // empty State if no file
//   if (s.status().code() == absl::StatusCode::kDataLoss) { /* moved aside */ }
#ifndef DPPROXY_PROXY_STATE_STATE_STORE_H_
#define DPPROXY_PROXY_STATE_STATE_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

inline constexpr uint32_t kStateFormatVersion = 1;

// Encodes and decodes the file format above (no I/O).
std::string EncodeStateFile(const state::State& s);
// The same from a State already serialized (possibly in parts: protobuf
// merges concatenated messages, repeated fields appended).
std::string EncodeStateFilePayload(const std::string& payload);
// The same in place: `file` holds kStateFileHeaderSize bytes of any value,
// then the payload; the header is written over them.
inline constexpr size_t kStateFileHeaderSize = 8 + 4 + 8 + 8;
void SealStateFile(std::string* file);
// Takes one `allocations` entry of a State's encoding (its bytes, which
// outlive the call only as a copy); false if they do not parse.
using AllocationSink = std::function<bool(absl::string_view wire)>;
// kDataLoss naming what is wrong: short file, bad magic, unknown format
// version, length or checksum mismatch, unparsable payload. With `take`,
// every allocation goes to it in the file's order, never parsed into the
// State returned (which holds the rest).
absl::StatusOr<state::State> DecodeStateFile(const std::string& bytes,
                                             const AllocationSink& take = nullptr);

class FileStateStore {
 public:
  explicit FileStateStore(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // The saved state; an empty State if there is no file yet. If the file is
  // proven corrupt (bad magic, format version, length, checksum) it is
  // renamed to "<path>.corrupt-<unix seconds>" and kDataLoss is returned
  // with the reason and the new name. Any other error (EIO, EMFILE, EACCES,
  // a directory or a symbolic link in its place) is kFailedPrecondition and
  // changes nothing: the caller must not start on an empty state.
  absl::StatusOr<state::State> Load(const AllocationSink& take = nullptr);

  // Atomically replaces the file. Blocks on fsync. Not thread-safe: the
  // caller serializes saves.
  absl::Status Save(const state::State& s);
  // The same with the file's bytes already encoded (EncodeStateFile), so a
  // caller can encode under its lock and write outside it.
  absl::Status SaveEncoded(const std::string& bytes);

  int64_t saves() const { return saves_.load(); }
  int64_t save_failures() const { return save_failures_.load(); }

 private:
  const std::string path_;
  std::atomic<int64_t> saves_{0};
  std::atomic<int64_t> save_failures_{0};
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_STATE_STORE_H_
