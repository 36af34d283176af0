#include "backends/backend.h"

#include <grpcpp/server_context.h>

#include <optional>

#include <atomic>
#include <thread>

#include <grpcpp/support/client_callback.h>

#include <grpcpp/client_context.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
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
  virtual void Deliver(std::function<void(const std::vector<v1beta1::Device>&)> on_devices,
                       std::function<void(const grpc::Status&)> on_end) = 0;
  // How the stream ended (only meaningful once it has).
  virtual grpc::Status status() = 0;
  virtual void Stop() = 0;
};

template <typename Request, typename Msg>
class ListReader final : public grpc::ClientReadReactor<Msg>,
                         public ListStream,
                         public std::enable_shared_from_this<ListReader<Request, Msg>> {
 public:
  using Translate = std::function<std::vector<v1beta1::Device>(const Msg&)>;
  using Open = std::function<void(grpc::ClientContext*, const Request*, grpc::ClientReadReactor<Msg>*)>;

  static std::shared_ptr<ListReader> Start(const Open& open, Translate translate) {
    auto r = std::shared_ptr<ListReader>(new ListReader(std::move(translate)));
    {
      absl::MutexLock lock(&r->mu_);
      r->self_ = r;  // alive until gRPC is done with it (OnDone)
    }
    open(&r->ctx_, &r->request_, r.get());
    r->StartRead(&r->msg_);
    r->StartCall();
    return r;
  }

  bool WaitForFirst(absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
                               return r->kept_.has_value() || r->done_;
                             },
                             this),
                         timeout);
    return kept_.has_value();
  }

  void Deliver(std::function<void(const std::vector<v1beta1::Device>&)> on_devices,
               std::function<void(const grpc::Status&)> on_end) override {
    std::optional<Msg> kept;
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      on_devices_ = std::move(on_devices);
      on_end_ = std::move(on_end);
      kept.swap(kept_);
      ended = done_ && !end_delivered_;
      end_delivered_ = end_delivered_ || ended;
      // Callbacks run one at a time, in order: gRPC's wait until these are
      // delivered.
      delivering_ = true;
    }
    if (kept.has_value()) on_devices_(translate_(*kept));
    if (ended) on_end_(status());
    absl::MutexLock lock(&mu_);
    delivering_ = false;
    started_ = true;
  }

  grpc::Status status() override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      if (std::this_thread::get_id() == callback_thread_) return;  // ends by itself
    }
    ctx_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&finished_));
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (Enter(/*end=*/false)) {
      on_devices_(translate_(msg_));
      Leave();
    }
    this->StartRead(&msg_);
  }

  void OnDone(const grpc::Status& s) override {
    {
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
    }
    if (Enter(/*end=*/true)) {
      on_end_(s);
      Leave();
    }
    std::shared_ptr<ListReader> keep;
    absl::MutexLock lock(&mu_);
    finished_ = true;
    keep.swap(self_);  // released after the lock, as the last thing done
  }

 private:
  explicit ListReader(Translate translate) : translate_(std::move(translate)) {}

  // Decides, in one step, what a read or the end becomes: delivered now
  // (true: this thread is marked as in a callback until Leave()), kept for
  // Deliver() (a list before it), or dropped (after Stop(), or an end
  // Deliver() already reported). Waits while Deliver() hands over a kept
  // list, so the order holds.
  bool Enter(bool end) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](ListReader* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return !r->delivering_; },
        this));
    if (stopped_) return false;
    if (!started_) {
      if (!end) kept_ = msg_;  // the newest list, for Deliver()
      return false;
    }
    if (end) {
      if (end_delivered_) return false;
      end_delivered_ = true;
    }
    callback_thread_ = std::this_thread::get_id();
    return true;
  }
  void Leave() {
    absl::MutexLock lock(&mu_);
    callback_thread_ = std::thread::id();
  }

  const Translate translate_;
  grpc::ClientContext ctx_;
  Request request_;
  Msg msg_;  // the read in flight; touched only by gRPC and its callbacks
  absl::Mutex mu_;
  std::optional<Msg> kept_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::vector<v1beta1::Device>&)> on_devices_;  // set once, before started_
  std::function<void(const grpc::Status&)> on_end_;
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

