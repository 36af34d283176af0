// File: v1beta1_backend.h
//
// A v1beta1 device plugin as dpproxy's backend: calls pass through with a
// deadline and the kubelet's cancellation; an Allocate answer with a
// container response count other than the request's is refused (the
// kubelet would fail the pod later, less clearly).
#ifndef DPPROXY_BACKENDS_V1BETA1_V1BETA1_BACKEND_H_
#define DPPROXY_BACKENDS_V1BETA1_V1BETA1_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/backend_base.h"
#include "proto/v1beta1/api.grpc.pb.h"

namespace dpproxy {

class V1Beta1Backend final : public BackendBase {
 public:
  // Calls go through `stub` (a test passes a generated mock); the stream
  // through `ch`.
  V1Beta1Backend(std::string resource, std::string endpoint, std::shared_ptr<grpc::Channel> ch,
                 v1beta1::DevicePluginOptions options,
                 std::unique_ptr<v1beta1::DevicePlugin::StubInterface> stub = nullptr)
      : BackendBase(std::move(resource), std::move(endpoint), ch),
        callback_stub_(stub == nullptr ? v1beta1::DevicePlugin::NewStub(ch) : nullptr),
        stub_(stub != nullptr ? std::move(stub) : v1beta1::DevicePlugin::NewStub(ch)),
        options_(std::move(options)) {}

  ApiVersion api() const override { return ApiVersion::kV1Beta1; }
  v1beta1::DevicePluginOptions options() const override { return options_; }

  absl::StatusOr<v1beta1::AllocateResponse> Allocate(
      const v1beta1::AllocateRequest& req, absl::Duration timeout,
      const grpc::ServerContextBase* caller) override {
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller, timeout);
    v1beta1::AllocateResponse resp;
    grpc::Status s = stub_->Allocate(ctx.get(), req, &resp);
    return AllocateOutcome(s, req.container_requests_size(), std::move(resp), timeout);
  }

  // gRPC's callback call: no thread waits for the plugin.
  void AllocateAsync(v1beta1::AllocateRequest req, absl::Duration timeout,
                     const grpc::ServerContextBase* caller, AllocateDone done) override {
    if (callback_stub_ == nullptr) {  // a test's mock stub: its blocking call
      done(Allocate(req, timeout, caller));
      return;
    }
    const int requests = req.container_requests_size();
    CallAsync<v1beta1::AllocateRequest, v1beta1::AllocateResponse>(
        std::move(req), timeout, caller,
        [](auto* stub, auto* ctx, auto* r, auto* p, auto f) {
          stub->Allocate(ctx, r, p, std::move(f));
        },
        [this, requests, timeout, done = std::move(done)](grpc::Status s,
                                                          v1beta1::AllocateResponse resp) {
          done(AllocateOutcome(s, requests, std::move(resp), timeout));
        });
  }

