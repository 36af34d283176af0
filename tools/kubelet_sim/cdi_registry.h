// File: cdi_registry.h
//
// What the container runtime (containerd, CRI-O) does with the CDI device names
// a DRA driver hands the kubelet: it looks each fully qualified name
// ("vendor.com/class=name") up in the spec files of its CDI directories
// (/etc/cdi, /var/run/cdi) and applies the spec's edits to the container (the
// CDI specification, cncf-tags/container-device-interface SPEC.md). A name no
// spec defines, or that two specs define, fails the container
// (CreateContainerError); the kubelet sim reports it with the claim instead, so
// a test sees a driver's answer as a pod would.
//
// Specs are read at each call (runtimes watch the directories), as JSON (.json)
// or YAML (.yaml); a file that does not parse is named in `warnings` and
// skipped, as runtimes skip it.
//
// CdiResolution r = ResolveCdiDevices({"/var/run/cdi"},
// {"gpu.vendor.com/claim=u1-gpu"}); r.errors    // "" per name that resolved
// r.edits     // {"env": [...], "deviceNodes": [...], "mounts": [...]}
#ifndef DPPROXY_TOOLS_KUBELET_SIM_CDI_REGISTRY_H_
#define DPPROXY_TOOLS_KUBELET_SIM_CDI_REGISTRY_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpproxy::sim {

struct CdiResolution {
  // The container's edits from every name that resolved, in the order of
  // the names: each spec's own containerEdits once, then the device's.
  nlohmann::json edits = {{"env", nlohmann::json::array()},
                          {"deviceNodes", nlohmann::json::array()},
                          {"mounts", nlohmann::json::array()}};
  std::vector<std::string> errors;    // one per name that did not resolve, naming why
  std::vector<std::string> warnings;  // spec files skipped, and why
};

CdiResolution ResolveCdiDevices(const std::vector<std::string>& dirs,
                                const std::vector<std::string>& names);

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_CDI_REGISTRY_H_
