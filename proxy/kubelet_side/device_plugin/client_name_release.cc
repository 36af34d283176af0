#include "proxy/kubelet_side/device_plugin/client_name_release.h"

#include <atomic>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/kubelet_rules/kubelet_rules.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

// A device plugin that refuses GetDevicePluginOptions, and counts the asks.
class RefusingPlugin final : public v1beta1::DevicePlugin::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* ctx,
                                                   const v1beta1::Empty*,
                                                   v1beta1::DevicePluginOptions*) override {
    asked_.fetch_add(1);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        "dpproxy: this registration only clears the kubelet's record of the resource's client "
        "(kubernetes#121994); the resource stays served at its endpoint"));
    return reactor;
  }
  int asked() const { return asked_.load(); }

 private:
  std::atomic<int> asked_{0};
};

// Serves `service` at `name` in the kubelet's device-plugin directory
// (mode 0700: only the kubelet, root, may connect).
absl::StatusOr<std::unique_ptr<grpc::Server>> ServeAt(const KubeletSideOptions& kubelet,
                                                      const std::string& name,
                                                      grpc::Service* service) {
  const std::string path = JoinPath(DevicePluginDir(kubelet), name);
  if (absl::Status s = ValidateSocketPath(path); !s.ok()) return s;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(UnixAddress(path), grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return absl::UnavailableError(absl::StrCat("cannot listen on ", path));
  (void)SetMode(path, 0700);
  return server;
}

// Registers `resource` at `name` with the kubelet (v1beta1): the
// kubelet's answer, or kUnavailable if its socket does not answer.
absl::StatusOr<grpc::Status> RegisterAt(const KubeletSideOptions& kubelet,
                                        const std::string& resource, const std::string& name,
                                        const v1beta1::DevicePluginOptions& options,
                                        absl::Duration timeout) {
  const std::string kubelet_sock = KubeletSocketPath(kubelet);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      DialUnixChannel(kubelet_sock, std::min(timeout, absl::Seconds(2)));
  if (!channel.ok()) {
    return absl::UnavailableError(absl::StrCat("kubelet socket ", kubelet_sock,
                                               " is not answering"));
  }
  v1beta1::RegisterRequest req;
  req.set_version(std::string(kV1Beta1Version));
  req.set_endpoint(name);
  req.set_resource_name(resource);
  *req.mutable_options() = options;
  v1beta1::Empty resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return v1beta1::Registration::NewStub(*channel)->Register(&ctx, req, &resp);
}

}  // namespace

// Answers the options, streams the list once and holds the stream open
// until the kubelet or the server ends it; refuses the rest.
class Relist::Plugin final : public v1beta1::DevicePlugin::CallbackService {
 public:
  Plugin(v1beta1::DevicePluginOptions options, v1beta1::ListAndWatchResponse devices)
      : options_(std::move(options)), devices_(std::move(devices)) {}

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* ctx,
                                                   const v1beta1::Empty*,
                                                   v1beta1::DevicePluginOptions* resp) override {
    *resp = options_;
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(
      grpc::CallbackServerContext*, const v1beta1::Empty*) override {
    return new Stream(&devices_);
  }

  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx,
                                     const v1beta1::AllocateRequest*,
                                     v1beta1::AllocateResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                 "dpproxy is stopping: this resource is not served now"));
    return reactor;
  }

 private:
  class Stream final : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
   public:
    explicit Stream(const v1beta1::ListAndWatchResponse* devices) { StartWrite(devices); }
    void OnWriteDone(bool ok) override {
      if (!ok) End();  // else open until cancelled
    }
    void OnCancel() override { End(); }
    void OnDone() override { delete this; }

   private:
    void End() {
      if (!finished_.exchange(true)) Finish(grpc::Status::CANCELLED);
    }
    std::atomic<bool> finished_{false};
  };

  const v1beta1::DevicePluginOptions options_;
  const v1beta1::ListAndWatchResponse devices_;
};

std::string RelistSocketName(const std::string& endpoint_socket_name) {
  absl::string_view stem = endpoint_socket_name;
  if (absl::EndsWith(stem, ".sock")) stem.remove_suffix(5);
  return absl::StrCat(stem, ".relist.sock");
}

absl::StatusOr<std::unique_ptr<Relist>> Relist::Register(
    const KubeletSideOptions& kubelet, const std::string& resource,
    const std::string& endpoint_socket_name, const v1beta1::DevicePluginOptions& options,
    v1beta1::ListAndWatchResponse devices, absl::Duration timeout) {
  const std::string name = RelistSocketName(endpoint_socket_name);
  for (v1beta1::Device& d : *devices.mutable_devices()) d.set_health(std::string(kUnhealthy));
  std::unique_ptr<Relist> r(new Relist());
  r->plugin_ = std::make_unique<Plugin>(options, std::move(devices));
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = ServeAt(kubelet, name, r->plugin_.get());
  if (!server.ok()) return server.status();
  r->server_ = *std::move(server);
  absl::StatusOr<grpc::Status> st = RegisterAt(kubelet, resource, name, options, timeout);
  if (!st.ok()) return st.status();
  if (!st->ok()) {
    return absl::UnavailableError(absl::StrCat("the kubelet refused the registration of ", name,
                                               ": ", GoRpcError(*st)));
  }
  return r;
}

Relist::~Relist() {
  if (server_ == nullptr) return;
  // gRPC removes the socket file as the server shuts down; the stream's
  // cancellation ends it.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  server_->Wait();
}

std::string ReleaseSocketName(const std::string& endpoint_socket_name) {
  absl::string_view stem = endpoint_socket_name;
  if (absl::EndsWith(stem, ".sock")) stem.remove_suffix(5);
  return absl::StrCat(stem, ".release.sock");
}

absl::Status ReleaseClientName(const KubeletSideOptions& kubelet, const std::string& resource,
                               const std::string& endpoint_socket_name,
                               absl::Duration timeout) {
  const std::string name = ReleaseSocketName(endpoint_socket_name);
  RefusingPlugin plugin;
  absl::StatusOr<std::unique_ptr<grpc::Server>> served = ServeAt(kubelet, name, &plugin);
  if (!served.ok()) return served.status();
  std::unique_ptr<grpc::Server> server = *std::move(served);
  struct Stop {
    grpc::Server* server;
    ~Stop() {
      // gRPC removes the socket file as the server shuts down.
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
      server->Wait();
    }
  } stop{server.get()};
  absl::StatusOr<grpc::Status> registered =
      RegisterAt(kubelet, resource, name, v1beta1::DevicePluginOptions(), timeout);
  if (!registered.ok()) return registered.status();
  const grpc::Status& st = *registered;
  if (st.ok()) {
    return absl::FailedPreconditionError(
        "the kubelet accepted a registration it had not asked the options of: it dials after "
        "it answers (a release before 1.25)");
  }
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
      st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat("the kubelet did not answer the registration: ",
                                               GoRpcError(st)));
  }
  if (plugin.asked() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kubelet refused the registration without asking for the options: ", GoRpcError(st)));
  }
  return absl::OkStatus();
}

}  // namespace dpproxy
