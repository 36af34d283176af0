// File: device_plugin_server.h
//
// The proxy as one device plugin toward the kubelet, for one resource: a
// socket serving both deviceplugin.DevicePlugin (v1alpha kubelets) and
// v1beta1.DevicePlugin (1.10+), and the registration with the kubelet in
// whichever version it accepts (newest first: UNIMPLEMENTED or the kubelet's
// unsupported-version error means try the next), or through the plugin
// watcher. Options are the same in the RegisterRequest and in
// GetDevicePluginOptions (kubelets up to 1.24 read the first, 1.25+ the
// second), and GetDevicePluginOptions answers from memory at once.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SERVER_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/events/event_log.h"
#include "proxy/util/files.h"
#include "proxy/config/proxy_config.h"
#include "proxy/core/allocator.h"
#include "proxy/core/preferred.h"
#include "proxy/core/resource.h"
#include "proxy/events/telemetry.h"
#include "proxy/kubelet_side/device_plugin/client_name_release.h"
#include "proxy/kubelet_side/call_gate.h"
#include "proxy/kubelet_side/kubelet_side.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

class DevicePluginServer : public KubeletGate {
 public:
  // `allocator` serves every Allocate (allocator.h); it outlives this.
  // `telemetry` (may be null) times every call, on both sides.
  DevicePluginServer(Resource* resource, const KubeletSideOptions& options, LossCounter* losses,
                     EventLog* events, Allocator* allocator, Telemetry* telemetry = nullptr);
  ~DevicePluginServer() override;

  DevicePluginServer(const DevicePluginServer&) = delete;
  DevicePluginServer& operator=(const DevicePluginServer&) = delete;

  // "dpproxy-vendor.com_gpu.sock"
  const std::string& socket_name() const { return socket_name_; }
  std::string socket_path() override { return socket_path_; }
  // True if this server serves and the file at socket_path() is the one it
  // created (a kubelet start removes it; a crashed predecessor leaves a
  // stale one that is not ours).
  bool SocketPresent() override;

  // (Re)creates the server on the socket; streams of an older server end.
  absl::Status Serve();
  // Registers at kubelet.sock, negotiating the version. kUnavailable if the
  // kubelet is not answering (worth retrying); other codes if it refused.
  // Does nothing in plugin-watcher mode (the kubelet comes to us). Blocks
  // (a 1.25+ kubelet dials back for up to 10 s): call it off the threads
  // that serve, detect and keep timers. Stop() cancels it. `reached`, if
  // given, is set to the kubelet.sock the registration was made at, read
  // once the connection to it was made: a kubelet that restarted between
  // the caller's look at kubelet.sock and the dial is the one registered
  // with (unset if no connection was made).
  absl::Status Register(std::optional<FileId>* reached = nullptr);
  // "v1beta1", "v1alpha2", "v1beta1 (plugin-watcher)" or "" if not yet.
  std::string negotiated();
  void Stop();  // idempotent

  // Implementation, public for the services in the .cc file.
  class Services;
  Resource* resource() { return resource_; }
  const KubeletSideOptions& options() const { return options_; }
  // The settings a SIGHUP may change while calls run (from options at
  // first): the limit of each call to the backend, and whether CDI names
  // are copied into annotations.
  absl::Duration backend_timeout() const { return absl::Nanoseconds(backend_timeout_ns_.load()); }
  bool cdi_annotations() const { return cdi_annotations_.load(); }
  void SetCallSettings(absl::Duration backend_timeout, bool cdi_annotations);
  LossCounter* losses() { return losses_; }
  Allocator* allocator() { return allocator_; }
  // --- Allocates during a handoff (proxy/handoff/handoff.proto) ---
  // Served here (the default), held (a new dpproxy is taking the state
  // over), or sent on to the new dpproxy's socket for this resource, which
  // journals them.
  //   HoldAllocates()            new Allocates wait; those in progress go on
  //   WaitForAllocatesServed(t)  true once none is in progress (served here
  //                              or forwarded; held ones do not count)
  //   ForwardAllocates(socket)   the held ones and every later one go on to
  //                              `socket` (a v1beta1 device plugin API)
  //   ServeAllocates()           back to serving here (a handoff given up)
  void HoldAllocates();
  bool WaitForAllocatesServed(absl::Duration timeout);
  // Returns how many were held.
  size_t ForwardAllocates(const std::string& socket);
  void ServeAllocates();
  // The same, as a handoff's KubeletGate (kubelet_side.h).
  std::string gate_name() override { return resource_->name(); }
  void HoldCalls() override { HoldAllocates(); }
  bool WaitForCallsServed(absl::Duration timeout) override {
    return WaitForAllocatesServed(timeout);
  }
  size_t ForwardCalls(const std::string& socket) override { return ForwardAllocates(socket); }
  void ServeCalls() override { ServeAllocates(); }
  // Implementation, for the Allocate reactor, through the call gate
  // (call_gate.h): kServe or kForward (*forward_to set), counted until
  // AllocateServed(); or kHold (`resume` runs once the mode changes, unless
  // Unhold(key) took it back first).
  using AllocateMode = CallGate::Mode;
  AllocateMode AdmitAllocate(const void* key, std::function<void()> resume,
                             std::shared_ptr<v1beta1::DevicePlugin::Stub>* forward_to);
  bool Unhold(const void* key);
  void AllocateServed();

