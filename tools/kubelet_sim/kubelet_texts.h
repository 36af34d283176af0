// File: kubelet_texts.h
//
// The kubelet's own checks of a device plugin's registration and the texts
// of its errors, as the simulator plays them: written from the kubelet's
// sources (pkg/kubelet/cm/devicemanager/plugin/v1beta1/api.go, server.go
// and handler.go; k8s.io/apimachinery's validation for names) and from
// what real kubelets answered, not shared with dpproxy. dpproxy keeps its
// own (proxy/kubelet_rules), so a wrong rule cannot pass in both at once:
// the tests that put dpproxy in front of this simulator compare the two.
#ifndef DPPROXY_TOOLS_KUBELET_SIM_KUBELET_TEXTS_H_
#define DPPROXY_TOOLS_KUBELET_SIM_KUBELET_TEXTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dpproxy::sim {

// Register's version, per API: "v1alpha2" (1.9 serves v1alpha), "v1beta1"
// (1.10 and later).
inline constexpr absl::string_view kV1AlphaVersion = "v1alpha2";
inline constexpr absl::string_view kV1Beta1Version = "v1beta1";

inline constexpr absl::string_view kHealthy = "Healthy";
inline constexpr absl::string_view kUnhealthy = "Unhealthy";

// Files the kubelet keeps in <root>/device-plugins/.
inline constexpr absl::string_view kKubeletSocketName = "kubelet.sock";
inline constexpr absl::string_view kKubeletCheckpointName = "kubelet_internal_checkpoint";
inline constexpr absl::string_view kDeprecationMarkerName = "DEPRECATION";

// The plugin watcher's type for device plugins (GetInfo's type).
inline constexpr absl::string_view kDevicePluginType = "DevicePlugin";

// Go's %q of a string (strconv.Quote): double quotes; \a \b \f \n \r \t
// \v, \\ and \" escaped; other control bytes and bytes of invalid UTF-8 as
// \xNN. Whole: the kubelet echoes what it was sent, however long.
std::string GoQuote(absl::string_view s);

// Whether `name` may be served by a device plugin: Kubernetes'
// IsExtendedResourceName (not native: it has a domain and that domain is
// not kubernetes.io; not "requests."-prefixed; and "requests.<name>" is a
// qualified name).
bool IsExtendedResourceName(absl::string_view name);

// Kubernetes' IsDNS1123Label (k8s.io/apimachinery validation): 1 to 63
// characters of [a-z0-9-], starting and ending alphanumeric. The API
// server's rule for the names of devices in a ResourceSlice.
bool IsDns1123Label(absl::string_view s);

// Register's checks, each the kubelet's error (gRPC UNKNOWN, as a Go error
// returned from a handler arrives) or OK:
//   the ResourceName "x" is invalid
//   requested API version "v1" is not supported by kubelet. Supported version is ["v1beta1"]
//   (1.9: ... Supported version is "v1alpha2")
absl::Status CheckResourceName(absl::string_view name);
absl::Status CheckV1Beta1Version(absl::string_view version);
absl::Status CheckV1AlphaVersion(absl::string_view version);

// The plugin watcher's check of GetInfo's supported versions:
//   manager version, v1beta1, is not among plugin supported versions [v1 v2]
absl::Status CheckWatcherVersions(const std::vector<std::string>& versions);

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_KUBELET_TEXTS_H_
