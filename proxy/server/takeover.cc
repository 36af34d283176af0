#include "proxy/server/takeover.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <map>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

// DPPROXY_TEST_PAUSE_AT=STEP (tests only): the taking-over dpproxy stops
// itself (SIGSTOP) right after STEP, for the test to kill it there:
// "released", "forwarded", or "registered" (with the kubelet for every
// resource, before the running one is told to finish). As PID 1 of a PID
// namespace (a container's) it cannot: the kernel ignores a SIGSTOP init
// sends itself. It stops its takeover there instead, for good.
void PauseForTest(const char* step) {
  const char* at = std::getenv("DPPROXY_TEST_PAUSE_AT");
  if (at == nullptr || std::strcmp(at, step) != 0) return;
  LOG(WARNING) << "takeover: DPPROXY_TEST_PAUSE_AT=" << step << ": stopping "
               << (::getpid() == 1 ? "the takeover (PID 1 cannot stop itself)" : "this process");
  google::FlushLogFiles(google::GLOG_INFO);
  if (::getpid() != 1) {
    ::raise(SIGSTOP);
    return;
  }
  for (;;) ::pause();
}

}  // namespace

Takeover::Takeover(std::string state_dir, absl::Duration release_timeout, EventLog* events)
    : state_dir_(std::move(state_dir)), release_timeout_(release_timeout), events_(events) {}

Takeover::~Takeover() { Join(); }

void Takeover::Join() {
  if (thread_.joinable()) thread_.join();
}

absl::Status Takeover::AskToRelease() {
  // The running dpproxy serves one of the two names; a stale socket left by
  // one that crashed refuses the connection at once.
  std::unique_ptr<HandoffClient> client;
  absl::StatusOr<HandoffClient::Released> r =
      absl::NotFoundError(absl::StrCat("no handoff socket in ", state_dir_));
  std::vector<std::string> tried;
  for (int generation : {0, 1}) {
    const std::string socket = HandoffSocketPath(state_dir_, generation);
    if (!PathExists(socket)) continue;
    client = std::make_unique<HandoffClient>(socket);
    r = client->Release(release_timeout_);
    if (r.ok()) break;
    tried.push_back(std::string(r.status().message()));
  }
  if (!r.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another dpproxy holds ", state_dir_, " and did not hand it over (--takeover): ",
        tried.empty() ? std::string(r.status().message()) : absl::StrJoin(tried, "; ")));
  }
  socket_generation_ = r->socket_generation == 0 ? 1 : 0;
  LOG(INFO) << "takeover: dpproxy " << r->version << " (pid " << r->pid
            << ") released the state directory; serving the kubelet on socket generation "
            << socket_generation_;
  events_->Emit("takeover_released", {{"peer_pid", r->pid}, {"peer_version", r->version}});
  predecessor_ = std::move(client);
  PauseForTest("released");
  return absl::OkStatus();
}

void Takeover::StartCompleting(Parts parts) {
  thread_ = std::thread([this, parts = std::move(parts)] { Complete(parts); });
}

bool Takeover::WaitForEvery(const Parts& parts, const std::function<bool(KubeletGate*)>& done,
                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    bool all = true;
    for (KubeletGate* g : parts.side->Gates()) all = all && done(g);
    if (all) return true;
    if (parts.stopping() || absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Takeover::WaitForPluginsBack(const Parts& parts) {
  // The predecessor's plugins: a plugin that watches only its own socket
  // never registers here by itself, and would be connected to nobody once
  // the predecessor exits.
  if (!parts.plugins_back) return;
  bool back = parts.plugins_back(absl::Seconds(30));
  while (!back && !parts.stopping()) {
    LOG(ERROR) << "takeover: a plugin the running dpproxy has connected is not connected here "
                  "yet (see /readyz); the predecessor keeps running until it is, or is gone";
    events_->Emit("takeover_waiting", {{"waited_s", 30}, {"for", "plugins"}});
    back = parts.plugins_back(absl::Seconds(30));
  }
}

bool Takeover::WaitUntilRegistered(const Parts& parts) {
  // Registered everywhere, and the kubelet using every socket of this one
  // (a device plugin: it opens ListAndWatch once the new endpoint is its
  // current one, and a 1.10-1.24 kubelet answers Register before it
  // dials), so from then on its calls come here. Then the predecessor may
  // go.
  auto registered_everywhere = [&parts](KubeletGate* g) {
    if (!g->KubeletUses()) return false;
    for (const HealthCheck& c : parts.side->Readiness()) {
      if (!c.ok) return false;
    }
    return true;
  };
  bool registered = WaitForEvery(parts, registered_everywhere, absl::Minutes(1));
  while (!registered && !parts.stopping()) {
    LOG(ERROR) << "takeover: not registered with the kubelet for every resource yet (see "
                  "/readyz); the predecessor keeps running and forwarding until this one is";
    events_->Emit("takeover_waiting", {{"waited_s", 60}});
    registered = WaitForEvery(parts, registered_everywhere, absl::Minutes(1));
  }
  return registered;
}

void Takeover::Complete(const Parts& parts) {
  // The predecessor forwards to sockets that listen: housekeeping serves
  // them right after Start.
  if (!WaitForEvery(parts, [](KubeletGate* g) { return g->SocketPresent(); },
                    absl::Seconds(10))) {
    LOG(WARNING) << "takeover: a kubelet-facing socket is not served yet; forwarding anyway";
  }
  std::map<std::string, std::string> sockets;
  for (KubeletGate* g : parts.side->Gates()) sockets[g->gate_name()] = g->socket_path();
  absl::StatusOr<int64_t> held = predecessor_->Forward(sockets, absl::Seconds(10));
  if (!held.ok()) {
    LOG(ERROR) << "takeover: " << held.status().message();
    events_->Emit("takeover_failed", {{"error", std::string(held.status().message())}});
    done_.Notify();
    return;
  }
  PauseForTest("forwarded");
  WaitForPluginsBack(parts);
  const bool registered = WaitUntilRegistered(parts);
  if (!registered) {
    // Stopping before it was registered: the predecessor is not told to
    // finish; Shutdown hands it the state back and it serves on.
    LOG(ERROR) << "takeover: stopping before registered with the kubelet; the state goes back "
                  "to the running dpproxy";
    events_->Emit("takeover_failed", {{"error", "stopped before registered with the kubelet"}});
    done_.Notify();
    return;
  }
  PauseForTest("registered");
  parts.side->BeforePredecessorExits();
  if (parts.before_finish) parts.before_finish();
  finish_sent_ = true;
  absl::Status f = predecessor_->Finish(absl::Seconds(10));
  if (!f.ok()) LOG(WARNING) << "takeover: " << f.message();
  events_->Emit("takeover_complete", {{"held", *held}, {"registered", registered}});
  done_.Notify();
}

void Takeover::HandBack(const std::string& why) {
  absl::Status s = predecessor_->HandBack(why, absl::Seconds(30));
  if (s.ok()) {
    LOG(WARNING) << "takeover: not completed (" << why
                 << "); the state was handed back and the running dpproxy serves on";
    events_->Emit("takeover_handed_back", {{"reason", why}});
  } else {
    LOG(ERROR) << "takeover: not completed (" << why << "), and the state could not be handed "
               << "back: " << s.message()
               << "; the running dpproxy takes it back once this process has exited";
    events_->Emit("takeover_hand_back_failed", {{"reason", why},
                                                {"error", std::string(s.message())}});
  }
}

}  // namespace dpproxy
