#include "backends/connect.h"

#include "absl/strings/str_cat.h"
#include "backends/backend_base.h"
#include "backends/v1alpha/v1alpha_backend.h"
#include "backends/v1beta1/v1beta1_backend.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "proxy/util/status_macros.h"

namespace dpproxy {

absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(
    const std::string& resource, const std::string& socket_path, ApiVersion api,
    absl::Duration dial_timeout, int max_receive_bytes,
    const std::optional<v1beta1::DevicePluginOptions>& registered) {
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
  if (registered.has_value()) {
    // Options the plugin registered with: a plugin written for kubelets up
    // to 1.24 may answer nothing sensible to GetDevicePluginOptions, which
    // those kubelets never call.
    return std::shared_ptr<Backend>(
        std::make_shared<V1Beta1Backend>(resource, socket_path, channel, *registered));
  }
  auto stub = v1beta1::DevicePlugin::NewStub(channel);
  std::unique_ptr<grpc::ClientContext> ctx = CallContext(nullptr, dial_timeout);
  v1beta1::DevicePluginOptions options;
  grpc::Status s = stub->GetDevicePluginOptions(ctx.get(), v1beta1::Empty(), &options);
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
  std::unique_ptr<grpc::ClientContext> ctx = CallContext(nullptr, timeout);
  v1beta1::DevicePluginOptions options;
  grpc::Status s = stub->GetDevicePluginOptions(ctx.get(), v1beta1::Empty(), &options);
  if (s.ok()) return ApiVersion::kV1Beta1;
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return ApiVersion::kV1Alpha;
  return absl::UnavailableError(absl::StrCat("cannot tell the API of the device plugin at ",
                                             socket_path, ": ", DescribeGrpcStatus(s)));
}

}  // namespace dpproxy
