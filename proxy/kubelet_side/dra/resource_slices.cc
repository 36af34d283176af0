#include "proxy/kubelet_side/dra/resource_slices.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet_side/dra/device_names.h"

namespace dpproxy {

using Json = nlohmann::json;

std::string PoolName(const PoolSpec& pool) {
  return absl::StrCat(pool.node, "/", absl::StrReplaceAll(pool.resource, {{"/", "-"}}));
}

absl::StatusOr<std::vector<Json>> BuildResourceSlices(const PoolSpec& pool,
                                                      const std::vector<SliceDevice>& devices) {
  const bool basic = pool.api_version == "resource.k8s.io/v1beta1";
  if (!basic && pool.api_version != "resource.k8s.io/v1" &&
      pool.api_version != "resource.k8s.io/v1beta2") {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ResourceSlices of ", pool.api_version,
                     " (known: resource.k8s.io/v1, v1beta2, v1beta1)"));
  }
  std::vector<std::string> ids;
  ids.reserve(devices.size());
  for (const SliceDevice& d : devices) ids.push_back(d.id);
  absl::StatusOr<DraDeviceNames> names = DraDeviceNames::For(ids);
  if (!names.ok()) return names.status();
  std::vector<const SliceDevice*> published;
  for (const SliceDevice& d : devices) {
    if (d.healthy) published.push_back(&d);
  }
  // At least one slice, even empty: a pool with no healthy device says so.
  const size_t count =
      std::max<size_t>(1, (published.size() + kMaxDevicesPerSlice - 1) / kMaxDevicesPerSlice);
  const std::string pool_name = PoolName(pool);
  const std::string prefix =
      absl::StrCat(pool.node, "-", pool.driver, "-", CompactDeviceId(pool_name));
  std::vector<Json> slices;
  for (size_t s = 0; s < count; ++s) {
    Json list = Json::array();
    const size_t end = std::min(published.size(), (s + 1) * kMaxDevicesPerSlice);
    for (size_t i = s * kMaxDevicesPerSlice; i < end; ++i) {
      const SliceDevice& d = *published[i];
      Json attributes = {{kDeviceIdAttribute, {{"string", d.id}}}};
      if (!d.numa_nodes.empty()) attributes[kNumaNodeAttribute] = {{"int", d.numa_nodes[0]}};
      Json device = {{"name", names->NameOf(d.id)}};
      if (basic) {
        device["basic"] = {{"attributes", attributes}};
      } else {
        device["attributes"] = attributes;
      }
      list.push_back(std::move(device));
    }
    slices.push_back(
        {{"apiVersion", pool.api_version},
         {"kind", "ResourceSlice"},
         {"metadata", {{"name", absl::StrCat(prefix, "-", s)}}},
         {"spec",
          {{"driver", pool.driver},
           {"nodeName", pool.node},
           {"pool",
            {{"name", pool_name},
             {"generation", pool.generation},
             {"resourceSliceCount", static_cast<int64_t>(count)}}},
           {"devices", std::move(list)}}}});
  }
  return slices;
}

}  // namespace dpproxy
