#include "tests/testing/temp_dir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace dpproxy::testing {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

}  // namespace

ShortTempDir::ShortTempDir() {
  char tmpl[] = "/tmp/dpp.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    ::perror("mkdtemp");
    ::abort();
  }
  path_ = tmpl;
}

ShortTempDir::~ShortTempDir() { RemoveTree(path_); }

void RemoveTree(const std::string& path) {
  ::nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

SilentSocket::SilentSocket(const std::string& path) {
  struct sockaddr_un addr = {};
  if (path.size() >= sizeof(addr.sun_path)) return;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  if (::bind(fd_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd_, 64) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

SilentSocket::~SilentSocket() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace dpproxy::testing
