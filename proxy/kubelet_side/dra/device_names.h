// File: device_names.h
//
// DRA device names for device-plugin device IDs. A ResourceSlice device's
// name must be a DNS label (lowercase letters, digits and '-', starting and
// ending with a letter or digit, at most 63 characters; KEP-4381);
// device-plugin IDs are any string ("GPU-6f3a9c1e-...", "0000:3b:00.0").
// An ID that already is a DNS label keeps its name; any other ID is named
// as ResourcePolicy::compact_ids names it ("c" and 13 base32 characters of
// its 64-bit FNV-1a hash): the same on every node and in every run, so
// nothing needs persisting. The original ID goes into the slice as an
// attribute, and DraDeviceNames maps names back.
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_DEVICE_NAMES_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_DEVICE_NAMES_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dpproxy {

// The DRA device name of one device-plugin ID.
std::string DraDeviceName(absl::string_view device_id);

// Names of one resource's devices, both ways.
class DraDeviceNames {
 public:
  // kFailedPrecondition naming both IDs if two IDs get one name (an ID
  // that is itself another's hashed name; a 64-bit hash collision).
  static absl::StatusOr<DraDeviceNames> For(const std::vector<std::string>& ids);

  // "" if `id` is not one of the devices.
  std::string NameOf(absl::string_view id) const;
  // "" if no device has that name.
  std::string IdOf(absl::string_view name) const;

 private:
  absl::flat_hash_map<std::string, std::string> name_of_;  // id -> name
  absl::flat_hash_map<std::string, std::string> id_of_;    // name -> id
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_DEVICE_NAMES_H_