  absl::StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& req, absl::Duration timeout,
      const grpc::ServerContextBase* caller) override {
    if (!options_.get_preferred_allocation_available()) {
      return absl::UnimplementedError(absl::StrCat(
          "backend ", endpoint_, " does not offer GetPreferredAllocation"));
    }
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller, timeout);
    v1beta1::PreferredAllocationResponse resp;
    grpc::Status s = stub_->GetPreferredAllocation(ctx.get(), req, &resp);
    if (!s.ok()) return CallError(endpoint_, "GetPreferredAllocation", s, timeout);
    return resp;
  }

  void GetPreferredAllocationAsync(v1beta1::PreferredAllocationRequest req,
                                   absl::Duration timeout, const grpc::ServerContextBase* caller,
                                   PreferredDone done) override {
    if (callback_stub_ == nullptr || !options_.get_preferred_allocation_available()) {
      done(GetPreferredAllocation(req, timeout, caller));  // a mock's call, or the refusal
      return;
    }
    CallAsync<v1beta1::PreferredAllocationRequest, v1beta1::PreferredAllocationResponse>(
        std::move(req), timeout, caller,
        [](auto* stub, auto* ctx, auto* r, auto* p, auto f) {
          stub->GetPreferredAllocation(ctx, r, p, std::move(f));
        },
        [this, timeout, done = std::move(done)](grpc::Status s,
                                                v1beta1::PreferredAllocationResponse resp) {
          if (!s.ok()) return done(CallError(endpoint_, "GetPreferredAllocation", s, timeout));
          done(std::move(resp));
        });
  }

  absl::Status PreStartContainer(const v1beta1::PreStartContainerRequest& req,
                                 absl::Duration timeout,
                                 const grpc::ServerContextBase* caller) override {
    std::unique_ptr<grpc::ClientContext> ctx = CallContext(caller, timeout);
    v1beta1::PreStartContainerResponse resp;
    grpc::Status s = stub_->PreStartContainer(ctx.get(), req, &resp);
    if (!s.ok()) return CallError(endpoint_, "PreStartContainer", s, timeout);
    return absl::OkStatus();
  }

  void PreStartContainerAsync(v1beta1::PreStartContainerRequest req, absl::Duration timeout,
                              const grpc::ServerContextBase* caller,
                              std::function<void(absl::Status)> done) override {
    if (callback_stub_ == nullptr) {
      done(PreStartContainer(req, timeout, caller));
      return;
    }
    CallAsync<v1beta1::PreStartContainerRequest, v1beta1::PreStartContainerResponse>(
        std::move(req), timeout, caller,
        [](auto* stub, auto* ctx, auto* r, auto* p, auto f) {
          stub->PreStartContainer(ctx, r, p, std::move(f));
        },
        [this, timeout, done = std::move(done)](grpc::Status s,
                                                v1beta1::PreStartContainerResponse) {
          done(s.ok() ? absl::OkStatus() : CallError(endpoint_, "PreStartContainer", s, timeout));
        });
  }

 protected:
  std::shared_ptr<ListStream> OpenList() override {
    return ListReader::Start(channel_.get(), list_method_, /*with_topology=*/true);
  }

 private:
  // One unary call through gRPC's callback API: `start` begins it on the
  // stub's async interface, `end` gets the status and the response. The
  // context, request and response live until the call ends.
  template <typename Req, typename Resp, typename Start, typename End>
  void CallAsync(Req req, absl::Duration timeout, const grpc::ServerContextBase* caller,
                 Start start, End end) {
    struct Call {
      std::unique_ptr<grpc::ClientContext> ctx;
      Req req;
      Resp resp;
      End end;
    };
    auto* c = new Call{CallContext(caller, timeout), std::move(req), {}, std::move(end)};
    start(callback_stub_->async(), c->ctx.get(), &c->req, &c->resp,
          std::function<void(grpc::Status)>([c](grpc::Status s) {
            std::unique_ptr<Call> call(c);
            call->end(std::move(s), std::move(call->resp));
          }));
  }

  // The plugin's answer to Allocate, checked: one container response per
  // container request.
  absl::StatusOr<v1beta1::AllocateResponse> AllocateOutcome(const grpc::Status& s, int requests,
                                                           v1beta1::AllocateResponse resp,
                                                           absl::Duration timeout) const {
    if (!s.ok()) return CallError(endpoint_, "Allocate", s, timeout);
    if (resp.container_responses_size() != requests) {
      return absl::InternalError(absl::StrCat(
          "backend ", endpoint_, " answered Allocate with ", resp.container_responses_size(),
          " container responses for ", requests, " container requests"));
    }
    return resp;
  }

  // The calls through gRPC's callback API (none with a test's mock stub),
  // and the blocking calls.
  const std::unique_ptr<v1beta1::DevicePlugin::Stub> callback_stub_;
  std::unique_ptr<v1beta1::DevicePlugin::StubInterface> stub_;
  // ListAndWatch, read as bytes (ListReader).
  const grpc::internal::RpcMethod list_method_=
      StreamMethod("/v1beta1.DevicePlugin/ListAndWatch", channel_);
  const v1beta1::DevicePluginOptions options_;
};

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_V1BETA1_V1BETA1_BACKEND_H_
