// File: backend.h
//
// One vendor device plugin as the proxy sees it: a channel to its socket made
// once, exactly one ListAndWatch stream (real plugins may hand an update to
// only one stream; the proxy fans out itself), and per-call deadlines (the
// kubelet sets none on Allocate, so the proxy must). Requests and responses
// are v1beta1, the proxy's canonical model; each adapter translates to its
// plugin's version at the edge.
//
//   absl::StatusOr<std::shared_ptr<Backend>> b =
//       ConnectBackend("vendor.com/gpu", "/var/lib/dpproxy/device-plugins/gpu.sock",
//                      ApiVersion::kV1Alpha, absl::Seconds(10));
//   (*b)->Start({on_devices, on_lost});
//   auto resp = (*b)->Allocate(req, absl::Seconds(30));  // blocking
//   (*b)->AllocateAsync(req, absl::Seconds(30), nullptr, [](auto resp) { ... });
#ifndef DPPROXY_PROXY_CORE_BACKEND_H_
#define DPPROXY_PROXY_CORE_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/api_version.h"
#include "proxy/core/device_list.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace dpproxy {


struct BackendCallbacks {
  // Every full device list the plugin sends, in order, one call at a time,
  // on one of gRPC's callback threads (no thread per backend). Must not
  // block for long: the next list waits for it. Read straight from the
  // message's bytes (no parsed message is built).
  std::function<void(std::shared_ptr<const DeviceList>)> on_devices;
  // The stream ended (plugin gone or restarted). Called at most once, after
  // the last on_devices, and never after Stop() returned.
  std::function<void(const std::string& why)> on_lost;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual ApiVersion api() const = 0;
  // Socket path of the plugin.
  virtual const std::string& endpoint() const = 0;
  // Resource name the plugin registered (before any rename).
  virtual const std::string& resource() const = 0;
  // The plugin's options; for v1alpha plugins the proxy's answer (all off).
  virtual v1beta1::DevicePluginOptions options() const = 0;

  // Starts delivering the ListAndWatch stream's lists. Non-blocking.
  virtual void Start(BackendCallbacks callbacks) = 0;

  // Blocking calls with a deadline. Errors name the backend and the call:
  // kDeadlineExceeded if it did not answer in time, kUnavailable if it is
  // gone, kInternal for an answer that breaks the protocol.
  // One container response per container request, in order; a v1alpha
  // backend gets one call per container (all-or-nothing).
  // `caller` (may be null) is the kubelet's call this one serves: its
  // cancellation (the kubelet gave up, or dpproxy replaced the server)
  // cancels the backend call too.
  virtual absl::StatusOr<v1beta1::AllocateResponse> Allocate(
      const v1beta1::AllocateRequest& request, absl::Duration timeout,
      const grpc::ServerContextBase* caller = nullptr) = 0;
  // kUnimplemented for v1alpha backends and plugins that do not offer it.
  virtual absl::StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, absl::Duration timeout,
      const grpc::ServerContextBase* caller = nullptr) = 0;
  // A no-op for v1alpha backends.
  virtual absl::Status PreStartContainer(const v1beta1::PreStartContainerRequest& request,
                                         absl::Duration timeout,
                                         const grpc::ServerContextBase* caller = nullptr) = 0;

  // Allocate, GetPreferredAllocation and PreStartContainer without a
  // waiting thread, for the
  // kubelet side's callback handlers: the same contract as the blocking
  // calls, the outcome given to `done` once, on one of gRPC's callback
  // threads (or on the caller's, for an outcome known at once). `done` must
  // not block. The request is the backend's to keep until the call ends.
  // These defaults make the blocking call on the caller's thread (a backend
  // with no callback path of its own: a test's mock).
  using AllocateDone = std::function<void(absl::StatusOr<v1beta1::AllocateResponse>)>;
  virtual void AllocateAsync(v1beta1::AllocateRequest request, absl::Duration timeout,
                             const grpc::ServerContextBase* caller, AllocateDone done) {
    done(Allocate(request, timeout, caller));
  }
  using PreferredDone =
      std::function<void(absl::StatusOr<v1beta1::PreferredAllocationResponse>)>;
  virtual void GetPreferredAllocationAsync(v1beta1::PreferredAllocationRequest request,
                                           absl::Duration timeout,
                                           const grpc::ServerContextBase* caller,
                                           PreferredDone done) {
    done(GetPreferredAllocation(request, timeout, caller));
  }
  virtual void PreStartContainerAsync(v1beta1::PreStartContainerRequest request,
                                      absl::Duration timeout,
                                      const grpc::ServerContextBase* caller,
                                      std::function<void(absl::Status)> done) {
    done(PreStartContainer(request, timeout, caller));
  }

  // Asks the plugin something cheap, for the watchdog (backend_watchdog.h),
  // with no thread waiting: `done` gets OK for any answer (an error the
  // plugin sent back is an answer too), kDeadlineExceeded if none came
  // within `timeout`, kUnavailable if the plugin could not be reached,
  // kCancelled if Stop() withdrew the ask. Called once, on one of gRPC's
  // callback threads (or the caller's); it must not block.
  virtual void ProbeAsync(absl::Duration timeout, std::function<void(absl::Status)> done) = 0;

  // Ends the stream; no callback runs after it returns. Idempotent; from
  // within a callback it returns at once (that callback is the last).
  virtual void Stop() = 0;
};


}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CORE_BACKEND_H_
