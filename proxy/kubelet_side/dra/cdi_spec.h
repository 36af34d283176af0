// File: cdi_spec.h
//
// What a DRA driver hands the kubelet instead of an Allocate answer: CDI
// device names, backed by a CDI spec file the container runtime reads
// (the CDI specification, cncf-tags/container-device-interface SPEC.md;
// docs/dra.md). dpproxy writes one spec per prepared claim, named
// by the claim's UID, from the device plugin's container responses:
//
//   envs                 -> containerEdits.env ("K=V", sorted by key)
//   devices              -> containerEdits.deviceNodes {path, hostPath, permissions}
//   mounts               -> containerEdits.mounts {hostPath, containerPath, options}
//   cdi_devices          -> returned as CDI device names unchanged (the
//                           plugin's own specs back them)
//   annotations          -> nothing: CDI has no container annotations (counted)
//
// Example, for driver gpu.vendor.com, claim 5b1f..., device gpu-0:
//   {"cdiVersion":"0.6.0","kind":"gpu.vendor.com/claim","devices":[
//    {"name":"5b1f...-gpu-0","containerEdits":{"env":["GPU=0"],
//     "deviceNodes":[{"path":"/dev/gpu0","hostPath":"/dev/gpu0","permissions":"rw"}]}}]}
// and the kubelet is given "gpu.vendor.com/claim=5b1f...-gpu-0".
#ifndef DPPROXY_PROXY_KUBELET_SIDE_DRA_CDI_SPEC_H_
#define DPPROXY_PROXY_KUBELET_SIDE_DRA_CDI_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/v1beta1/api.pb.h"
#include "proxy/translate/translate.h"

namespace dpproxy {

// The CDI version written: the oldest that has every edit used (env,
// deviceNodes with permissions, mounts with options), so that runtimes
// with older CDI libraries (containerd 1.7, CRI-O) read it.
inline constexpr char kCdiVersion[] = "0.6.0";

// One prepared device: its DRA name and the plugin's answer for it.
struct PreparedDevice {
  std::string device_name;  // DRA device name (a DNS label)
  v1beta1::ContainerAllocateResponse response;
};

struct ClaimCdiSpec {
  std::string json;  // the spec file's contents
  // Per device (same order): the CDI names to give the kubelet.
  std::vector<std::vector<std::string>> cdi_device_ids;
  Loss loss;  // annotations CDI cannot carry
};

// "<driver>/claim": the CDI kind of dpproxy's specs for a driver.
std::string CdiKind(const std::string& driver);

// The spec for one claim. kInvalidArgument naming the field for what a
// runtime would refuse (a relative path, an env name with '=' or empty).
absl::StatusOr<ClaimCdiSpec> BuildClaimCdiSpec(const std::string& driver,
                                               const std::string& claim_uid,
                                               const std::vector<PreparedDevice>& devices);

// <cdi_dir>/dpproxy-<driver>-<claim_uid>.json
std::string ClaimCdiSpecPath(const std::string& cdi_dir, const std::string& driver,
                             const std::string& claim_uid);

// Writes the spec atomically (a runtime never reads half a file), mode
// 0644: runtimes read it, only dpproxy writes it.
absl::Status WriteClaimCdiSpec(const std::string& cdi_dir, const std::string& driver,
                               const std::string& claim_uid, const std::string& json);

// Removes a claim's spec; a spec already gone is not an error (unprepare
// must succeed, and may be called again).
absl::Status RemoveClaimCdiSpec(const std::string& cdi_dir, const std::string& driver,
                                const std::string& claim_uid);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_SIDE_DRA_CDI_SPEC_H_
