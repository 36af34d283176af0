#include "backends/backend.h"

#include <grpcpp/server_context.h>

#include <optional>

#include <atomic>
#include <thread>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/common/files.h"
#include "proxy/common/grpc_util.h"
#include "proxy/common/status_util.h"
#include "proxy/translate/translate.h"

namespace dpproxy {
namespace {

// A backend call's error, naming the backend and the call.
absl::Status CallError(const std::string& endpoint, const char* call, const grpc::Status& s,
                       absl::Duration timeout) {
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat("backend ", endpoint, " did not answer ", call, " within ",
                       absl::FormatDuration(timeout)));
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
      return absl::UnavailableError(absl::StrCat("backend ", endpoint, " is unavailable during ",
                                                 call, ": ", s.error_message()));
    default:
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("backend ", endpoint, " failed ", call, ": ",
                                       s.error_message()));
  }
}

// A context for a call that serves `caller` (the kubelet's call): its
// cancellation and deadline carry over (gRPC's parent-call propagation).
std::unique_ptr<grpc::ClientContext> CallContext(const grpc::ServerContextBase* caller) {
  if (caller == nullptr) return std::make_unique<grpc::ClientContext>();
  return grpc::ClientContext::FromServerContext(*caller);
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// What both adapters share: the channel, the reader thread, Stop().
class BackendBase : public Backend {
 public:
  BackendBase(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch)
      : resource_(std::move(resource)), endpoint_(std::move(endpoint)), channel_(std::move(ch)) {}
  ~BackendBase() override { Stop(); }

  const std::string& endpoint() const override { return endpoint_; }
  const std::string& resource() const override { return resource_; }

  void Start(BackendCallbacks callbacks) override {
    absl::MutexLock lock(&mu_);
    if (started_ || stopped_) return;
    started_ = true;
    callbacks_ = std::move(callbacks);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  void Stop() override {
    std::thread reader;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      if (stream_ctx_ != nullptr) stream_ctx_->TryCancel();
      reader.swap(reader_);
    }
    if (!reader.joinable()) return;
    if (reader.get_id() == std::this_thread::get_id()) {
      reader.detach();  // Stop() from our own callback: the loop ends by itself
    } else {
      reader.join();
    }
  }

 protected:
  // Runs the stream until it ends; returns why.
  virtual grpc::Status Stream(grpc::ClientContext* ctx,
                              const std::function<void(const std::vector<v1beta1::Device>&)>&
                                  on_devices) = 0;

  // The context of the one stream (an adapter may have opened it already).
  virtual std::unique_ptr<grpc::ClientContext> StreamContext() {
    return std::make_unique<grpc::ClientContext>();
  }

  const std::string resource_;
  const std::string endpoint_;
  const std::shared_ptr<grpc::Channel> channel_;

 private:
  void ReadLoop() {
    std::unique_ptr<grpc::ClientContext> ctx = StreamContext();
    BackendCallbacks cb;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) return;
      stream_ctx_ = ctx.get();
      cb = callbacks_;
    }
    grpc::Status s = Stream(ctx.get(), [&](const std::vector<v1beta1::Device>& d) {
      if (cb.on_devices) cb.on_devices(d);
    });
    bool stopped;
    {
      absl::MutexLock lock(&mu_);
      stream_ctx_ = nullptr;
      stopped = stopped_;
    }
    if (!stopped && cb.on_lost) cb.on_lost(DescribeGrpcStatus(s));
  }

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  BackendCallbacks callbacks_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* stream_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread reader_ ABSL_GUARDED_BY(mu_);
};

class V1Beta1Backend final : public BackendBase {
 public:
  V1Beta1Backend(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch,
                 v1beta1::DevicePluginOptions options)
      : BackendBase(std::move(resource), std::move(endpoint), ch),
        stub_(v1beta1::DevicePlugin::NewStub(ch)),
        options_(std::move(options)) {}

  PluginApi api() const override { return PluginApi::kV1Beta1; }
  v1beta1::DevicePluginOptions options() const override { return options_; }

