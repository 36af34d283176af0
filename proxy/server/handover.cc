#include "proxy/server/handover.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"

namespace dpproxy {

Handover::Handover(Options options, Host* host, EventLog* events,
                   std::function<void()> on_done)
    : options_(std::move(options)), host_(host), events_(events), on_done_(std::move(on_done)) {}

Handover::~Handover() {
  StopServing();
  if (peer_pidfd_ >= 0) ::close(peer_pidfd_);
}

void Handover::Serve() {
  // The name follows the socket generation: the one of a dpproxy that took
  // over differs from its predecessor's, which gRPC unlinks when that one
  // stops.
  const std::string socket = HandoffSocketPath(options_.state_dir, options_.socket_generation);
  absl::StatusOr<std::unique_ptr<HandoffServer>> h =
      ValidateSocketPath(socket).ok()
          ? HandoffServer::Start(
                socket, {[this](int64_t peer) { return Release(peer); },
                         [this](const std::map<std::string, std::string>& sockets) {
                           return Forward(sockets);
                         },
                         [this] { Finish(); },
                         [this](const std::string& why) { return TakeBack(why); }})
          : absl::StatusOr<std::unique_ptr<HandoffServer>>(ValidateSocketPath(socket));
  if (!h.ok()) {
    LOG(WARNING) << "no handoff socket (a new dpproxy cannot take over from this one "
                    "without a gap): "
                 << h.status().message();
    return;
  }
  server_ = *std::move(h);
  if (options_.shared_listener_fd < 0) return;
  absl::StatusOr<std::unique_ptr<ListenerShare>> share = ListenerShare::Start(
      HandoffListenerSocket(options_.state_dir, options_.socket_generation),
      options_.shared_listener_fd);
  if (share.ok()) {
    listener_share_ = *std::move(share);
  } else {
    LOG(WARNING) << "a dpproxy taking over from this one will have to bind the metrics "
                    "address itself: "
                 << share.status().message();
  }
}

void Handover::StopServing() {
  listener_share_.reset();
  if (server_) server_->Stop();
}

absl::StatusOr<int> Handover::Release(int64_t peer_pid) {
  absl::MutexLock handing(&mu_);
  bool expected = false;
  if (!released_.compare_exchange_strong(expected, true)) {
    return absl::FailedPreconditionError("this dpproxy already handed its state over");
  }
  events_->Emit("handoff_release", {{"peer_pid", peer_pid}});
  const std::vector<KubeletGate*> gates = host_->HandoverGates();
  for (KubeletGate* g : gates) g->HoldCalls();
  // Those in progress reach the journal first (each within its deadline).
  const absl::Duration wait = host_->AllocateWait();
  for (KubeletGate* g : gates) {
    if (g->WaitForCallsServed(wait)) continue;
    for (KubeletGate* u : gates) u->ServeCalls();
    released_ = false;
    events_->Emit("handoff_refused", {{"peer_pid", peer_pid}, {"resource", g->gate_name()}});
    return absl::UnavailableError(absl::StrCat("a call for ", g->gate_name(),
                                               " was still in progress after ",
                                               absl::FormatDuration(wait)));
  }
  // From here on this dpproxy writes nothing and registers nothing: the
  // new one does. Its sockets stay served until Finish, with every
  // Allocate held, then forwarded.
  host_->StopWriting();
  if (const char* die = std::getenv("DPPROXY_TEST_DIE_AT");
      die != nullptr && std::string(die) == "release") {
    // Tests only: this dpproxy dies in the middle of the handoff, its
    // answer never sent.
    LOG(WARNING) << "handoff: DPPROXY_TEST_DIE_AT=release: killing this process";
    google::FlushLogFiles(google::GLOG_INFO);
    ::raise(SIGKILL);
  }
  released_at_ns_ = absl::ToUnixNanos(absl::Now());
  // Watched from now on: if it exits before it finished, the state comes
  // back here (CheckProgress).
  // (0: in a PID namespace this one cannot see, as another pod's; then
  // only its lock tells.)
  peer_pid_ = peer_pid;
  peer_pidfd_ = peer_pid <= 0 ? -1
                              : static_cast<int>(::syscall(SYS_pidfd_open,
                                                           static_cast<pid_t>(peer_pid), 0));
  if (peer_pid > 0 && peer_pidfd_ < 0) {
    LOG(WARNING) << "handoff: cannot watch pid " << peer_pid << " (" << ErrnoText(errno)
                 << "); if it dies, the state directory's lock says so";
  }
  LOG(INFO) << "handoff: state directory " << options_.state_dir << " released to "
            << (peer_pid > 0 ? absl::StrCat("pid ", peer_pid)
                             : std::string("a dpproxy in another PID namespace"))
            << "; the kubelet's Allocates are held until it serves";
  return options_.socket_generation;
}

bool Handover::WatchLock(absl::Time now, int64_t at) {
  // The new dpproxy locks the state directory right after its Release and
  // holds the lock for as long as it lives. Where its process is hidden
  // (another pod's PID namespace) the lock is the only sign of it, and is
  // looked at on every pass; a look takes the lock for a moment, making
  // the new one's try wait 50 ms. Where its process is watched, the lock
  // is looked at only once the grace has passed, until it is seen held.
  const bool hidden = peer_pidfd_ < 0;
  const bool past_grace = now - absl::FromUnixNanos(at) >= kLockGrace;
  if (hidden || (!lock_seen_ && !forwarded_.load() && past_grace)) {
    if (!StateLockFree()) {
      lock_seen_ = true;
    } else if (lock_seen_) {
      // The kernel let it go: the new one exited before it finished. The
      // state comes back at the pass after, once its exit has closed what
      // else it had open (the lock goes as its files close, its sockets
      // to the kubelet perhaps after).
      if (++lock_free_passes_ >= 2 &&
          TakeBackAndReopen("the new dpproxy let the state directory's lock go before it "
                            "finished: it exited")) {
        return true;
      }
    } else if (past_grace) {
      // A process that never locks it is no takeover (a stray or hostile
      // call naming some process), or one stuck before it: the state comes
      // back now, not at the handoff timeout with every Allocate held
      // until then.
      if (TakeBackAndReopen(absl::StrCat(
              peer_pid_ > 0 ? absl::StrCat("pid ", peer_pid_) : std::string("the new dpproxy"),
              " was given the state and never took the state directory's lock within ",
              absl::FormatDuration(kLockGrace)))) {
        return true;
      }
    }
  }
  return false;
}

void Handover::CheckProgress(absl::Time now) {
  const int64_t at = released_at_ns_.load();
  if (at == 0 || handed_over_.load() || failed_.load()) return;
  if (peer_pidfd_ >= 0) {
    pollfd p = {peer_pidfd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      // The new dpproxy exited (a crash, a kill) before it finished: the
      // kernel released its lock; the state is this one's again.
      if (TakeBackAndReopen(
              absl::StrCat("the new dpproxy (pid ", peer_pid_, ") exited before it finished"))) {
        return;
      }
    }
  }
  if (WatchLock(now, at)) return;
  if (forwarded_.load()) return;
  if (now - absl::FromUnixNanos(at) < options_.handoff_timeout) return;
  // The new dpproxy released this one and never came to serve (it died, or
  // hangs). This one holds the kubelet's Allocates and can write nothing:
  // it stops, so that a restart (systemd, the container's policy) loads
  // the state again and serves.
  failed_ = true;
  LOG(ERROR) << "handoff: the new dpproxy did not serve within "
             << absl::FormatDuration(options_.handoff_timeout)
             << " of taking the state over; stopping, so that a restart serves again";
  events_->Emit("handoff_abandoned",
                {{"waited_seconds", absl::ToInt64Seconds(options_.handoff_timeout)}});
  if (on_done_) on_done_();
}

bool Handover::TakeBackAndReopen(const std::string& why) {
  absl::Status s = TakeBack(why);
  if (!s.ok()) {
    LOG(ERROR) << "handoff: " << why << ", and the state cannot be taken back: " << s.message()
               << "; trying again";
    return false;
  }
  if (server_) server_->Reopen();  // a new takeover may begin with Release again
  return true;
}

bool Handover::StateLockFree() {
  const std::string path = JoinPath(options_.state_dir, "lock");
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;  // gone or unreadable: not known to be free
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);  // (releases it again)
  return free;
}