  EventLog* events() { return events_; }
  // Steering away from devices of containers the kubelet forgot: how often
  // a GetPreferredAllocation answer left held devices out, named some
  // (too few others), and Allocates refused for naming one.
  void NoteSteering(const PreferredChoice& choice);
  // Whether the kubelet may call Allocate again for a running container
  // it forgot when it re-admits its pods after a start: every release
  // before 1.25 does (1.25+ leave running containers alone, kubernetes
  // #118635). Told apart by registration: a 1.25+ kubelet asks for the
  // options before it answers Register. Unknown (plugin watcher, not yet
  // registered): false, the side that never names a held device.
  bool kubelet_may_reallocate_running() const;
  // Whether the kubelet asked for the options before it answered the last
  // Register (1.25+).
  bool kubelet_registers_synchronously() const { return kubelet_sync_.load() == 1; }
  // Whether the kubelet's dial-back during the last Register that it
  // answered (1.25+) reached the server that serves now: the kubelet holds
  // this socket as served now, even if it was served again while the
  // kubelet answered. A 1.37 kubelet refuses another registration there
  // ("device plugin already connected").
  bool registration_reached_current_server() const {
    return kubelet_sync_.load() == 1 && options_asked_serve_.load() == serves_.load();
  }
  // Empties a 1.25-1.36 kubelet's entry for this resource's client
  // (client_name_release.h), so that the end of a replaced endpoint's
  // stream (a takeover's predecessor exiting) disconnects nothing. The
  // kubelet keeps using this server. Until this server registers again
  // it is "unlisted": the end of its own stream would not tell the kubelet
  // that the devices are gone, so a dpproxy that stops for good registers
  // once more first (RelistBeforeStop).
  absl::Status ReleaseClientName(absl::Duration timeout);
  // If unlisted: registers a stand-in at another socket (Relist in
  // client_name_release.h), so that this server's end is seen; never
  // this server's own socket again while the kubelet streams from it.
  void RelistBeforeStop();
  // Whether the kubelet calls PreStartContainer itself: what this server
  // last told it (in GetDevicePluginOptions, or in the RegisterRequest
  // before 1.25), which a later backend's options do not change.
  // nullopt: not told yet.
  std::optional<bool> kubelet_calls_pre_start() const {
    const int v = kubelet_pre_start_.load();
    return v < 0 ? std::nullopt : std::optional<bool>(v == 1);
  }
  void NoteOptionsTold(const v1beta1::DevicePluginOptions& options) {
    kubelet_pre_start_ = options.pre_start_required() ? 1 : 0;
  }
  void NoteOptionsAsked();
  struct SteeringCounts {
    int64_t avoided = 0, held_named = 0, refused = 0;
  };
  SteeringCounts steering() const {
    return {avoided_.load(), held_named_.load(), allocator_->refused_held()};
  }
  Telemetry* telemetry() { return telemetry_; }
  bool stopping() const { return stopping_.load(); }
  // The ListAndWatch streams being served, so that a new server or Stop()
  // can end them at once.
  class StreamHandle {
   public:
    virtual ~StreamHandle() = default;
    virtual void FinishNow() = 0;
  };
  // Whether the kubelet has a ListAndWatch stream open here: it uses this
  // endpoint (a kubelet opens it once the endpoint is its current one).
  bool kubelet_streaming();
  bool KubeletUses() override { return kubelet_streaming(); }
  // Waits up to `timeout` until the kubelet has no stream open here; true
  // if none is.
  bool WaitForKubeletGone(absl::Duration timeout) override;
  // Ends the kubelet's ListAndWatch streams here (dpproxy's side), as a
  // plugin that restarts would: the kubelet lets this socket's client go
  // (Registrar::Resume). Not reported as a drop.
  void EndKubeletStreams() { FinishStreams(); }
  void AddStream(StreamHandle* s);
  // `by_kubelet`: the kubelet ended the stream (it went away, or dropped
  // this server), not dpproxy.
  void RemoveStream(StreamHandle* s, bool by_kubelet);
  // Called (on a gRPC thread, no lock held) when the kubelet ends the last
  // ListAndWatch stream here while dpproxy is not stopping: it restarted,
  // or it dropped this server (1.25-1.36 disconnect a resource's client
  // by name when a replaced client of it ends, kubernetes#121994). Set
  // before Serve().
  void SetStreamDroppedHook(std::function<void()> hook) { stream_dropped_ = std::move(hook); }
  void SetNegotiated(const std::string& v);
  void NoteLoss(const Loss& loss);

