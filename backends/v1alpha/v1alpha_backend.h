// File: v1alpha_backend.h
//
// A v1alpha (Kubernetes 1.9) device plugin as dpproxy's backend: requests
// and answers are translated (proxy/translate), an Allocate of several
// containers becomes one call per container (all or nothing), and
// PreStartContainer, GetPreferredAllocation and topology do not exist.
#ifndef DPPROXY_BACKENDS_V1ALPHA_V1ALPHA_BACKEND_H_
#define DPPROXY_BACKENDS_V1ALPHA_V1ALPHA_BACKEND_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "backends/backend_base.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

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
    absl::Notification answered;
    absl::StatusOr<v1beta1::AllocateResponse> out;
    AllocateAsync(req, timeout, caller, [&](absl::StatusOr<v1beta1::AllocateResponse> r) {
      out = std::move(r);
      answered.Notify();
    });
    answered.WaitForNotification();
    return out;
  }

  // v1alpha allocates one container per call: the calls go out one after
  // another (each started from the previous one's callback), are merged in
  // order, and any failure fails the whole request. One deadline covers
  // them all.
  void AllocateAsync(v1beta1::AllocateRequest req, absl::Duration timeout,
                     const grpc::ServerContextBase* caller, AllocateDone done) override {
    auto fan = std::make_shared<FanOut>();
    fan->req = std::move(req);
    fan->deadline = absl::Now() + timeout;
    fan->timeout = timeout;
    fan->caller = caller;
    fan->done = std::move(done);
    Next(std::move(fan));
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
  // One Allocate's calls, one per container request.
  struct FanOut {
    v1beta1::AllocateRequest req;
    absl::Time deadline;
    absl::Duration timeout;
    const grpc::ServerContextBase* caller = nullptr;
    AllocateDone done;
    v1beta1::AllocateResponse out;
    // The call in flight.
    std::unique_ptr<grpc::ClientContext> ctx;
    deviceplugin::AllocateRequest part_req;
    deviceplugin::AllocateResponse part;
  };

  // Starts the call for the next container request, or answers.
  void Next(std::shared_ptr<FanOut> fan) {
    const int i = fan->out.container_responses_size();
    if (i == fan->req.container_requests_size()) {
      fan->done(std::move(fan->out));
      return;
    }
    fan->ctx = CallContext(fan->caller, std::max(absl::ZeroDuration(), fan->deadline - absl::Now()));
    fan->part_req = ToV1AlphaAllocate(fan->req.container_requests(i));
    fan->part.Clear();
    FanOut* f = fan.get();
    stub_->async()->Allocate(f->ctx.get(), &f->part_req, &f->part,
                             [this, fan = std::move(fan), i](grpc::Status s) mutable {
                               if (!s.ok()) {
                                 absl::Status e = CallError(endpoint_, "Allocate", s, fan->timeout);
                                 const int n = fan->req.container_requests_size();
                                 if (n > 1) {
                                   e = absl::Status(e.code(),
                                                    absl::StrCat(e.message(), " (container request ",
                                                                 i + 1, " of ", n, ")"));
                                 }
                                 fan->done(std::move(e));
                                 return;
                               }
                               *fan->out.add_container_responses() = FromV1AlphaResponse(fan->part);
                               Next(std::move(fan));
                             });
  }

  // The stream, read as bytes; v1alpha devices have no topology.
  std::shared_ptr<ListStream> NewList() {
    return ListReader::Start(channel_.get(), list_method_, /*with_topology=*/false);
  }

  std::unique_ptr<deviceplugin::DevicePlugin::Stub> stub_;
  const grpc::internal::RpcMethod list_method_=
      StreamMethod("/deviceplugin.DevicePlugin/ListAndWatch", channel_);
  // The stream OpenStream() opened, until Start() takes it over.
  absl::Mutex pre_mu_;
  std::shared_ptr<ListStream> pre_ ABSL_GUARDED_BY(pre_mu_);
};

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_V1ALPHA_V1ALPHA_BACKEND_H_
