// File: file_wait.h
//
// Waits for a file another process writes (its output, its events) to say
// something: `pred` sees the file's text now and again after each change
// inotify reports in its directory, until it holds or the deadline passes.
#ifndef DPPROXY_TESTS_TESTING_FILE_WAIT_H_
#define DPPROXY_TESTS_TESTING_FILE_WAIT_H_

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proxy/util/files.h"

namespace dpproxy::testing {

// True once `pred(text)` holds for the file at `path` ("" while it does not
// exist); false if it still does not at `timeout`.
inline bool WaitForFile(const std::string& path, const std::function<bool(const std::string&)>& pred,
                        absl::Duration timeout) {
  auto holds = [&] {
    absl::StatusOr<std::string> text = ReadFile(path);
    return pred(text.ok() ? *text : std::string());
  };
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) return false;
  const std::string dir = DirName(path);
  if (::inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO) <
      0) {
    ::close(fd);
    return false;
  }
  const absl::Time deadline = absl::Now() + timeout;
  bool ok = holds();  // after the watch: a change from here on is heard
  while (!ok) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(ms)) == 1) {
      char buf[4096];
      while (::read(fd, buf, sizeof(buf)) > 0) {
      }
    }
    ok = holds();
  }
  ::close(fd);
  return ok;
}

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_FILE_WAIT_H_
