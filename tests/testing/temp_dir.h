// File: temp_dir.h
//
// A short temporary directory for tests that create Unix sockets: Bazel's
// TEST_TMPDIR is too long for the 107-byte socket path limit, so tests use
// /tmp/dpp.XXXXXX and remove it afterwards.
#ifndef DPPROXY_TESTS_TESTING_TEMP_DIR_H_
#define DPPROXY_TESTS_TESTING_TEMP_DIR_H_

#include <string>

namespace dpproxy::testing {

class ShortTempDir {
 public:
  ShortTempDir();
  ~ShortTempDir();
  ShortTempDir(const ShortTempDir&) = delete;
  ShortTempDir& operator=(const ShortTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Removes a directory tree (like rm -rf).
void RemoveTree(const std::string& path);

// A Unix socket bound at `path` that listens and never accepts: a
// connection to it succeeds at the socket level and is never answered (a
// peer that hangs). Closed when this goes; -1 in fd() if it could not be
// made.
class SilentSocket {
 public:
  explicit SilentSocket(const std::string& path);
  ~SilentSocket();
  SilentSocket(const SilentSocket&) = delete;
  SilentSocket& operator=(const SilentSocket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_TEMP_DIR_H_
