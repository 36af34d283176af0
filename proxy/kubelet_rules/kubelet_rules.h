// File: kubelet_rules.h
//
// The checks a kubelet applies to a device plugin's registration, with the
// kubelet's own error texts (kubernetes/kubernetes pkg/kubelet/cm/devicemanager and
// pkg/kubelet/pluginmanager). The
// kubelet simulator and dpproxy's backend registration server both use these,
// so a plugin sees the same answer from either.
//
//   if (absl::Status s = ValidateResourceName(req.resource_name()); !s.ok())
//     return ToGrpcStatus(s);  // code UNKNOWN, as the Go kubelet returns
#ifndef DPPROXY_PROXY_KUBELET_RULES_KUBELET_RULES_H_
#define DPPROXY_PROXY_KUBELET_RULES_KUBELET_RULES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

// Register version strings.
inline constexpr absl::string_view kV1AlphaVersion = "v1alpha2";  // k8s 1.9
inline constexpr absl::string_view kV1Beta1Version = "v1beta1";   // 1.10+

inline constexpr absl::string_view kHealthy = "Healthy";
inline constexpr absl::string_view kUnhealthy = "Unhealthy";

// The kubelet's socket and checkpoint names inside device-plugins/.
inline constexpr absl::string_view kKubeletSocketName = "kubelet.sock";
inline constexpr absl::string_view kKubeletCheckpointName =
    "kubelet_internal_checkpoint";
inline constexpr absl::string_view kDeprecationMarkerName = "DEPRECATION";

// Plugin-watcher plugin type for device plugins.
inline constexpr absl::string_view kDevicePluginType = "DevicePlugin";

// The largest message a kubelet accepts from a device plugin (gRPC's
// default receive limit; the kubelet sets none): a longer device list fails
// its stream and the resource shows no devices.
inline constexpr size_t kKubeletMaxListBytes = 4 << 20;
// The same limit on any answer the kubelet receives: an AllocateResponse
// over it fails the pod at the kubelet (ResourceExhausted).
inline constexpr size_t kKubeletMaxAnswerBytes = 4 << 20;

// How much of an untrusted string errors, logs and events echo.
inline constexpr size_t kMaxEchoBytes = 256;

// RFC 1123 names as Kubernetes checks them: a subdomain (lower-case
// alphanumeric labels with inner '-', dot-separated, at most 253
// characters), and a label (one such label, at most 63).
bool IsDnsSubdomain(absl::string_view s);
bool IsDnsLabel(absl::string_view s);

// Go's strconv.Quote for the strings that occur here: double quotes,
// backslash escapes for `"`, `\` and control characters. Strings longer
// than kMaxEchoBytes are cut there and followed by `... (N bytes)`. For
// text (errors, log lines).
std::string GoQuote(absl::string_view s);
// The same bound without the quotes, for a structured field (an event's
// JSON value), whose encoding escapes what needs it.
std::string EchoField(absl::string_view s);

// An ID for a table or a line of text: as it is, or GoQuote'd if it has a
// control character (a device ID a plugin names "\x00" is served as it is;
// a terminal must not be given it raw).
std::string PrintableId(absl::string_view id);

// Go's %v of a []string: "[a b c]"; items longer than kMaxEchoBytes are
// cut, and at most 16 items are shown.
std::string GoStringSlice(const std::vector<std::string>& v);

// True if `name` is an extended resource name the kubelet accepts: it
// contains '/', is not in the kubernetes.io namespace, does not start with
// "requests.", and "requests." + name is a valid qualified name (optional
// DNS-subdomain prefix of at most 253 characters, '/', name part of at most
// 63 characters matching [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?).
bool IsExtendedResourceName(absl::string_view name);

// kUnknown `the ResourceName "x" is invalid` unless IsExtendedResourceName.
absl::Status ValidateResourceName(absl::string_view name);

// A v1beta1 kubelet's version check (1.15+ text):
// `requested API version "v1alpha2" is not supported by kubelet. Supported
// version is ["v1beta1"]`.
absl::Status ValidateV1Beta1Version(absl::string_view version);

// A 1.9 kubelet's version check: exact "v1alpha2", else
// `requested API version "x" is not supported by kubelet. Supported version
// is "v1alpha2"`.
absl::Status ValidateV1AlphaVersion(absl::string_view version);

// The plugin-watcher device handler's check: any of `versions` is
// "v1beta1", else `manager version, v1beta1, is not among plugin supported
// versions [a b]`.
absl::Status ValidateWatcherVersions(const std::vector<std::string>& versions);

// Registration endpoints are socket names relative to the device-plugins
// directory. The kubelet joins them without checks; dpproxy refuses names
// that are empty, absolute, escape the directory, contain control
// characters (NUL, newline) or name the registration socket itself, with
// kInvalidArgument.
absl::Status ValidateEndpointName(absl::string_view endpoint);

// A device ID dpproxy passes on: not empty, no control characters (NUL,
// newline, ...). kInvalidArgument naming the (bounded, quoted) ID.
absl::Status ValidateDeviceId(absl::string_view id);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_RULES_KUBELET_RULES_H_
