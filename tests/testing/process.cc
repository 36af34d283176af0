#include "tests/testing/process.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace dpproxy::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir != nullptr ? srcdir : "..") + "/dpproxy/" + path;
}

std::unique_ptr<ChildProcess> Spawn(const std::vector<std::string>& args) {
  ChildSpec spec;
  spec.argv = args;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *std::move(child) : nullptr;
}

void Kill(ChildProcess* child, int sig) {
  if (child == nullptr) return;
  child->Signal(sig);
  EXPECT_TRUE(child->Wait(absl::Minutes(1)).has_value())
      << "pid " << child->pid() << " did not end after signal " << sig;
}

}  // namespace dpproxy::testing
