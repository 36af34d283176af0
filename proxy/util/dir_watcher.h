// File: dir_watcher.h
//
// Watches one directory for entries being created, deleted or renamed, with
// inotify, and also wakes once a second so that callers can compare stat()
// results as a fallback (inotify misses events on some file systems and when
// the directory itself is replaced). The callback runs on the watcher's own
// thread; it must not call Stop(). A first kTick is delivered as soon as the
// thread starts, before any event, so the owner can scan what is already
// there.
//
//   DirWatcher w(dir, [&](const DirWatcher::Event& e) { CheckKubelet(); });
//   DPP_RETURN_IF_ERROR(w.Start());
#ifndef DPPROXY_PROXY_UTIL_DIR_WATCHER_H_
#define DPPROXY_PROXY_UTIL_DIR_WATCHER_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dpproxy {

class DirWatcher {
 public:
  struct Event {
    // kMovedAway: renamed to another name (IN_MOVED_FROM), which the
    // kubelet's plugin watcher, unlike a deletion, ignores.
    enum Kind { kCreated, kDeleted, kMovedAway, kTick };
    Kind kind;
    std::string name;  // entry name; empty for kTick
  };
  using Callback = std::function<void(const Event&)>;

  // `tick` is the stat fallback period; it is clamped to at least 1 second.
  DirWatcher(std::string dir, Callback callback,
             absl::Duration tick = absl::Seconds(1));
  ~DirWatcher();

  DirWatcher(const DirWatcher&) = delete;
  DirWatcher& operator=(const DirWatcher&) = delete;

  // Starts the thread. If inotify cannot watch the directory (it may not
  // exist yet), only ticks are delivered until it can; that is not an error.
  absl::Status Start();
  // Stops and joins the thread. Idempotent.
  void Stop();

 private:
  void Run();
  bool TryAddWatch();

  const std::string dir_;
  const Callback callback_;
  const absl::Duration tick_;
  int inotify_fd_ = -1;
  int wake_fd_ = -1;  // eventfd used to stop the thread
  int watch_ = -1;
  std::thread thread_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_DIR_WATCHER_H_
