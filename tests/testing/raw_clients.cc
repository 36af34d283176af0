#include "tests/testing/raw_clients.h"

#include <grpcpp/client_context.h>

#include "absl/time/clock.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/rpc/grpc_util.h"

namespace dpproxy::testing {
namespace {

// A sync kubelet may dial back for up to 10 s before answering.
constexpr absl::Duration kRegisterDeadline = absl::Seconds(20);

template <typename Stub, typename Request, typename Empty>
grpc::Status Register(Stub& stub, const std::string& version, const std::string& resource,
                      const std::string& endpoint) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kRegisterDeadline));
  Request req;
  req.set_version(version);
  req.set_resource_name(resource);
  req.set_endpoint(endpoint);
  Empty resp;
  return stub.Register(&ctx, req, &resp);
}

}  // namespace

grpc::Status RegisterV1Beta1(const std::string& socket, const std::string& version,
                             const std::string& resource, const std::string& endpoint) {
  auto stub = v1beta1::Registration::NewStub(MakeUnixChannel(socket));
  return Register<v1beta1::Registration::Stub, v1beta1::RegisterRequest, v1beta1::Empty>(
      *stub, version, resource, endpoint);
}

grpc::Status RegisterV1Alpha(const std::string& socket, const std::string& version,
                             const std::string& resource, const std::string& endpoint) {
  auto stub = deviceplugin::Registration::NewStub(MakeUnixChannel(socket));
  return Register<deviceplugin::Registration::Stub, deviceplugin::RegisterRequest,
                  deviceplugin::Empty>(*stub, version, resource, endpoint);
}

}  // namespace dpproxy::testing
