// DeviceList::FromWire against protobuf itself. Read as v1beta1, any bytes
// it accepts protobuf accepts as a ListAndWatchResponse and the other way
// round, and its list is that message's devices (fields no Device has
// dropped). Read as v1alpha, the same against v1alpha's message, which has
// no topology. Every device is found by its ID (the first one holding it).
#include <cstdint>
#include <cstdlib>
#include <string>

#include <google/protobuf/util/message_differencer.h>

#include "proto/v1alpha/api.pb.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/core/device_list.h"

namespace {

template <typename List>
void Check(const std::string& bytes, bool with_topology) {
  List want;
  const bool protobuf_ok = want.ParseFromString(bytes);
  auto list = dpproxy::DeviceList::FromWire(bytes, with_topology);
  if (protobuf_ok != list.ok()) std::abort();
  if (!list.ok()) return;
  want.DiscardUnknownFields();
  List got;
  if (!got.ParseFromString((*list)->wire())) std::abort();
  got.DiscardUnknownFields();
  if (!google::protobuf::util::MessageDifferencer::Equals(got, want)) std::abort();
  if ((*list)->size() != want.devices_size()) std::abort();
  for (int i = 0; i < want.devices_size(); ++i) {
    std::optional<int> at = (*list)->Find(want.devices(i).id());
    if (!at.has_value() || *at > i) std::abort();
    if ((*list)->device(*at).id != want.devices(i).id()) std::abort();
    if ((*list)->device(i).health != want.devices(i).health()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Check<v1beta1::ListAndWatchResponse>(bytes, /*with_topology=*/true);
  Check<deviceplugin::ListAndWatchResponse>(bytes, /*with_topology=*/false);
  return 0;
}
