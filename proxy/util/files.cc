#include "proxy/util/files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace dpproxy {
namespace {

// The size of the regular file open at `fd`; otherwise closes `fd` and
// says what `path` is instead (`hint` appended).
absl::StatusOr<uint64_t> RegularFileSize(int fd, const std::string& path,
                                         absl::string_view hint) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        path, S_ISDIR(st.st_mode) ? " is not a regular file but a directory" : " is not a regular file",
        hint));
  }
  return static_cast<uint64_t>(st.st_size);
}

// Reads `fd` to the end, or to `limit` + 1 bytes, and closes it; errors
// name `path`.
absl::StatusOr<std::string> ReadAndClose(int fd, const std::string& path,
                                         size_t limit = std::string::npos) {
  std::string out;
  char buf[65536];
  for (;;) {
    size_t want = sizeof(buf);
    if (limit != std::string::npos) {
      if (out.size() > limit) break;
      want = std::min(want, limit + 1 - out.size());
    }
    ssize_t n = ::read(fd, buf, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", ErrnoText(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status WriteAllAt(int fd, absl::string_view data, off_t offset, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  absl::Status s;
  if (::fsync(dfd) != 0) s = ErrnoStatus(errno, absl::StrCat("fsync directory ", dir));
  ::close(dfd);
  return s;
}

std::string ErrnoText(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

absl::Status ValidateSocketPath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("socket path is empty");
  if (path.size() > kMaxUnixSocketPath) {
    return absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is ", path.size(),
        " bytes long; a Unix socket path may be at most ", kMaxUnixSocketPath,
        " bytes (choose a shorter directory)"));
  }
  return absl::OkStatus();
}

std::string UnixAddress(absl::string_view path) {
  return absl::StrCat("unix:", path);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  absl::string_view d = dir;
  while (d.size() > 1 && d.back() == '/') d.remove_suffix(1);
  absl::string_view n = name;
  while (!n.empty() && n.front() == '/') n.remove_prefix(1);
  if (d == "/") return absl::StrCat("/", n);
  return absl::StrCat(d, "/", n);
}

std::optional<FileId> StatFileId(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino,
                static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<int> LockFile(const std::string& path, absl::Duration wait) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", path, ": ",
                                                      ErrnoText(errno)));
  }
  const absl::Time deadline = absl::Now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat("cannot lock ", path, ": ",
                                                        ErrnoText(err)));
    }
    if (absl::Now() >= deadline) {
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
      std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
      while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
      ::close(fd);
      return absl::UnavailableError(absl::StrCat(
          path, " is locked by another process",
          holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"), " after waiting ",
          absl::FormatDuration(wait)));
    }
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid; only the message of a second
    // instance is poorer.
  }
  return fd;
}

std::vector<std::string> ListSockets(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code type_ec;  // a file gone meanwhile is simply not listed
    if (e.symlink_status(type_ec).type() == std::filesystem::file_type::socket) {
      out.push_back(JoinPath(dir, name));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool SocketAccepts(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

absl::Status MakeDirs(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("directory path is empty");
  // Each missing component with mkdir(0755) (less the umask): not
  // std::filesystem::create_directories, which makes them 0777 less the
  // umask, world-writable under umask 000.
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("mkdir ", partial));
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  return ReadAndClose(fd, path);
}

absl::StatusOr<std::string> ReadFileUpTo(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  absl::StatusOr<uint64_t> size = RegularFileSize(fd, path, "");
  if (!size.ok()) return size.status();
  auto too_large = [&](uint64_t size) {
    return absl::ResourceExhaustedError(absl::StrCat(path, " is ", size,
                                                     " bytes, more than the limit of ",
                                                     max_bytes, " bytes"));
  };
  if (*size > max_bytes) {
    ::close(fd);
    return too_large(*size);
  }
  absl::StatusOr<std::string> out = ReadAndClose(fd, path, max_bytes);
  if (out.ok() && out->size() > max_bytes) return too_large(out->size());
  return out;
}

absl::StatusOr<std::string> ReadFileTail(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) > max_bytes &&
      ::lseek(fd, st.st_size - static_cast<off_t>(max_bytes), SEEK_SET) < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat("seek in ", path));
  }
  absl::StatusOr<std::string> out = ReadAndClose(fd, path, max_bytes);
  if (out.ok() && out->size() > max_bytes) out->erase(0, out->size() - max_bytes);
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view contents,
                             mode_t mode) {
  std::string tmp = absl::StrCat(path, ".tmp.XXXXXX");
  // mkostemp creates the file with O_EXCL: a planted file or link at the
  // temporary name makes it pick another name, never write through it.
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("create a temporary file beside ", path));
  absl::Status s = WriteAll(fd, contents, tmp);
  if (s.ok() && ::fchmod(fd, mode) != 0) s = ErrnoStatus(errno, absl::StrCat("chmod ", tmp));
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoStatus(errno, absl::StrCat("fsync ", tmp));
  if (::close(fd) != 0 && s.ok()) s = ErrnoStatus(errno, absl::StrCat("close ", tmp));
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " to ", path));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return SyncDir(DirName(path));
}

absl::StatusOr<std::string> ReadOwnFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is a symbolic link; dpproxy does not follow links in its own directories"));
    }
    return ErrnoStatus(err, absl::StrCat("open ", path));
  }
  absl::StatusOr<uint64_t> size =
      RegularFileSize(fd, path, "; dpproxy expects a file of its own there");
  if (!size.ok()) return size.status();
  return ReadAndClose(fd, path);
}

