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
    // v1alpha allocates one container per call: fan out in order, merge in
    // order, fail the whole request if any container fails. One deadline
    // covers the whole fan-out.
    const absl::Time deadline = absl::Now() + timeout;
    v1beta1::AllocateResponse out;
    for (int i = 0; i < req.container_requests_size(); ++i) {
      std::unique_ptr<grpc::ClientContext> ctx =
          CallContext(caller, std::max(absl::ZeroDuration(), deadline - absl::Now()));
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
