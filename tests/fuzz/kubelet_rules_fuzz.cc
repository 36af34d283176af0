// The kubelet's registration rules: any string is accepted or refused with
// a bounded message, never a crash.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proxy/kubelet_rules/kubelet_rules.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  const size_t bound = 4 * dpproxy::kMaxEchoBytes + 200;  // \xNN escapes, the suffix
  for (const absl::Status& st :
       {dpproxy::ValidateResourceName(s), dpproxy::ValidateEndpointName(s),
        dpproxy::ValidateV1Beta1Version(s), dpproxy::ValidateV1AlphaVersion(s),
        dpproxy::ValidateDeviceId(s), dpproxy::ValidateWatcherVersions({s})}) {
    if (st.message().size() > bound + 200) std::abort();
  }
  (void)dpproxy::IsExtendedResourceName(s);
  if (dpproxy::GoQuote(s).size() > bound) std::abort();
  return 0;
}
