// File: saver.h
//
// Saves the resources to the state file and writes the status file, on a
// thread of its own: both wait for the disk, and serving and registering
// after a kubelet restart must never wait behind them. Woken after each
// housekeeping pass (and once a second), it compares the reporter's
// fingerprint with what it last saved and wrote, so an idle dpproxy does
// O(resources) and writes nothing.
//
// A status file that cannot be written is tried again once a minute, not
// at every change (building it costs a pass over every device); a failed
// save is counted by the keeper, which changes the fingerprint, so it is
// tried again at the next pass.
//
//   Saver saver({status_file}, keeper, &reporter, &events, released);
//   saver.Start();
//   saver.Wake();  // after a housekeeping pass
#ifndef DPPROXY_PROXY_SERVER_SAVER_H_
#define DPPROXY_PROXY_SERVER_SAVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/events/event_log.h"
#include "proxy/server/reporter.h"
#include "proxy/state/state_keeper.h"
#include "proxy/util/waitable_count.h"

namespace dpproxy {

class Saver {
 public:
  struct Options {
    std::string status_file;  // "" for none
  };
  // `keeper` may be null (no state directory). `released`: this dpproxy
  // handed its state to another; nothing is saved or written any more.
  Saver(Options options, StateKeeper* keeper, Reporter* reporter, EventLog* events,
        std::function<bool()> released)
      : options_(std::move(options)), keeper_(keeper), reporter_(reporter), events_(events),
        released_(std::move(released)) {}
  ~Saver() { Stop(); }

  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(wake_mu_);
  void Wake() ABSL_LOCKS_EXCLUDED(wake_mu_);

  // A handoff: saves the newest resources now, changed or not.
  void SaveNow() ABSL_LOCKS_EXCLUDED(pass_mu_);
  // The state was taken back: saves and writes again at the next pass,
  // whatever was saved before.
  void Forget() ABSL_LOCKS_EXCLUDED(pass_mu_);

  // Another thread dropped memory as large as the device lists (the
  // kubelet's checkpoint, parsed): handed back once things have settled,
  // as after a change, even when nothing the saver watches changed. Any
  // thread.
  void NoteFreed() { freed_at_ns_.store(absl::ToUnixNanos(absl::Now())); }

  const WaitableCount& passes() const { return passes_; }

 private:
  void Loop();
  // Each returns true if it did the work (something changed).
  bool SaveResources(const std::string& fingerprint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_);
  bool WriteStatus(const std::string& fingerprint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_);

  const Options options_;
  StateKeeper* const keeper_;
  Reporter* const reporter_;
  EventLog* const events_;
  const std::function<bool()> released_;

  absl::Mutex wake_mu_;
  bool wake_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread thread_;

  // A pass, and a handoff's last save: what was last saved and written.
  absl::Mutex pass_mu_;
  std::string saved_ ABSL_GUARDED_BY(pass_mu_);
  std::string written_ ABSL_GUARDED_BY(pass_mu_);
  bool status_failing_ ABSL_GUARDED_BY(pass_mu_) = false;
  absl::Time status_retry_at_ ABSL_GUARDED_BY(pass_mu_);
  // Freed memory is given back (malloc_trim) at the first pass that
  // changed something after a quiet spell, at most every kTrimEvery while
  // changes keep coming, and at the first pass that finds nothing changed,
  // kTrimAfter or more after the last change.
  void Trim(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pass_mu_);
  static constexpr absl::Duration kTrimAfter = absl::Seconds(1);
  static constexpr absl::Duration kTrimEvery = absl::Seconds(10);
  absl::Time trimmed_at_ ABSL_GUARDED_BY(pass_mu_);
  bool trim_due_ ABSL_GUARDED_BY(pass_mu_) = false;
  absl::Time changed_at_ ABSL_GUARDED_BY(pass_mu_);
  std::atomic<int64_t> freed_at_ns_{0};  // NoteFreed; 0: nothing since
  WaitableCount passes_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_SAVER_H_
