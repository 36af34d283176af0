// File: kubelet_checkpoint.h
//
// Reads the kubelet's device-manager checkpoint
// (<kubelet_root>/device-plugins/kubelet_internal_checkpoint), read-only, in
// every layout a kubelet has written (the device manager's checkpoint, kubernetes/kubernetes
// pkg/kubelet/cm/devicemanager/checkpoint):
//
//   1.9-1.10   {"PodDeviceEntries":[...],"RegisteredDevices":{...}}
//   1.11-1.19  {"Data":{...same...},"Checksum":N}, DeviceIDs a list
//   1.20+      the same, DeviceIDs per NUMA node: {"0":[...]} / {"-1":[...]}
//
// The kubelet lists every live pod's devices there in every release, so it
// tells dpproxy which journaled allocations a kubelet still holds where the
// pod-resources API is missing (1.9, or not mounted), and whether a kubelet
// that restarted kept its allocations. The checksum is not verified (it is
// computed over Go type names); the kubelet itself decides whether it trusts
// the file, and dpproxy compares what it says with its own journal.
#ifndef DPPROXY_PROXY_KUBELET_KUBELET_CHECKPOINT_H_
#define DPPROXY_PROXY_KUBELET_KUBELET_CHECKPOINT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dpproxy {

struct KubeletCheckpoint {
  enum class Layout {
    kV19,           // no Data wrapper (1.9, 1.10)
    kDeviceList,    // Data wrapper, DeviceIDs a list (1.11-1.19)
    kDevicesPerNuma // Data wrapper, DeviceIDs per NUMA node (1.20+)
  };
  struct Entry {
    std::string pod_uid;
    std::string container;
    std::string resource;
    std::vector<std::string> device_ids;
  };
  Layout layout = Layout::kDevicesPerNuma;
  std::vector<Entry> entries;
  // resource -> device IDs the kubelet had registered (healthy) when it wrote
  std::map<std::string, std::vector<std::string>> registered;
};

// kDataLoss naming what is wrong if `json` is not a checkpoint in any of
// the layouts above.
absl::StatusOr<KubeletCheckpoint> ParseKubeletCheckpoint(const std::string& json);

// "1.9-1.10", "1.11-1.19", "1.20+": the kubelets that wrote the layout.
const char* LayoutWriters(KubeletCheckpoint::Layout layout);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBELET_KUBELET_CHECKPOINT_H_
