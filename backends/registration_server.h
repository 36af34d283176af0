// File: registration_server.h
//
// The proxy's own kubelet.sock, toward vendor plugins: a legacy plugin is
// pointed at this directory instead of the kubelet's and needs no change.
// It accepts /deviceplugin.Registration/Register ("v1alpha2") and
// /v1beta1.Registration/Register ("v1beta1") on one socket, validating
// exactly as a kubelet does (same error texts), and also refuses endpoints
// that escape the directory.
//
// v1beta1 registrations are synchronous, as on a 1.25+ kubelet: the plugin is
// dialled and asked for its options before Register returns. v1alpha
// registrations are asynchronous, as on the 1.9 kubelet those plugins were
// written for: Register returns at once and the proxy dials afterwards.
#ifndef DPPROXY_BACKENDS_REGISTRATION_SERVER_H_
#define DPPROXY_BACKENDS_REGISTRATION_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proxy/core/backend.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/proxy_config.h"
#include "proxy/events/event_log.h"

namespace dpproxy {

class BackendRegistrationServer {
 public:
  // v1alpha plugins being dialled at once; more registrations are refused
  // with UNAVAILABLE until one finishes.
  static constexpr size_t kMaxDials = 16;

  struct Options {
    // Directory holding kubelet.sock and the plugins' sockets.
    std::string dir;
    absl::Duration dial_timeout = absl::Seconds(10);
    // The largest message accepted from a plugin (its device lists).
    int max_list_bytes = kDefaultBackendMaxListBytes;
    // kubelet.sock's group: -1 keeps it 0700 (root's plugins only); a group
    // makes it 0660 so plugins running under that group may register.
    gid_t socket_gid = static_cast<gid_t>(-1);
  };
  // Called with each connected backend. An error is returned to a v1beta1
  // plugin's Register (and logged for a v1alpha one).
  using OnBackend = std::function<absl::Status(std::shared_ptr<Backend>)>;

  BackendRegistrationServer(Options options, OnBackend on_backend, EventLog* events);
  ~BackendRegistrationServer();

  // Checks the directory is dpproxy's own (see CheckOwnDirectory), removes
  // stale sockets from it (as a kubelet does at start, so plugins notice and
  // register again; files, directories and links are never removed), then
  // listens with a deliberate mode, whatever the umask.
  absl::Status Start();
  void Stop();  // idempotent
  std::string socket_path() const;

  // Refused registrations by reason (version, resource_name, endpoint, dial,
  // attach): a bounded set, fit for metric labels.
  std::map<std::string, int64_t> Rejections();

  // How long a registering plugin's socket is dialled, from the next
  // registration on (a SIGHUP may change it).
  void SetDialTimeout(absl::Duration d) { dial_timeout_ns_ = absl::ToInt64Nanoseconds(d); }

  // Implementation, public for the services in the .cc file. One plugin's
  // Register: checks it, dials the plugin (v1beta1; a v1alpha plugin is
  // dialled after the answer, as 1.9 did) and hands the backend over.
  // Blocks for up to the dial timeout.
  // `registered_options`: the options a v1beta1 plugin sent in its
  // RegisterRequest, if it sent any (used instead of asking for them).
  absl::Status HandleRegister(
      ApiVersion api, const std::string& version, const std::string& endpoint,
      const std::string& resource,
      const std::optional<v1beta1::DevicePluginOptions>& registered_options = std::nullopt);
  // The same without blocking the caller: `done` gets the outcome, at once
  // (v1alpha, a refusal) or from a thread of the registration's own (a
  // v1beta1 dial; at most kMaxDials at once, more are refused with
  // kUnavailable until one ends).
  void RegisterAsync(ApiVersion api, std::string version, std::string endpoint,
                     std::string resource, std::function<void(absl::Status)> done,
                     std::optional<v1beta1::DevicePluginOptions> registered_options =
                         std::nullopt);

 private:
  const Options options_;
  std::atomic<int64_t> dial_timeout_ns_;
  const OnBackend on_backend_;
  EventLog* const events_;
  std::unique_ptr<grpc::Service> beta_service_;
  std::unique_ptr<grpc::Service> alpha_service_;
  std::unique_ptr<grpc::CallbackGenericService> unknown_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  // v1beta1 registrations being dialled (RegisterAsync), each on a thread
  // of its own; Stop() waits for them.
  int registering_ ABSL_GUARDED_BY(mu_) = 0;
  // v1alpha dials in flight (Register answered, plugin being dialled): one
  // thread each, reaped when done, at most kMaxDials at once and one per
  // socket, so a crash-looping plugin cannot pile up threads.
  struct Dialer {
    std::thread thread;
    std::string socket;
    bool done = false;
  };
  std::vector<std::unique_ptr<Dialer>> dialers_ ABSL_GUARDED_BY(mu_);
  void ReapDialersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, int64_t> rejections_ ABSL_GUARDED_BY(mu_);

  void CountRejection(const std::string& reason);
};

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_REGISTRATION_SERVER_H_
