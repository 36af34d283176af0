#include "proxy/util/dir_watcher.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"
#include "proxy/util/thread_name.h"

namespace dpproxy {

DirWatcher::DirWatcher(std::string dir, Callback callback, absl::Duration tick)
    : dir_(std::move(dir)),
      callback_(std::move(callback)),
      tick_(tick < absl::Seconds(1) ? absl::Seconds(1) : tick) {}

DirWatcher::~DirWatcher() { Stop(); }

absl::Status DirWatcher::Start() {
  if (thread_.joinable()) return absl::OkStatus();
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ < 0) {
    return absl::InternalError(absl::StrCat("inotify_init1: ", ErrnoText(errno)));
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    ::close(inotify_fd_);
    inotify_fd_ = -1;
    return absl::InternalError(absl::StrCat("eventfd: ", ErrnoText(errno)));
  }
  TryAddWatch();
  thread_ = std::thread([this] {
    NameThisThread("dpp-dirwatch");
    Run();
  });
  return absl::OkStatus();
}

void DirWatcher::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  thread_.join();
  ::close(inotify_fd_);
  ::close(wake_fd_);
  inotify_fd_ = wake_fd_ = watch_ = -1;
}

bool DirWatcher::TryAddWatch() {
  if (watch_ >= 0) return true;
  watch_ = ::inotify_add_watch(inotify_fd_, dir_.c_str(),
                               IN_CREATE | IN_DELETE | IN_MOVED_FROM |
                                   IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF);
  return watch_ >= 0;
}

void DirWatcher::Run() {
  const int tick_ms = static_cast<int>(absl::ToInt64Milliseconds(tick_));
  // A first tick at once, before any event, lets the owner scan what is
  // already there.
  TryAddWatch();
  callback_(Event{Event::kTick, ""});
  absl::Time next_tick = absl::Now() + tick_;
  alignas(struct inotify_event) char buf[8192];
  for (;;) {
    int timeout = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next_tick - absl::Now())));
    if (timeout > tick_ms) timeout = tick_ms;
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    int n = ::poll(fds, 2, timeout);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents & POLLIN) return;
    if (n > 0 && (fds[1].revents & POLLIN)) {
      ssize_t len;
      while ((len = ::read(inotify_fd_, buf, sizeof(buf))) > 0) {
        for (char* p = buf; p < buf + len;) {
          auto* ev = reinterpret_cast<struct inotify_event*>(p);
          p += sizeof(struct inotify_event) + ev->len;
          if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
            // The directory went away; re-add the watch on a later tick.
            if (ev->mask & IN_IGNORED) watch_ = -1;
            continue;
          }
          Event e;
          e.kind = (ev->mask & (IN_CREATE | IN_MOVED_TO)) ? Event::kCreated
                   : (ev->mask & IN_MOVED_FROM)            ? Event::kMovedAway
                                                           : Event::kDeleted;
          e.name = ev->len > 0 ? std::string(ev->name) : std::string();
          callback_(e);
        }
      }
    }
    if (absl::Now() >= next_tick) {
      next_tick = absl::Now() + tick_;
      TryAddWatch();
      callback_(Event{Event::kTick, ""});
    }
  }
}

}  // namespace dpproxy