  absl::StatusOr<v1beta1::AllocateResponse> Allocate(
      const v1beta1::AllocateRequest& req, absl::Duration timeout,
      const grpc::ServerContextBase* caller) override {
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller);
    SetDeadline(ctx.get(), timeout);
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub_->Allocate(ctx.get(), req, &resp);
    if (!s.ok()) return CallError(endpoint_, "Allocate", s, timeout);
    if (resp.container_responses_size() != req.container_requests_size()) {
      return absl::InternalError(absl::StrCat(
          "backend ", endpoint_, " answered Allocate with ", resp.container_responses_size(),
          " container responses for ", req.container_requests_size(), " container requests"));
    }
    return resp;
  }

  absl::StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& req, absl::Duration timeout,
      const grpc::ServerContextBase* caller) override {
    if (!options_.get_preferred_allocation_available()) {
      return absl::UnimplementedError(absl::StrCat(
          "backend ", endpoint_, " does not offer GetPreferredAllocation"));
    }
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller);
    SetDeadline(ctx.get(), timeout);
    v1beta1::PreferredAllocationResponse resp;
    grpc::Status s = stub_->GetPreferredAllocation(ctx.get(), req, &resp);
    if (!s.ok()) return CallError(endpoint_, "GetPreferredAllocation", s, timeout);
    return resp;
  }

  absl::Status PreStartContainer(const v1beta1::PreStartContainerRequest& req,
                                 absl::Duration timeout,
                                 const grpc::ServerContextBase* caller) override {
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller);
    SetDeadline(ctx.get(), timeout);
    v1beta1::PreStartContainerResponse resp;
    grpc::Status s = stub_->PreStartContainer(ctx.get(), req, &resp);
    if (!s.ok()) return CallError(endpoint_, "PreStartContainer", s, timeout);
    return absl::OkStatus();
  }

 protected:
  grpc::Status Stream(grpc::ClientContext* ctx,
                      const std::function<void(const std::vector<v1beta1::Device>&)>& on_devices)
      override {
    auto reader = stub_->ListAndWatch(ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
      on_devices(std::vector<v1beta1::Device>(resp.devices().begin(), resp.devices().end()));
    }
    return reader->Finish();
  }

 private:
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
  const v1beta1::DevicePluginOptions options_;
};

class V1AlphaBackend final : public BackendBase {
 public:
  V1AlphaBackend(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch)
      : BackendBase(std::move(resource), std::move(endpoint), ch),
        stub_(deviceplugin::DevicePlugin::NewStub(ch)) {}

