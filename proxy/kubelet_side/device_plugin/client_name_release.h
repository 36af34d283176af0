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

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
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

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DEVICE_PLUGIN_CLIENT_NAME_RELEASE_H_
