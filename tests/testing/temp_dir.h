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

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_TEMP_DIR_H_
