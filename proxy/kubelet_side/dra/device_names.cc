#include "proxy/kubelet_side/dra/device_names.h"

#include "absl/strings/str_cat.h"
#include "proxy/core/resource.h"
#include "proxy/kubelet_rules/kubelet_rules.h"

namespace dpproxy {

std::string DraDeviceName(absl::string_view device_id) {
  if (IsDnsLabel(device_id)) return std::string(device_id);
  return CompactDeviceId(device_id);
}

absl::StatusOr<DraDeviceNames> DraDeviceNames::For(const std::vector<std::string>& ids) {
  DraDeviceNames out;
  out.name_of_.reserve(ids.size());
  out.id_of_.reserve(ids.size());
  for (const std::string& id : ids) {
    std::string name = DraDeviceName(id);
    auto [it, fresh] = out.id_of_.try_emplace(name, id);
    if (!fresh && it->second != id) {
      return absl::FailedPreconditionError(
          absl::StrCat("device IDs \"", it->second, "\" and \"", id,
                       "\" both get the DRA device name \"", name,
                       "\"; dpproxy cannot publish both (rename one in the plugin, or map it "
                       "with an ID map)"));
    }
    out.name_of_[id] = std::move(name);
  }
  return out;
}

std::string DraDeviceNames::NameOf(absl::string_view id) const {
  auto it = name_of_.find(id);
  return it == name_of_.end() ? std::string() : it->second;
}

std::string DraDeviceNames::IdOf(absl::string_view name) const {
  auto it = id_of_.find(name);
  return it == id_of_.end() ? std::string() : it->second;
}

}  // namespace dpproxy
