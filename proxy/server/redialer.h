// File: redialer.h
//
// The plugins a previous dpproxy had connected, dialled again where they
// were when this one starts (a restart, a crash, --takeover, an in-place
// upgrade).
//
// A kubelet start forgets every plugin, and the plugin must notice. It may
// notice either way: its own socket removed, or kubelet.sock created anew.
// dpproxy leaves a running plugin's socket in place at start, so a plugin
// that only watches its own socket would never register with it again. So
// each remembered plugin whose socket someone still listens on is dialled,
// with the version and options it registered with (a plugin is never asked
// for options it did not give; see translation.md).
//
// The first dial waits a moment (Options::settle) after the registration
// socket is served: a plugin that watches kubelet.sock restarts its server
// and registers within milliseconds, and a dial that raced it would see its
// stream end at once. A registration always wins: a dial attaches only to
// a resource with no backend. A plugin nobody listens for any more is
// "gone"; a dial that fails is tried again (Options::attempts).
//
//   Redialer redialer({plugin_dir, dial_timeout, max_list_bytes}, &workers,
//                     &events, attach, has_backend);
//   redialer.Start(remembered);
//   ...
//   redialer.settled();  // every plugin back or gone (a takeover waits)
#ifndef DPPROXY_PROXY_SERVER_REDIALER_H_
#define DPPROXY_PROXY_SERVER_REDIALER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/api_version.h"
#include "proxy/core/backend.h"
#include "proxy/events/event_log.h"
#include "proxy/util/work_queue.h"

namespace dpproxy {

class Redialer {
 public:
  // One plugin the state file remembers.
  struct Remembered {
    std::string resource;          // the kubelet-facing name
    std::string backend_resource;  // as the plugin registered it
    std::string endpoint;          // its socket's path
    ApiVersion api = ApiVersion::kV1Beta1;
    // The options it was served with; absent (a state file written before
    // they were kept): asked for, as for a static backend.
    std::optional<v1beta1::DevicePluginOptions> options;
  };
  struct Options {
    std::string plugin_dir;  // only sockets inside it are dialled
    absl::Duration dial_timeout = absl::Seconds(10);
    int max_list_bytes = 0;
    absl::Duration settle = absl::Milliseconds(300);
    int attempts = 3;
    absl::Duration retry_every = absl::Seconds(1);
  };
  // Hands a connected backend over to be served.
  using Attach = std::function<absl::Status(std::shared_ptr<Backend>)>;
  // Whether a backend is attached to this kubelet-facing resource.
  using HasBackend = std::function<bool(const std::string& resource)>;

  enum class Outcome {
    kDialling,  // not back yet, still tried
    kBack,      // connected: by this dial, or the plugin registered itself
    kGone,      // nobody listens on its socket, or every attempt failed
  };
  struct Report {
    Outcome outcome = Outcome::kDialling;
    std::string endpoint;
    std::string error;  // why it is gone, or why the last attempt failed
  };

  Redialer(Options options, WorkQueue* workers, EventLog* events, Attach attach,
           HasBackend has_backend);
  ~Redialer();

  Redialer(const Redialer&) = delete;
  Redialer& operator=(const Redialer&) = delete;

  // Starts dialling `remembered` on a thread of its own (once).
  void Start(std::vector<Remembered> remembered) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the dials: none attaches after this returns; a dial running on a
  // worker ends within its timeout. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // True once no remembered plugin is still being dialled.
  bool settled() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for settled().
  bool WaitSettled(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // By kubelet-facing resource name: those remembered, and how each did.
  std::map<std::string, Report> reports() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // One round's dials of `round`, on the worker pool (a plugin that came
  // back, or whose socket is gone, is settled at once). False if stopping.
  bool StartRound(const std::vector<Remembered>& round, bool last);
  // One attempt at `resource`; on a worker.
  void Dial(const Remembered& r);
  // Whether `endpoint` may be dialled: a socket inside the plugin directory.
  absl::Status CheckEndpoint(const std::string& endpoint) const;
  void Finish(const std::string& resource, Outcome outcome, const std::string& error)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool SettledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  WorkQueue* const workers_;
  EventLog* const events_;
  const Attach attach_;
  const HasBackend has_backend_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Remembered> remembered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Report> reports_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // dials on the workers
  std::thread thread_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_SERVER_REDIALER_H_