absl::StatusOr<int64_t> Handover::Forward(const std::map<std::string, std::string>& sockets) {
  if (!released_.load()) {
    return absl::FailedPreconditionError("Forward before Release: nothing was handed over");
  }
  forwarded_ = true;
  int64_t held = 0;
  for (KubeletGate* g : host_->HandoverGates()) {
    const std::string name = g->gate_name();
    auto it = sockets.find(name);
    if (it == sockets.end()) {
      // The new dpproxy does not serve it: its calls are refused (the
      // journal is closed), naming the handoff.
      LOG(WARNING) << "handoff: the new dpproxy does not serve " << name;
      g->ServeCalls();
      continue;
    }
    held += static_cast<int64_t>(g->ForwardCalls(it->second));
  }
  events_->Emit("handoff_forward", {{"resources", sockets.size()}, {"held", held}});
  return held;
}

absl::Status Handover::TakeBack(const std::string& why) {
  absl::MutexLock handing(&mu_);
  if (!released_.load() || handed_over_.load()) {
    return absl::FailedPreconditionError("this dpproxy is not waiting for a takeover to finish");
  }
  // The new one unlocked (HandBack) or is gone (the kernel unlocked).
  absl::StatusOr<int> allocations = host_->ResumeWriting();
  if (!allocations.ok()) return allocations.status();
  for (KubeletGate* g : host_->HandoverGates()) {
    g->ServeCalls();  // the held ones are answered here
  }
  if (peer_pidfd_ >= 0) ::close(peer_pidfd_);
  peer_pidfd_ = -1;
  const int64_t peer = peer_pid_;
  peer_pid_ = 0;
  released_at_ns_ = 0;
  forwarded_ = false;
  released_ = false;
  lock_seen_ = false;
  lock_free_passes_ = 0;
  LOG(WARNING) << "handoff: " << why << "; this dpproxy took the state directory back with "
               << *allocations << " allocations and serves on";
  events_->Emit("handoff_taken_back",
                {{"peer_pid", peer}, {"reason", why}, {"allocations", *allocations}});
  return absl::OkStatus();
}

void Handover::Finish() {
  handed_over_ = true;
  LOG(INFO) << "handoff: the new dpproxy is registered for every resource; stopping";
  events_->Emit("handed_over", {});
  if (on_done_) on_done_();
}

}  // namespace dpproxy
