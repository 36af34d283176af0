#include "tests/testing/temp_dir.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

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

}  // namespace dpproxy::testing
