// SamplePlugin's options (sample_plugin.h): the names it derives from its
// resource, its device IDs, and what it refuses to start with.
#include "tools/sample_plugin/sample_plugin_internal.h"

namespace dpproxy::sample {

std::string ResourceDomain(const std::string& resource) {
  return resource.substr(0, resource.find('/'));
}

std::string ResourceShortName(const std::string& resource) {
  size_t slash = resource.find('/');
  return slash == std::string::npos ? resource : resource.substr(slash + 1);
}

std::string EnvName(const std::string& resource) {
  std::string n = ResourceShortName(resource);
  for (char& c : n) c = absl::ascii_isalnum(static_cast<unsigned char>(c)) ? absl::ascii_toupper(c) : '_';
  return absl::StrCat("SAMPLE_", n, "_DEVICES");
}

std::string DefaultSocketName(const SamplePluginOptions& o) {
  if (!o.socket_name.empty()) return o.socket_name;
  if (o.fault == "shared-socket") return "sample.sock";  // whatever the resource
  std::string n = ResourceShortName(o.resource);
  for (char& c : n) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
  }
  return absl::StrCat("sample-", n, ".sock");
}

std::string SocketPathFor(const SamplePluginOptions& o) {
  if (o.registration == RegistrationMode::kPluginWatcher) {
    return JoinPath(o.plugins_registry_dir, DefaultSocketName(o));
  }
  return JoinPath(DirName(o.kubelet_socket), DefaultSocketName(o));
}

std::string StableUuid(const std::string& resource, int index) {
  // FNV-1a 64 of resource and index, with two different seeds.
  std::string key = absl::StrCat(resource, "#", index);
  uint64_t a = Fnv64(key), b = Fnv64(key, 1469598103934665603ULL);
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32, (a >> 16) & 0xffff,
                         a & 0xffff, b >> 48, b & 0xffffffffffffULL);
}

std::vector<std::string> DeviceIds(const SamplePluginOptions& o) {
  std::vector<std::string> ids;
  // unstable-ids: as a plugin that names devices by something of its own
  // process (an enumeration order, a handle), they differ after a restart.
  const std::string suffix = o.fault == "unstable-ids" ? absl::StrCat("-p", ::getpid()) : "";
  for (int i = 0; i < o.devices; ++i) {
    ids.push_back(absl::StrCat(
        absl::StrReplaceAll(o.id_pattern,
                            {{"{i}", absl::StrCat(i)},
                             {"{uuid}", StableUuid(o.resource, i)},
                             {"{ctrl}", std::string(1, static_cast<char>(i % 32))}}),
        suffix));
  }
  return ids;
}

absl::Status ValidateOptions(const SamplePluginOptions& o) {
  if (absl::Status s = ValidateResourceName(o.resource); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--resource: ", s.message(),
        " (an extended resource name looks like vendor.com/name and is not in the "
        "kubernetes.io namespace)"));
  }
  if (o.devices < 1 || o.devices > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", o.devices, " must be between 1 and 100000"));
  }
  if (absl::StrContains(o.id_pattern, "{ctrl}") && o.devices > 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--id_pattern=\"", o.id_pattern, "\" with --devices=", o.devices,
        ": {ctrl} names at most 32 devices (one control character each)"));
  }
  if (o.devices > 1 && !absl::StrContains(o.id_pattern, "{i}") &&
      !absl::StrContains(o.id_pattern, "{uuid}") && !absl::StrContains(o.id_pattern, "{ctrl}")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--id_pattern=\"", o.id_pattern,
        "\" has neither {i} nor {uuid}, so all devices would have the same ID"));
  }
  if (!o.device_list_fault.empty() &&
      std::find(std::begin(kDeviceListFaults), std::end(kDeviceListFaults),
                o.device_list_fault) == std::end(kDeviceListFaults)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device_list_fault=", o.device_list_fault,
        " is not one of duplicate-id, empty-id, newline-id, unknown-health"));
  }
  if (!o.fault.empty()) {
    if (std::find(std::begin(kPluginFaults), std::end(kPluginFaults), o.fault) ==
        std::end(kPluginFaults)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fault=", o.fault, " is not one of ",
          absl::StrJoin(std::begin(kPluginFaults), std::end(kPluginFaults), ", ")));
    }
    const bool beta_only = o.fault == "cdi-only" || o.fault == "preferred-wrong-size" ||
                           o.fault == "prestart-fails";
    if (beta_only && o.api != ApiVersion::kV1Beta1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fault=", o.fault, " needs --api=v1beta1 (v1alpha has no such field or call)"));
    }
    if (o.fault == "preferred-wrong-size" && !o.preferred) {
      return absl::InvalidArgumentError("--fault=preferred-wrong-size needs --preferred");
    }
    if (o.fault == "prestart-fails" && !o.pre_start_required) {
      return absl::InvalidArgumentError("--fault=prestart-fails needs --pre_start_required");
    }
    if (o.fault == "watcher-wrong-type" && o.registration != RegistrationMode::kPluginWatcher) {
      return absl::InvalidArgumentError(
          "--fault=watcher-wrong-type needs --registration=plugin-watcher");
    }
  }
  for (const std::string& id : DeviceIds(o)) {
    if (id.empty() || id.size() > 63) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--id_pattern gives device ID \"", id, "\" of ", id.size(),
          " characters; IDs must be 1 to 63 characters"));
    }
  }
  if (o.api == ApiVersion::kV1Alpha) {
    if (o.preferred) {
      return absl::InvalidArgumentError(
          "--preferred needs --api=v1beta1 (v1alpha has no GetPreferredAllocation)");
    }
    if (o.pre_start_required) {
      return absl::InvalidArgumentError(
          "--pre_start_required needs --api=v1beta1 (v1alpha has no PreStartContainer)");
    }
    if (o.numa_nodes > 0) {
      return absl::InvalidArgumentError(
          "--numa_nodes needs --api=v1beta1 (v1alpha devices have no topology)");
    }
  }
  if (o.numa_nodes < 0 || o.numa_nodes > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--numa_nodes=", o.numa_nodes, " must be between 0 and 64"));
  }
  if (!o.flip_device.empty()) {
    std::vector<std::string> ids = DeviceIds(o);
    if (std::find(ids.begin(), ids.end(), o.flip_device) == ids.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--flip_device=", o.flip_device, " is not one of the devices (", ids.front(),
          " ... ", ids.back(), ")"));
    }
    if (o.flip_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--flip_device needs a positive --flip_interval");
    }
  }
  if (o.flip_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--flip_count=", o.flip_count, " must be 0 (until stopped) or more"));
  }
  if (o.registration == RegistrationMode::kKubelet) {
    DPP_RETURN_IF_ERROR(ValidateSocketPath(o.kubelet_socket));
  }
  if (absl::StrContains(DefaultSocketName(o), "/")) {
    return absl::InvalidArgumentError("--socket_name must be a file name, not a path");
  }
  return ValidateSocketPath(SocketPathFor(o));
}

}  // namespace dpproxy::sample
