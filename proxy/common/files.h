// File: files.h
//
// Filesystem helpers on real files: Unix socket path checks, durable atomic
// writes (temporary file, fsync, rename, fsync of the directory), and the
// kubelet's start-up wipe of its plugin directory.
#ifndef DPPROXY_PROXY_COMMON_FILES_H_
#define DPPROXY_PROXY_COMMON_FILES_H_

#include <sys/types.h>

#include <cstdint>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

// sun_path holds 108 bytes including the terminating NUL.
inline constexpr size_t kMaxUnixSocketPath = 107;

// kInvalidArgument naming the path and its length if it cannot be a Unix
// socket address; also refuses empty paths.
absl::Status ValidateSocketPath(absl::string_view path);

// "unix:<path>", the gRPC target/listen address for `path`.
std::string UnixAddress(absl::string_view path);

// Joins a directory and a relative name with exactly one '/'.
std::string JoinPath(absl::string_view dir, absl::string_view name);

// Identity of a file: device, inode and change time, or nullopt if it does
// not exist. The change time matters: a socket removed and created again
// often gets the same inode number back.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileId& o) const {
    return dev == o.dev && ino == o.ino && ctime_ns == o.ctime_ns;
  }
  bool operator!=(const FileId& o) const { return !(*this == o); }
};
std::optional<FileId> StatFileId(const std::string& path);

bool PathExists(const std::string& path);

// mkdir -p, mode 0755.
absl::Status MakeDirs(const std::string& path);

// Reads a whole file. kNotFound if it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes all of `data` to `fd` (retrying short writes); errors name `path`.
absl::Status WriteAll(int fd, absl::string_view data, const std::string& path);

// fsyncs a directory, making entries created or renamed in it durable.
absl::Status SyncDir(const std::string& dir);

// Replaces `path` with `contents` so that a crash leaves either the old or the
// new file: writes `path`.tmp, fsyncs it, renames it over `path`, fsyncs the
// directory. On failure the temporary file is removed and `path` is intact.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents);

// What a kubelet does to device-plugins/ at start: removes every entry that
// is not a directory, except the names in `keep`. Returns the removed names.
absl::StatusOr<std::vector<std::string>> RemoveFilesExcept(
    const std::string& dir, const std::vector<std::string>& keep);

// Errno text, e.g. "No such file or directory".
std::string ErrnoText(int err);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_COMMON_FILES_H_