 private:
  // Register's steps: one RegisterRequest in `api` on `channel`; the log
  // line and event of a registration the kubelet accepted (`refusals`: the
  // versions it refused first).
  grpc::Status SendRegister(ApiVersion api, const std::shared_ptr<grpc::Channel>& channel,
                            grpc::ClientContext* ctx);
  void NoteRegistered(const std::string& version, const std::vector<std::string>& refusals);

  Resource* const resource_;
  const KubeletSideOptions options_;
  std::atomic<int64_t> backend_timeout_ns_;
  std::atomic<bool> cdi_annotations_;
  LossCounter* const losses_;
  EventLog* const events_;
  Allocator* const allocator_;
  Telemetry* const telemetry_;
  const std::string socket_name_;
  const std::string socket_path_;
  std::unique_ptr<Services> services_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> avoided_{0}, held_named_{0};
  std::atomic<bool> registering_{false}, options_asked_{false};
  // Serve() calls so far, and the one serving when the kubelet asked for
  // the options during a registration.
  std::atomic<uint64_t> serves_{0}, options_asked_serve_{0};
  std::atomic<bool> unlisted_{false};
  // One Register (or release) at a time.
  absl::Mutex register_serial_mu_;
  std::atomic<int> kubelet_sync_{-1};  // 1: asked for options in Register, 0: not, -1: unknown
  absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Relist> relist_ ABSL_GUARDED_BY(mu_);  // stopped after server_
  std::atomic<int> kubelet_pre_start_{-1};
  std::optional<FileId> served_id_ ABSL_GUARDED_BY(mu_);
  // The Register call in flight, cancelled by Stop(); a lock of its own,
  // apart from mu_, which Serve() holds while the old server finishes.
  absl::Mutex register_mu_;
  grpc::ClientContext* register_ctx_ ABSL_GUARDED_BY(register_mu_) = nullptr;
  void FinishStreams();
  absl::Mutex streams_mu_;
  std::set<StreamHandle*> streams_ ABSL_GUARDED_BY(streams_mu_);
  std::function<void()> stream_dropped_;
  CallGate gate_;
  // The successor's socket Allocates are forwarded to, and a stub on it:
  // set before the gate forwards, kept until a later handoff names
  // another socket.
  absl::Mutex forward_mu_;
  std::string forward_socket_ ABSL_GUARDED_BY(forward_mu_);
  std::shared_ptr<v1beta1::DevicePlugin::Stub> forward_stub_ ABSL_GUARDED_BY(forward_mu_);
  absl::Mutex negotiated_mu_;
  std::string negotiated_ ABSL_GUARDED_BY(negotiated_mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_DEVICE_PLUGIN_SERVER_H_