  // Opens the stream and waits (up to `timeout`) for its first list: the
  // proof that the socket serves v1alpha, since v1alpha has no call without
  // side effects. The open stream becomes the backend's one stream, so the
  // plugin sees a single ListAndWatch. kFailedPrecondition if the service
  // is unknown there; kDeadlineExceeded if no list came in time.
  absl::Status OpenStream(absl::Duration timeout) {
    pre_ctx_ = std::make_unique<grpc::ClientContext>();
    pre_reader_ = stub_->ListAndWatch(pre_ctx_.get(), deviceplugin::Empty());
    absl::Notification read;
    std::thread watchdog([this, &read, timeout] {
      if (!read.WaitForNotificationWithTimeout(timeout)) pre_ctx_->TryCancel();
    });
    deviceplugin::ListAndWatchResponse first;
    const bool got = pre_reader_->Read(&first);
    read.Notify();
    watchdog.join();
    if (got) {
      pre_first_ = std::move(first);
      return absl::OkStatus();
    }
    grpc::Status s = pre_reader_->Finish();
    pre_reader_.reset();
    pre_ctx_.reset();
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the socket at ", endpoint_, " does not serve the v1alpha DevicePlugin API (",
          DescribeGrpcStatus(s), ")"));
    }
    if (s.error_code() == grpc::StatusCode::CANCELLED) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the v1alpha plugin at ", endpoint_, " sent no device list within ",
          absl::FormatDuration(timeout)));
    }
    return absl::UnavailableError(absl::StrCat("the v1alpha plugin at ", endpoint_,
                                               " ended its stream: ", DescribeGrpcStatus(s)));
  }

  PluginApi api() const override { return PluginApi::kV1Alpha; }
  v1beta1::DevicePluginOptions options() const override { return V1AlphaBackendOptions(); }

  absl::StatusOr<v1beta1::AllocateResponse> Allocate(
      const v1beta1::AllocateRequest& req, absl::Duration timeout,
      const grpc::ServerContextBase* caller) override {
    // v1alpha allocates one container per call: fan out in order, merge in
    // order, fail the whole request if any container fails. One deadline
    // covers the whole fan-out.
    const absl::Time deadline = absl::Now() + timeout;
    v1beta1::AllocateResponse out;
    for (int i = 0; i < req.container_requests_size(); ++i) {
      std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller);
      ctx->set_deadline(absl::ToChronoTime(deadline));
      deviceplugin::AllocateResponse part;
      grpc::Status s =
          stub_->Allocate(ctx.get(), ToV1AlphaAllocate(req.container_requests(i)), &part);
      if (!s.ok()) {
        absl::Status e = CallError(endpoint_, "Allocate", s, timeout);
        if (req.container_requests_size() > 1) {
          return absl::Status(e.code(), absl::StrCat(e.message(), " (container request ", i + 1,
                                                     " of ", req.container_requests_size(), ")"));
        }
        return e;
      }
      *out.add_container_responses() = FromV1AlphaResponse(part);
    }
    return out;
  }

  absl::StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest&, absl::Duration,
      const grpc::ServerContextBase*) override {
    return absl::UnimplementedError(absl::StrCat(
        "backend ", endpoint_, " speaks v1alpha, which has no GetPreferredAllocation"));
  }

  absl::Status PreStartContainer(const v1beta1::PreStartContainerRequest&, absl::Duration,
                                 const grpc::ServerContextBase*) override {
    return absl::OkStatus();  // v1alpha has no PreStartContainer: nothing to do
  }

 protected:
  grpc::Status Stream(grpc::ClientContext* ctx,
                      const std::function<void(const std::vector<v1beta1::Device>&)>& on_devices)
      override {
    std::unique_ptr<grpc::ClientReader<deviceplugin::ListAndWatchResponse>> reader =
        std::move(pre_reader_);
    if (reader != nullptr && pre_first_.has_value()) {
      on_devices(FromV1AlphaDevices(*pre_first_));  // the list the probe read
      pre_first_.reset();
    } else {
      reader = stub_->ListAndWatch(ctx, deviceplugin::Empty());
    }
    deviceplugin::ListAndWatchResponse resp;
    while (reader->Read(&resp)) on_devices(FromV1AlphaDevices(resp));
    return reader->Finish();
  }

  std::unique_ptr<grpc::ClientContext> StreamContext() override {
    if (pre_ctx_ != nullptr) return std::move(pre_ctx_);
    return BackendBase::StreamContext();
  }

 private:
  std::unique_ptr<deviceplugin::DevicePlugin::Stub> stub_;
  // The stream OpenStream() opened, until the reader thread takes it over.
  std::unique_ptr<grpc::ClientContext> pre_ctx_;
  std::unique_ptr<grpc::ClientReader<deviceplugin::ListAndWatchResponse>> pre_reader_;
  std::optional<deviceplugin::ListAndWatchResponse> pre_first_;
};

}  // namespace

std::string ApiVersionString(PluginApi api) {
  return api == PluginApi::kV1Alpha ? "v1alpha2" : "v1beta1";
}

absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(const std::string& resource,
                                                        const std::string& socket_path,
                                                        PluginApi api,
                                                        absl::Duration dial_timeout) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  std::shared_ptr<grpc::Channel> channel = MakeUnixChannel(socket_path);
  if (!WaitForConnected(channel.get(), dial_timeout).ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach device plugin at ", socket_path,
                                               " within ", absl::FormatDuration(dial_timeout)));
  }
  if (api == PluginApi::kV1Alpha) {
    // A socket that does not serve v1alpha (a v1beta1-only plugin, a
    // registration socket) is never attached in place of a working backend.
    auto backend = std::make_shared<V1AlphaBackend>(resource, socket_path, channel);
    DPP_RETURN_IF_ERROR(backend->OpenStream(dial_timeout));
    return std::shared_ptr<Backend>(std::move(backend));
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, dial_timeout);
  v1beta1::DevicePluginOptions options;
  grpc::Status s = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("device plugin at ", socket_path,
                                     " did not answer GetDevicePluginOptions: ",
                                     s.error_message()));
  }
  return std::shared_ptr<Backend>(
      std::make_shared<V1Beta1Backend>(resource, socket_path, channel, options));
}

absl::StatusOr<PluginApi> ProbeBackendApi(const std::string& socket_path,
                                          absl::Duration timeout) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  std::shared_ptr<grpc::Channel> channel = MakeUnixChannel(socket_path);
  if (!WaitForConnected(channel.get(), timeout).ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach device plugin at ", socket_path));
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  v1beta1::DevicePluginOptions options;
  grpc::Status s = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &options);
  if (s.ok()) return PluginApi::kV1Beta1;
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return PluginApi::kV1Alpha;
  return absl::UnavailableError(absl::StrCat("cannot tell the API of the device plugin at ",
                                             socket_path, ": ", DescribeGrpcStatus(s)));
}

}  // namespace dpproxy
