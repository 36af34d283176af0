// File: client_name_release.h
//
// Clears a 1.25-1.36 kubelet's record of which client holds a resource
// name, leaving the resource served as it is.
//
// Those kubelets look a resource's client up by name when any stream of
// that resource ends, and disconnect what they find (kubernetes#121994):
// when a replaced endpoint's stream ends, the current one is torn down and
// its devices turn unhealthy. They also enter a new client under the name
// before they dial it and delete the name's entry when GetDevicePluginOptions
// fails (handler.go connectClient, deregisterClient). A registration whose
// GetDevicePluginOptions is refused therefore empties the entry; the
// current client runs on (its stream feeds the devices, its endpoint takes
// Allocates), and the end of any stream of the resource disconnects
// nothing.
//
// Only for a kubelet that asks for the options before it answers Register
// (1.25+): an older one answers at once and dials later, and would make the
// refusing socket its endpoint if it were still there.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_CLIENT_NAME_RELEASE_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_CLIENT_NAME_RELEASE_H_

#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/proxy_config.h"

namespace dpproxy {

// The socket the refusing registration names: `endpoint_socket_name` with
// ".release" before ".sock" ("dpproxy-a.sock" -> "dpproxy-a.release.sock").
std::string ReleaseSocketName(const std::string& endpoint_socket_name);

// Serves a device plugin whose GetDevicePluginOptions is refused at
// ReleaseSocketName(endpoint_socket_name) in the kubelet's device-plugin
// directory, registers it for `resource` at kubelet.sock, and removes it.
// OK once the kubelet asked for the options and refused the registration
// (the name's entry is gone). kFailedPrecondition if the kubelet accepted
// the registration (it answers before it dials: not a 1.25+ kubelet) or
// refused it without asking (version or name), kUnavailable if it did not
// answer within `timeout`.
absl::Status ReleaseClientName(const KubeletSideOptions& kubelet, const std::string& resource,
                               const std::string& endpoint_socket_name,
                               absl::Duration timeout);

// The socket a stopping endpoint registers so that its end is seen:
// ".relist" before ".sock" ("dpproxy-a.sock" -> "dpproxy-a.relist.sock").
std::string RelistSocketName(const std::string& endpoint_socket_name);

// Makes the kubelet disconnect a resource whose record ReleaseClientName
// cleared when dpproxy's endpoint stops: a device plugin at
// RelistSocketName(endpoint_socket_name) that answers
// GetDevicePluginOptions with `options` and streams `devices` (the
// resource's list, sent all Unhealthy: what the kubelet is to see once the
// endpoint is gone), registered for `resource`. A 1.25-1.36 kubelet enters
// it under the resource's name, so the endpoint's end disconnects it; a
// 1.37+ one keeps it beside the endpoint, and disconnects each as it ends.
// Never a registration at the endpoint's own socket while the kubelet
// streams from it: a 1.37 kubelet refuses that ("device plugin already
// connected") and then never disconnects that socket. Serves until
// destroyed; destroy it after the endpoint has stopped.
class Relist {
 public:
  static absl::StatusOr<std::unique_ptr<Relist>> Register(
      const KubeletSideOptions& kubelet, const std::string& resource,
      const std::string& endpoint_socket_name, const v1beta1::DevicePluginOptions& options,
      v1beta1::ListAndWatchResponse devices, absl::Duration timeout);
  ~Relist();

  Relist(const Relist&) = delete;
  Relist& operator=(const Relist&) = delete;

 private:
  class Plugin;
  Relist() = default;
  std::unique_ptr<Plugin> plugin_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_CLIENT_NAME_RELEASE_H_