absl::StatusOr<int> OpenOwnFileForAppend(const std::string& path, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is a symbolic link; dpproxy does not write through links"));
    }
    return ErrnoStatus(err, absl::StrCat("open ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (st.st_nlink > 1) {
    // A hard link planted at `path`: writing (or changing its mode) would
    // reach the file under its other name.
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has ", st.st_nlink,
        " hard links; dpproxy writes only to a file no other name reaches (remove it)"));
  }
  if ((st.st_mode & 07777) != mode) (void)::fchmod(fd, mode);
  return fd;
}

bool SomeoneListens(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::close(fd);
  return rc == 0 || err == EAGAIN || err == EINPROGRESS;
}

absl::StatusOr<std::vector<std::string>> RemoveStaleSockets(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, " is not a directory (or is a symbolic link); not cleaning it"));
    }
    return ErrnoStatus(err, absl::StrCat("open directory ", dir));
  }
  DIR* d = ::fdopendir(dfd);
  if (d == nullptr) {
    const int err = errno;
    ::close(dfd);
    return ErrnoStatus(err, absl::StrCat("read directory ", dir));
  }
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    names.push_back(name);
  }
  std::vector<std::string> removed;
  absl::Status status;
  for (const std::string& name : names) {
    struct stat st;
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISSOCK(st.st_mode)) continue;  // files, directories, links: not ours to remove
    // A socket someone listens on is a running plugin's (one that started a
    // moment ago, say): removing it would cost it a restart.
    if (SomeoneListens(JoinPath(dir, name))) continue;
    if (::unlinkat(dfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      status = ErrnoStatus(errno, absl::StrCat("remove ", JoinPath(dir, name)));
      break;
    }
    removed.push_back(name);
  }
  ::closedir(d);  // closes dfd
  if (!status.ok()) return status;
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::optional<std::string> ExecutableOf(const std::string& proc) {
  char buf[PATH_MAX];
  const std::string link = absl::StrCat("/proc/", proc, "/exe");
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return std::nullopt;
  std::string path(buf, static_cast<size_t>(n));
  if (absl::EndsWith(path, " (deleted)")) path.resize(path.size() - 10);
  return path;
}

absl::StatusOr<std::string> ResolvePath(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("\"", path, "\" is not an absolute path"));
  }
  std::string existing = path;
  std::string rest;
  for (;;) {
    char buf[PATH_MAX];
    if (::realpath(existing.c_str(), buf) != nullptr) {
      return rest.empty() ? std::string(buf) : JoinPath(buf, rest);
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      return ErrnoStatus(errno, absl::StrCat("resolve ", existing));
    }
    const size_t slash = existing.rfind('/');
    if (slash == std::string::npos || existing == "/") {
      return absl::NotFoundError(absl::StrCat("cannot resolve ", path));
    }
    const std::string last = existing.substr(slash + 1);
    if (last == "..") {
      // "missing/.." cannot be resolved without the missing directory.
      return absl::NotFoundError(
          absl::StrCat("cannot resolve ", path, ": a missing directory is followed by \"..\""));
    }
    if (!last.empty() && last != ".") rest = rest.empty() ? last : JoinPath(last, rest);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
}

bool IsSameOrInside(const std::string& inner, const std::string& outer) {
  absl::StatusOr<std::string> in = ResolvePath(inner);
  absl::StatusOr<std::string> out = ResolvePath(outer);
  if (!in.ok() || !out.ok()) return false;
  struct stat ost;
  if (::stat(out->c_str(), &ost) != 0) {
    // `outer` does not exist yet: compare the resolved names.
    return *in == *out || absl::StartsWith(*in, JoinPath(*out, ""));
  }
  std::string p = *in;
  for (;;) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0 && st.st_dev == ost.st_dev && st.st_ino == ost.st_ino) {
      return true;
    }
    if (p == "/") return false;
    const size_t slash = p.rfind('/');
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
}

absl::Status CheckOwnDirectory(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " is owned by uid ", st.st_uid, ", not by root or dpproxy's user (uid ",
        ::geteuid(), "); another user could plant files or links in it"));
  }
  if ((st.st_mode & S_IWOTH) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " is writable by every user (mode ", absl::StrFormat("%04o", st.st_mode & 07777),
        "); another user could plant files or links in it (chmod o-w ", dir, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& group) {
  if (group.empty()) return absl::InvalidArgumentError("group name is empty");
  std::vector<char> buf(16384);
  struct group g;
  struct group* found = nullptr;
  if (::getgrnam_r(group.c_str(), &g, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
    return found->gr_gid;
  }
  if (std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      group.size() < 10) {
    return static_cast<gid_t>(std::stoul(group));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown group \"", group, "\""));
}

absl::Status SetMode(const std::string& path, mode_t mode, gid_t gid) {
  if (gid != static_cast<gid_t>(-1) &&
      ::fchownat(AT_FDCWD, path.c_str(), static_cast<uid_t>(-1), gid, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chown ", path, " to group ", gid));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a symbolic link"));
  }
  if (::chmod(path.c_str(), mode) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RemoveFilesExcept(
    const std::string& dir, const std::vector<std::string>& keep, Wipe wipe) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("open directory ", dir));
  std::vector<std::string> removed;
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    std::error_code type_ec;
    if (wipe == Wipe::kSocketsOnly) {
      // What the entry names, through links; one that names nothing stays.
      const std::filesystem::file_type type = e.status(type_ec).type();
      if (type_ec || type != std::filesystem::file_type::socket) continue;
    } else {
      // Directories stay; links are removed, never followed.
      const std::filesystem::file_type type = e.symlink_status(type_ec).type();
      if (type_ec || type == std::filesystem::file_type::directory) continue;
    }
    const std::string full = JoinPath(dir, name);
    if (::unlink(full.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove ", full));
    }
    removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace dpproxy
