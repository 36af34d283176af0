#include "proxy/config/api_version.h"

#include "absl/strings/str_cat.h"
#include "proxy/kubelet_rules/kubelet_rules.h"

namespace dpproxy {

absl::string_view ApiName(ApiVersion api) {
  return api == ApiVersion::kV1Alpha ? "v1alpha" : "v1beta1";
}

absl::string_view ApiWireVersion(ApiVersion api) {
  return api == ApiVersion::kV1Alpha ? kV1AlphaVersion : kV1Beta1Version;
}

absl::StatusOr<std::optional<ApiVersion>> ParseApiVersion(absl::string_view text,
                                                          bool allow_auto) {
  if (allow_auto && text == "auto") return std::optional<ApiVersion>();
  if (text == "v1alpha" || text == kV1AlphaVersion) return ApiVersion::kV1Alpha;
  if (text == "v1beta1") return ApiVersion::kV1Beta1;
  return absl::InvalidArgumentError(absl::StrCat(text, " is not ",
                                                 allow_auto ? "auto, " : "",
                                                 "v1alpha or v1beta1"));
}

}  // namespace dpproxy
