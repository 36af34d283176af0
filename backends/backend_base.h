// File: backend_base.h
//
// What the v1alpha and v1beta1 adapters share: call errors and contexts,
// the one ListAndWatch stream read on gRPC's callback threads (ListReader),
// and BackendBase (the channel, the stream, Stop()).
#ifndef DPPROXY_BACKENDS_BACKEND_BASE_H_
#define DPPROXY_BACKENDS_BACKEND_BASE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proxy/core/backend.h"
#include "proxy/core/device_list.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/rpc/grpc_status.h"

namespace dpproxy {

// A backend call's error, naming the backend and the call: kDeadlineExceeded
// if it did not answer in time, kUnavailable if it is gone (or the call was
// cancelled), the plugin's own code otherwise.
absl::Status CallError(const std::string& endpoint, const char* call, const grpc::Status& s,
                       absl::Duration timeout);

// A context for a call that serves `caller` (the kubelet's call; may be
// null): its cancellation and deadline carry over (gRPC's parent-call
// propagation). The deadline is `timeout` from now, or the caller's if
// sooner.
std::unique_ptr<grpc::ClientContext> CallContext(const grpc::ServerContextBase* caller,
                                                 absl::Duration timeout);

// The backend's one ListAndWatch stream, read on gRPC's callback threads:
// no thread of ours waits on it. Lists that arrive before Deliver() are kept
// (the newest; a v1alpha probe reads the first list before the backend is
// attached). After Stop() returns no callback runs; Stop() from within a
// callback returns at once (the stream ends by itself, and the reader keeps
// itself alive until gRPC is done with it).
class ListStream {
 public:
  virtual ~ListStream() = default;
  // Waits up to `timeout` for the first list or the end of the stream;
  // true if a list came.
  virtual bool WaitForFirst(absl::Duration timeout) = 0;
  // Starts delivering lists (first any kept one) and, once, the end.
  virtual void Deliver(std::function<void(std::shared_ptr<const DeviceList>)> on_devices,
                       std::function<void(const grpc::Status&)> on_end) = 0;
  // How the stream ended (only meaningful once it has).
  virtual grpc::Status status() = 0;
  virtual void Stop() = 0;
};

// The server-streaming method `name` on `channel` (registered with it, as
// a generated stub does, unless there is none: a test's mock stub).
inline grpc::internal::RpcMethod StreamMethod(const char* name,
                                              const std::shared_ptr<grpc::Channel>& channel) {
  using grpc::internal::RpcMethod;
  return channel != nullptr ? RpcMethod(name, RpcMethod::SERVER_STREAMING, channel)
                            : RpcMethod(name, RpcMethod::SERVER_STREAMING);
}

// Reads ListAndWatch as the messages' bytes, each made a DeviceList
// straight from them: no parsed message of every device is built. Bytes
// that are not a ListAndWatchResponse end the stream with INTERNAL naming
// the problem, as a typed reader's failed parse would.
class ListReader final : public grpc::ClientReadReactor<grpc::ByteBuffer>,
                         public ListStream,
                         public std::enable_shared_from_this<ListReader> {
 public:
  // `method`: "/v1beta1.DevicePlugin/ListAndWatch" or the v1alpha one, on
  // `channel`; `with_topology` false for v1alpha, which has none.
  static std::shared_ptr<ListReader> Start(grpc::ChannelInterface* channel,
                                           const grpc::internal::RpcMethod& method,
                                           bool with_topology);

  bool WaitForFirst(absl::Duration timeout) override;
  void Deliver(std::function<void(std::shared_ptr<const DeviceList>)> on_devices,
               std::function<void(const grpc::Status&)> on_end) override;
  grpc::Status status() override;
  void Stop() override;

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  explicit ListReader(bool with_topology);

  // Decides, in one step, what a read or the end becomes: delivered now
  // (true: this thread is marked as in a callback until Leave()), kept for
  // Deliver() (a list before it), or dropped (after Stop(), or an end
  // Deliver() already reported). Waits while Deliver() hands over a kept
  // list, so the order holds.
  bool Enter(bool end, std::shared_ptr<const DeviceList>* list);
  void Leave();

  const bool with_topology_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer request_;  // Empty: no bytes
  grpc::ByteBuffer msg_;  // the read in flight; touched only by gRPC and its callbacks
  absl::Mutex mu_;
  std::shared_ptr<const DeviceList> kept_ ABSL_GUARDED_BY(mu_);
  std::function<void(std::shared_ptr<const DeviceList>)> on_devices_;  // set once, before started_
  std::function<void(const grpc::Status&)> on_end_;
  // Why the reader ended the stream itself (bytes it could not read).
  std::optional<grpc::Status> refused_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool end_delivered_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread::id callback_thread_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<ListReader> self_ ABSL_GUARDED_BY(mu_);
};

// The method the watchdog calls (ProbeAsync): a service no plugin has.
inline constexpr absl::string_view kWatchdogMethod = "/dpproxy.Watchdog/Probe";

// What both adapters share: the channel, the one stream, Stop().
class BackendBase : public Backend {
 public:
  BackendBase(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch);
  ~BackendBase() override { Stop(); }

  const std::string& endpoint() const override { return endpoint_; }
  const std::string& resource() const override { return resource_; }

  void Start(BackendCallbacks callbacks) override {
    std::shared_ptr<ListStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (started_ || stopped_) return;
      started_ = true;
      stream_ = OpenList();
      stream = stream_;
    }
    stream->Deliver(
        [cb = callbacks](std::shared_ptr<const DeviceList> d) {
          if (cb.on_devices) cb.on_devices(std::move(d));
        },
        [cb = callbacks](const grpc::Status& s) {
          if (cb.on_lost) cb.on_lost(DescribeGrpcStatus(s));
        });
  }

  // Ends the stream and withdraws the watchdog's asks in flight.
  void Stop() override;

  // A call of kWatchdogMethod, which no plugin serves: the plugin's gRPC
  // server answers Unimplemented at once if the process serves at all.
  // Not GetDevicePluginOptions: some plugins crash when asked for their
  // options, and v1alpha has no such call.
  void ProbeAsync(absl::Duration timeout, std::function<void(absl::Status)> done) override;

 protected:
  // The one stream: opened now, or the one a probe already opened.
  virtual std::shared_ptr<ListStream> OpenList() = 0;

  const std::string resource_;
  const std::string endpoint_;
  const std::shared_ptr<grpc::Channel> channel_;

 private:
  // The watchdog's asks in flight, cancelled by Stop(). Shared with each
  // ask's callback, which may run after the backend is gone.
  class Probes;
  const std::shared_ptr<Probes> probes_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ListStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_BACKEND_BASE_H_
