#include "proxy/kubelet/kubelet_checkpoint.h"

#include "proxy/util/json_depth.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace dpproxy {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& what) {
  return absl::DataLossError(absl::StrCat("not a kubelet device-manager checkpoint: ", what));
}

}  // namespace

const char* LayoutWriters(KubeletCheckpoint::Layout layout) {
  switch (layout) {
    case KubeletCheckpoint::Layout::kV19: return "1.9-1.10";
    case KubeletCheckpoint::Layout::kDeviceList: return "1.11-1.19";
    case KubeletCheckpoint::Layout::kDevicesPerNuma: return "1.20+";
  }
  return "?";
}

namespace {

// One PodDeviceEntries entry; `per_numa` is set when its DeviceIDs are a
// map from NUMA node to list (1.20 and later).
absl::StatusOr<KubeletCheckpoint::Entry> ParseEntry(const Json& e, bool* per_numa) {
  if (!e.is_object()) return Bad("an entry is not an object");
  KubeletCheckpoint::Entry entry;
  auto str = [&](const char* key, std::string* out) -> bool {
    auto it = e.find(key);
    if (it == e.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  if (!str("PodUID", &entry.pod_uid) || !str("ContainerName", &entry.container) ||
      !str("ResourceName", &entry.resource)) {
    return Bad("an entry lacks PodUID, ContainerName or ResourceName");
  }
  auto ids = e.find("DeviceIDs");
  if (ids == e.end() || ids->is_null()) {
    // no devices
  } else if (ids->is_array()) {
    for (const Json& id : *ids) {
      if (!id.is_string()) return Bad("a device ID is not a string");
      entry.device_ids.push_back(id.get<std::string>());
    }
  } else if (ids->is_object()) {
    *per_numa = true;
    for (auto it = ids->begin(); it != ids->end(); ++it) {
      if (!it->is_array()) return Bad("DeviceIDs of a NUMA node are not a list");
      for (const Json& id : *it) {
        if (!id.is_string()) return Bad("a device ID is not a string");
        entry.device_ids.push_back(id.get<std::string>());
      }
    }
  } else {
    return Bad("DeviceIDs is neither a list nor a map");
  }
  return entry;
}

}  // namespace

absl::StatusOr<KubeletCheckpoint> ParseKubeletCheckpoint(const std::string& text) {
  if (absl::Status s = CheckJsonDepth(text); !s.ok()) return Bad(std::string(s.message()));
  Json top = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded()) return Bad("not JSON");
  if (!top.is_object()) return Bad("not a JSON object");
  KubeletCheckpoint out;
  const Json* data = &top;
  bool wrapped = false;
  if (top.contains("Data")) {
    if (!top["Data"].is_object()) return Bad("\"Data\" is not an object");
    data = &top["Data"];
    wrapped = true;
  }
  if (!data->contains("PodDeviceEntries")) return Bad("no \"PodDeviceEntries\"");
  const Json& entries = (*data)["PodDeviceEntries"];
  if (!entries.is_array() && !entries.is_null()) return Bad("\"PodDeviceEntries\" is not a list");
  bool per_numa = false;
  if (entries.is_array()) {
    for (const Json& e : entries) {
      absl::StatusOr<KubeletCheckpoint::Entry> entry = ParseEntry(e, &per_numa);
      if (!entry.ok()) return entry.status();
      out.entries.push_back(*std::move(entry));
    }
  }
  if (data->contains("RegisteredDevices") && (*data)["RegisteredDevices"].is_object()) {
    const Json& reg = (*data)["RegisteredDevices"];
    for (auto it = reg.begin(); it != reg.end(); ++it) {
      std::vector<std::string>& ids = out.registered[it.key()];
      if (!it->is_array()) continue;
      for (const Json& id : *it) {
        if (id.is_string()) ids.push_back(id.get<std::string>());
      }
    }
  }
  out.layout = !wrapped ? KubeletCheckpoint::Layout::kV19
                        : per_numa ? KubeletCheckpoint::Layout::kDevicesPerNuma
                                   : KubeletCheckpoint::Layout::kDeviceList;
  return out;
}

}  // namespace dpproxy
