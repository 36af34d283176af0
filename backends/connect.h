// File: connect.h
//
// Makes a Backend of a plugin's socket: dials it, finds out or checks which
// DevicePlugin service it serves, and returns the adapter for that version.
//
//   absl::StatusOr<std::shared_ptr<Backend>> b =
//       ConnectBackend("vendor.com/gpu", "/var/lib/dpproxy/device-plugins/gpu.sock",
//                      ApiVersion::kV1Alpha, absl::Seconds(10));
#ifndef DPPROXY_BACKENDS_CONNECT_H_
#define DPPROXY_BACKENDS_CONNECT_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proxy/core/backend.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/config/proxy_config.h"

namespace dpproxy {

// Dials the plugin (up to `dial_timeout`) and, for v1beta1, takes its
// options from `registered` (those it registered with, as kubelets up to
// 1.24 read them, or remembered from an earlier dpproxy) or, without them,
// asks for them (GetDevicePluginOptions, as 1.25+ do: a static backend,
// which never registers). kUnavailable naming the socket if
// it cannot be reached. Messages from the plugin may be up to
// `max_receive_bytes`.
absl::StatusOr<std::shared_ptr<Backend>> ConnectBackend(
    const std::string& resource, const std::string& socket_path, ApiVersion api,
    absl::Duration dial_timeout, int max_receive_bytes = kDefaultBackendMaxListBytes,
    const std::optional<v1beta1::DevicePluginOptions>& registered = std::nullopt);

// Finds out which DevicePlugin service a plugin serves: v1beta1 if
// GetDevicePluginOptions answers, v1alpha if that service is unknown.
absl::StatusOr<ApiVersion> ProbeBackendApi(const std::string& socket_path,
                                          absl::Duration timeout);

}  // namespace dpproxy

#endif  // DPPROXY_BACKENDS_CONNECT_H_
