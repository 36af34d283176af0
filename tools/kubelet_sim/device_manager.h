// File: device_manager.h
//
// The simulated kubelet's device-manager state, without any I/O: which
// resources are registered through which endpoint, their devices and health,
// the grace period after a plugin is lost, the allocations of pods, the
// kubelet-format checkpoint, and the re-admission rule applied after a restart
// (the kubelet's device manager, kubernetes/kubernetes
// pkg/kubelet/cm/devicemanager). Not thread-safe; KubeletSim guards it with its
// mutex. Time is passed in, so tests control it.
#ifndef DPPROXY_TOOLS_KUBELET_SIM_DEVICE_MANAGER_H_
#define DPPROXY_TOOLS_KUBELET_SIM_DEVICE_MANAGER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/v1beta1/api.pb.h"
#include "tools/kubelet_sim/control.pb.h"

namespace dpproxy::sim {

struct DeviceInfo {
  std::string health;
  std::vector<int64_t> numa_nodes;
};

struct ResourceRecord {
  std::string name;
  std::string endpoint;  // socket path
  std::string api_version;  // "v1alpha2" or "v1beta1"
  std::string registered_via;  // "kubelet.sock" or "plugin-watcher"
  v1beta1::DevicePluginOptions options;
  std::map<std::string, DeviceInfo> devices;
  bool connected = false;
  // Set when the plugin was lost, or when restored from a checkpoint.
  std::optional<absl::Time> stopped_at;
  uint64_t generation = 0;  // endpoint generation that owns the record
};

class DeviceManager {
 public:
  // --- Registration and device lists -------------------------------------

  // A plugin registered (again): the new endpoint replaces any old one.
  // Devices are kept until the new endpoint's first list replaces them.
  void RegisterEndpoint(const std::string& resource, const std::string& endpoint,
                        const std::string& api_version, const std::string& via,
                        const v1beta1::DevicePluginOptions& options,
                        uint64_t generation);

  // A ListAndWatch update: replaces the device list wholesale. Returns false
  // (and changes nothing) if `generation` is not the current endpoint,
  // unless `by_name`: the kubelet's device manager takes every client's
  // lists by resource name (genericDeviceUpdateCallback), a replaced
  // client's too, even once the resource's endpoint has stopped.
  bool UpdateDevices(const std::string& resource, uint64_t generation, bool by_name,
                     const std::vector<v1beta1::Device>& devices);

  // The endpoint's stream ended: every device becomes Unhealthy and the
  // grace period starts. Returns false if `generation` is stale (a replaced
  // endpoint ending does not touch its successor).
  bool EndpointLost(const std::string& resource, uint64_t generation, absl::Time now);

  // Removes resources lost for at least `grace`; returns their names.
  std::vector<std::string> ExpireResources(absl::Time now, absl::Duration grace);

  const ResourceRecord* Find(const std::string& resource) const;
  std::vector<std::string> ResourceNames() const;

  // --- Allocation ----------------------------------------------------------

  // Devices that are healthy and not held by a running pod, sorted.
  // Errors use the kubelet's texts: unregistered resource, no healthy device,
  // not enough devices.
  absl::StatusOr<std::vector<std::string>> AvailableFor(const std::string& resource,
                                                        int count) const;

  bool HasPod(const std::string& uid) const;
  const PodState* FindPod(const std::string& uid) const;  // nullptr: none
  // Adds (or replaces) a pod; a new one is numbered after every other
  // (its `created`), unless it has a number.
  void AddPod(PodState pod);
  // A container of a pod started with these devices (the runtime's view).
  void AddRunning(const std::string& uid, const RuntimeDevices& running);
  // The pod's extended resources served through DRA (PodState).
  void SetExtendedResourceClaim(const std::string& uid, const ExtendedResourceClaim& claim);
  // A container exits: the runtime holds no devices for it any more.
  void StopContainer(const std::string& uid, const std::string& container);
  void AddAllocation(const ContainerAllocation& allocation);
  // Marks a pod Failed and frees its devices.
  void FailPod(const std::string& uid, const std::string& reason,
               const std::string& message);
  // Forgets a pod and its allocations. kNotFound if unknown.
  absl::Status DeletePod(const std::string& uid);

