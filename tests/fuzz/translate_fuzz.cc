// The translators: any v1beta1 or v1alpha message (from fuzzed bytes)
// converts without crashing, and one container response comes back per
// container request.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proto/v1alpha/api.pb.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/translate/translate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  v1beta1::ContainerAllocateResponse resp;
  if (resp.ParseFromString(bytes)) {
    dpproxy::Loss loss;
    (void)dpproxy::ToV1AlphaResponse(resp, &loss);
  }
  v1beta1::ListAndWatchResponse list;
  if (list.ParseFromString(bytes)) {
    dpproxy::Loss loss;
    deviceplugin::ListAndWatchResponse out = dpproxy::ToV1AlphaList(list, &loss);
    if (out.devices_size() != list.devices_size()) std::abort();
  }
  deviceplugin::AllocateRequest alpha;
  if (alpha.ParseFromString(bytes)) {
    v1beta1::AllocateRequest beta = dpproxy::FromV1AlphaAllocate(alpha);
    if (beta.container_requests_size() != 1) std::abort();
  }
  deviceplugin::AllocateResponse alpha_resp;
  if (alpha_resp.ParseFromString(bytes)) (void)dpproxy::FromV1AlphaResponse(alpha_resp);
  return 0;
}
