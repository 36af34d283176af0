// File: files.h
//
// Filesystem helpers on real files: Unix socket path checks, durable atomic
// writes (temporary file, fsync, rename, fsync of the directory), and the
// kubelet's start-up wipe of its plugin directory.
#ifndef DPPROXY_PROXY_UTIL_FILES_H_
#define DPPROXY_PROXY_UTIL_FILES_H_

#include <sys/types.h>

#include <cstdint>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

// sun_path holds 108 bytes including the terminating NUL.
inline constexpr size_t kMaxUnixSocketPath = 107;

// kInvalidArgument naming the path and its length if it cannot be a Unix
// socket address; also refuses empty paths.
// An errno as a status naming `what` (ENOENT: NotFound, EACCES/EPERM:
// PermissionDenied, ENOSPC/EDQUOT: ResourceExhausted, else Internal).
absl::Status ErrnoStatus(int err, absl::string_view what);

// The directory part of `path`: "." without a slash, "/" for "/name".
std::string DirName(const std::string& path);

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

// Takes an exclusive lock (flock) on `path`, created 0600 if missing, and
// writes this process's pid into it; the lock lasts while the returned fd
// is open. A lock held elsewhere is tried again for up to `wait` (a
// previous instance may still be exiting); then kUnavailable naming the
// holder's pid. A file that cannot be opened or locked at all (a read-only
// file system, a directory in its place) is kFailedPrecondition with the
// reason.
absl::StatusOr<int> LockFile(const std::string& path, absl::Duration wait);

// Full paths of the sockets in `dir` whose names do not start with '.',
// sorted; none if `dir` cannot be read.
std::vector<std::string> ListSockets(const std::string& dir);

// True if a Unix socket at `path` accepts a connection now (a listening
// server; the connection is closed at once).
bool SocketAccepts(const std::string& path);

// mkdir -p, mode 0755.
absl::Status MakeDirs(const std::string& path);

// Reads a whole file. kNotFound if it does not exist.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Reads a whole regular file of at most `max_bytes` (symbolic links
// followed): kNotFound if it does not exist, kFailedPrecondition naming the
// path if it is not a regular file, kResourceExhausted naming its size and
// the limit if it is larger. Never reads more than `max_bytes` + 1 bytes,
// even of a file that grows meanwhile.
absl::StatusOr<std::string> ReadFileUpTo(const std::string& path, size_t max_bytes);

// The last `max_bytes` of a file (all of it when shorter): kNotFound if it
// does not exist. Reads no more than that, however large the file.
absl::StatusOr<std::string> ReadFileTail(const std::string& path, size_t max_bytes);

// Reads a whole file that must be a regular file reached without following
// a symbolic link (dpproxy's own state): kNotFound if it does not exist,
// kFailedPrecondition naming the path if it is a link, a directory or
// anything else but a regular file, kPermissionDenied/kInternal with the
// errno text for other errors (EIO, EMFILE, EACCES: never "corrupt").
absl::StatusOr<std::string> ReadOwnFile(const std::string& path);

// Opens (creating with `mode` if missing, whatever the umask) a regular
// file for appending, without following a link at `path`. Returns the fd.
absl::StatusOr<int> OpenOwnFileForAppend(const std::string& path, mode_t mode);

// Writes all of `data` to `fd` (retrying short writes); errors name `path`.
absl::Status WriteAll(int fd, absl::string_view data, const std::string& path);
// The same at `offset` (pwrite), leaving the file position alone.
absl::Status WriteAllAt(int fd, absl::string_view data, off_t offset, const std::string& path);

// fsyncs a directory, making entries created or renamed in it durable.
absl::Status SyncDir(const std::string& dir);

// Replaces `path` with `contents` so that a crash leaves either the old or the
// new file: writes a fresh temporary file beside it (`path`.tmp.XXXXXX,
// created exclusively, so a planted file or link there is never written
// through), fsyncs it, gives it `mode` (whatever the umask), renames it over
// `path` (replacing a link at `path`, never its target), fsyncs the
// directory. On failure the temporary file is removed and `path` is intact.
absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents,
                             mode_t mode = 0600);

// What a kubelet does to device-plugins/ at start, except the names in
// `keep`. Returns the removed names.
enum class Wipe {
  // Every entry that is not a directory; a link is removed, never followed
  // (kubelets up to 1.32, but 1.31.0).
  kEveryFile,
  // Only sockets, looked at through links: a link to a socket is removed
  // (the link), anything else stays, a dangling link too (1.31.0, 1.33+).
  kSocketsOnly,
};
absl::StatusOr<std::vector<std::string>> RemoveFilesExcept(
    const std::string& dir, const std::vector<std::string>& keep, Wipe wipe = Wipe::kEveryFile);

// Whether a process listens on the Unix socket at `path`: a non-blocking
// connect is refused (ECONNREFUSED) only when nobody does; a full backlog
// (EAGAIN) is someone listening too. Never blocks.
bool SomeoneListens(const std::string& path);

// What dpproxy does to its own plugin directory at start: removes stale
// Unix sockets, those nobody listens on (left by plugins that are gone),
// and nothing else: a running plugin's socket, regular files, directories
// and links are left alone, and the directory is opened without following
// a link. Returns the removed names.
absl::StatusOr<std::vector<std::string>> RemoveStaleSockets(const std::string& dir);

// The canonical absolute path of `path` (symlinks and ".." resolved). A
// path that does not exist yet is resolved through its deepest existing
// ancestor, with the missing components appended.
absl::StatusOr<std::string> ResolvePath(const std::string& path);

// The executable file a process runs (`proc`: "self" or a pid), from
// /proc/PROC/exe, without the " (deleted)" the kernel adds once the file
// was replaced on disk; nullopt if it cannot be read.
std::optional<std::string> ExecutableOf(const std::string& proc);

// True if directory `inner` is `outer` or lies below it, compared by
// identity (device and inode of each ancestor of the resolved `inner`), so
// "..", symlinks and bind mounts do not hide it. Paths that do not exist
// are compared through ResolvePath.
bool IsSameOrInside(const std::string& inner, const std::string& outer);

// Checks a directory dpproxy creates files in: it must be a directory
// (after resolving links), owned by root or by the effective user, and not
// writable by other users (who could plant files or links in it).
// kFailedPrecondition naming the directory and the problem.
absl::Status CheckOwnDirectory(const std::string& dir);

// chmod (and chown to `gid` unless it is -1) of a socket or file dpproxy
// created, without following a link.
absl::Status SetMode(const std::string& path, mode_t mode, gid_t gid = static_cast<gid_t>(-1));

// A group name or number -> gid. kInvalidArgument naming it if unknown.
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

// Errno text, e.g. "No such file or directory".
std::string ErrnoText(int err);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_FILES_H_