  const std::vector<ContainerAllocation>& allocations() const { return allocations_; }
  const std::map<std::string, PodState>& pods() const { return pods_; }

  // The kubelet's re-admission check for every running pod (devicemanager's
  // manager.go, devicesToAllocate): resource registered, at least one
  // healthy device, every previously allocated device healthy. Pods that
  // fail are marked Failed with reason UnexpectedAdmissionError and their
  // devices freed.
  std::vector<ReadmitResult> Readmit();

  // The admission check a restarted kubelet runs for every pod it finds
  // bound to the node, in creation order (observed on a 1.36.2 node): each pod's
  // requests against the resource's allocatable (its healthy devices; for
  // a pod the kubelet holds devices for, at least as many as it holds)
  // minus the requests of the pods admitted before it. A pod that does not
  // fit is denied (reason "OutOf<resource>", the kubelet's message) and its
  // containers are killed. A resource the device manager does not know at
  // all (no checkpoint, no plugin yet) is not checked. Returns what happened to each pod; for an
  // admitted pod, `forgotten` lists its containers' requests the kubelet
  // holds no devices for (a lost checkpoint).
  struct RefitResult {
    std::string pod_uid, pod_name, pod_namespace;
    bool admitted = true;
    std::string reason, message;
    std::vector<ContainerRequest> forgotten;
  };
  std::vector<RefitResult> RefitRunningPods();

  // --- Persistence ------------------------------------------------------------

  // The device-manager checkpoint as kubelet 1.`minor` writes it
  // (devicemanager/checkpoint/checkpoint.go of each release):
  //   1.9-1.10   {"PodDeviceEntries":[...],"RegisteredDevices":{...}},
  //              DeviceIDs a list, no checksum;
  //   1.11-1.19  {"Data":{...},"Checksum":N}, DeviceIDs a list;
  //   1.20-1.22  the same, DeviceIDs a map from NUMA node to list, devices
  //              without topology under "0";
  //   1.23+      the same, devices without topology under "-1".
  // The checksum is FNV-32a over the compact JSON of "Data" (the kubelet's
  // own is Go-specific and cannot be reproduced here).
  std::string CheckpointJson(int minor) const;
  // Pods with names and phases: the simulator's stand-in for the API server.
  std::string PodsJson() const;

  // Replaces the state with what kubelet 1.`minor` rebuilds at start:
  // allocations from the checkpoint, and for every checkpointed resource a
  // stopped endpoint with no devices (capacity 0) whose grace period starts
  // at `now`. Each release reads only what it can (its checkpoint.go):
  // 1.11+ need the checksummed wrapper; 1.11-1.19 read only list
  // DeviceIDs; 1.20-1.21 only the NUMA map (kubernetes#102880, as the
  // minors' first releases, before the back-ported fix); 1.22-1.30 the map
  // or, failing that, a list (all devices on NUMA node 0); 1.31+ only the
  // map again (#123398). kDataLoss when the release cannot read it (the
  // state is then empty, as the kubelet continues without it). 1.9-1.10
  // decode with Go's json into their own layout: a newer file leaves them
  // empty with no error.
  absl::Status Restore(const std::string& checkpoint_json, const std::string& pods_json,
                       absl::Time now, int minor);

  // --- Views -----------------------------------------------------------------

  int64_t Capacity(const std::string& resource) const;
  int64_t Allocatable(const std::string& resource) const;
  // Allocatable() of every resource it has a record of, by name.
  std::map<std::string, int64_t> AllAllocatable() const;
  // Resources, devices (with their holders), pods and allocations.
  void FillState(absl::Time now, State* out) const;

 private:
  std::set<std::string> AllocatedDevices(const std::string& resource) const;

  std::map<std::string, ResourceRecord> resources_;
  std::map<std::string, PodState> pods_;
  std::vector<ContainerAllocation> allocations_;
  int64_t next_created_ = 1;
};

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_DEVICE_MANAGER_H_
