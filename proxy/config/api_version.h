// File: api_version.h
//
// The device-plugin API versions dpproxy speaks, on either side: one type,
// one spelling for people (flags, files, status: "v1alpha", "v1beta1"), one
// for the wire (Register's version string: "v1alpha2", "v1beta1"), parsed in
// one place.
//
//   DPP_ASSIGN_OR_RETURN(std::optional<ApiVersion> api,
//                        ParseApiVersion(flag, /*allow_auto=*/true));
//   if (!api) ...  // "auto": negotiate or probe
#ifndef DPPROXY_PROXY_CONFIG_API_VERSION_H_
#define DPPROXY_PROXY_CONFIG_API_VERSION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

enum class ApiVersion {
  kV1Alpha,  // package deviceplugin, Register version "v1alpha2" (Kubernetes 1.9)
  kV1Beta1,  // package v1beta1 (1.10 and later)
};

// "v1alpha" or "v1beta1".
absl::string_view ApiName(ApiVersion api);
// The version string of a Register call: "v1alpha2" or "v1beta1".
absl::string_view ApiWireVersion(ApiVersion api);

// "v1alpha" (or its wire spelling "v1alpha2") and "v1beta1"; with
// `allow_auto`, "auto" gives nullopt. kInvalidArgument listing the choices.
absl::StatusOr<std::optional<ApiVersion>> ParseApiVersion(absl::string_view text,
                                                          bool allow_auto);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CONFIG_API_VERSION_H_