// What both adapters share: the channel, the one stream, Stop().
class BackendBase : public Backend {
 public:
  BackendBase(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch)
      : resource_(std::move(resource)), endpoint_(std::move(endpoint)), channel_(std::move(ch)) {}
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
        [cb = callbacks](const std::vector<v1beta1::Device>& d) {
          if (cb.on_devices) cb.on_devices(d);
        },
        [cb = callbacks](const grpc::Status& s) {
          if (cb.on_lost) cb.on_lost(DescribeGrpcStatus(s));
        });
  }

  void Stop() override {
    std::shared_ptr<ListStream> stream;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      stream = stream_;
    }
    if (stream != nullptr) stream->Stop();
  }

 protected:
  // The one stream: opened now, or the one a probe already opened.
  virtual std::shared_ptr<ListStream> OpenList() = 0;

  const std::string resource_;
  const std::string endpoint_;
  const std::shared_ptr<grpc::Channel> channel_;

 private:
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<ListStream> stream_ ABSL_GUARDED_BY(mu_);
};

class V1Beta1Backend final : public BackendBase {
 public:
  V1Beta1Backend(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch,
                 v1beta1::DevicePluginOptions options)
      : BackendBase(std::move(resource), std::move(endpoint), ch),
        stub_(v1beta1::DevicePlugin::NewStub(ch)),
        options_(std::move(options)) {}

  ApiVersion api() const override { return ApiVersion::kV1Beta1; }
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
  std::shared_ptr<ListStream> OpenList() override {
    auto* stub = stub_.get();
    return ListReader<v1beta1::Empty, v1beta1::ListAndWatchResponse>::Start(
        [stub](grpc::ClientContext* ctx, const v1beta1::Empty* req,
               grpc::ClientReadReactor<v1beta1::ListAndWatchResponse>* r) {
          stub->async()->ListAndWatch(ctx, req, r);
        },
        [](const v1beta1::ListAndWatchResponse& resp) {
          return std::vector<v1beta1::Device>(resp.devices().begin(), resp.devices().end());
        });
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
    std::shared_ptr<ListStream> stream = NewList();
    if (stream->WaitForFirst(timeout)) {
      absl::MutexLock lock(&pre_mu_);
      pre_ = std::move(stream);
      return absl::OkStatus();
    }
    stream->Stop();  // nothing came in time: cancelled, and ended
    const grpc::Status s = stream->status();
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

  ApiVersion api() const override { return ApiVersion::kV1Alpha; }
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
  std::shared_ptr<ListStream> OpenList() override {
    {
      absl::MutexLock lock(&pre_mu_);
      // The probe's stream, its first list kept.
      if (pre_ != nullptr) return std::move(pre_);
    }
    return NewList();
  }

 public:
  ~V1AlphaBackend() override { Stop(); }

  // Also ends the probe's stream if it was never taken over.
  void Stop() override {
    std::shared_ptr<ListStream> pre;
    {
      absl::MutexLock lock(&pre_mu_);
      pre.swap(pre_);
    }
    if (pre != nullptr) pre->Stop();
    BackendBase::Stop();
  }

 private:
  std::shared_ptr<ListStream> NewList() {
    auto* stub = stub_.get();
    return ListReader<deviceplugin::Empty, deviceplugin::ListAndWatchResponse>::Start(
        [stub](grpc::ClientContext* ctx, const deviceplugin::Empty* req,
               grpc::ClientReadReactor<deviceplugin::ListAndWatchResponse>* r) {
          stub->async()->ListAndWatch(ctx, req, r);
        },
        [](const deviceplugin::ListAndWatchResponse& resp) { return FromV1AlphaDevices(resp); });
  }

  std::unique_ptr<deviceplugin::DevicePlugin::Stub> stub_;
  // The stream OpenStream() opened, until Start() takes it over.
  absl::Mutex pre_mu_;
  std::shared_ptr<ListStream> pre_ ABSL_GUARDED_BY(pre_mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(const std::string& resource,
                                                        const std::string& socket_path,
                                                        ApiVersion api,
                                                        absl::Duration dial_timeout,
                                                        int max_receive_bytes) {
  DPP_RETURN_IF_ERROR(ValidateSocketPath(socket_path));
  std::shared_ptr<grpc::Channel> channel = MakeUnixChannel(socket_path, max_receive_bytes);
  if (!WaitForConnected(channel.get(), dial_timeout).ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach device plugin at ", socket_path,
                                               " within ", absl::FormatDuration(dial_timeout)));
  }
  if (api == ApiVersion::kV1Alpha) {
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

absl::StatusOr<ApiVersion> ProbeBackendApi(const std::string& socket_path,
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
  if (s.ok()) return ApiVersion::kV1Beta1;
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return ApiVersion::kV1Alpha;
  return absl::UnavailableError(absl::StrCat("cannot tell the API of the device plugin at ",
                                             socket_path, ": ", DescribeGrpcStatus(s)));
}

}  // namespace dpproxy
