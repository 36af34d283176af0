#include "tests/testing/process.h"

#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>

#include "gtest/gtest.h"

extern char** environ;

namespace dpproxy::testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir != nullptr ? srcdir : "..") + "/dpproxy/" + path;
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (DIR* d = opendir("/proc/self/fd")) {
    std::vector<int> fds;
    while (struct dirent* e = readdir(d)) {
      int fd = std::atoi(e->d_name);
      if (fd > 2 && fd != dirfd(d)) fds.push_back(fd);
    }
    closedir(d);
    for (int fd : fds) posix_spawn_file_actions_addclose(&actions, fd);
  }
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0) << args[0];
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

void Kill(pid_t pid, int sig) {
  if (pid <= 0) return;
  kill(pid, sig);
  int status;
  waitpid(pid, &status, 0);
}

}  // namespace dpproxy::testing
