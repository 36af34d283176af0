// File: pod_resources_view.h
//
// The kubelet's pod-resources API as dpproxy serves it beside the
// kubelet's (--pod_resources_socket): one view of the devices each
// container holds, whichever path served them. The kubelet lists a pod of
// the extended resource admitted through the device plugin as
// ContainerDevices (resource name, the plugin's device ID), and one whose
// claim DRA prepared only as dynamic_resources (claim, driver, pool, DRA
// device name). A monitoring agent that reads devices by resource name
// (per-pod GPU metrics) loses the second kind. This view keeps the
// kubelet's answer as it is and adds, for each claim device of dpproxy's
// driver, a ContainerDevices with the resource and the plugin's device ID,
// read from the journal's claim allocations; and to the node's allocatable
// devices, those the kubelet does not list of resources served through DRA.
//
//   PodResourcesView view({"/var/lib/kubelet/pod-resources/dpproxy.sock",
//                          kubelet_pod_resources_socket, "gpu.vendor.com", "node-1"},
//                         keeper);
//   DPP_RETURN_IF_ERROR(view.Start());  // serves until Stop()
#ifndef DPPROXY_PROXY_HOLDERS_POD_RESOURCES_VIEW_H_
#define DPPROXY_PROXY_HOLDERS_POD_RESOURCES_VIEW_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "proto/podresources/api.pb.h"
#include "proxy/core/device_list.h"
#include "proxy/state/state_keeper.h"

namespace dpproxy {

// The journal's claim devices: (claim namespace, claim name, pool, DRA
// device name) -> (resource, the plugin's device ID).
class ClaimDeviceIndex {
 public:
  using Key = std::tuple<std::string, std::string, std::string, std::string>;
  static ClaimDeviceIndex From(StateKeeper& keeper, const std::string& driver,
                               const std::string& node);
  // nullptr if no claim allocation holds that device.
  const std::pair<std::string, std::string>* Find(const Key& key) const;

 private:
  std::map<Key, std::pair<std::string, std::string>> devices_;
};

// Adds to `pod` a ContainerDevices for each claim device of `driver` its
// containers list under dynamic_resources that `index` knows, unless the
// container lists that device already. Returns how many were added.
int AddClaimDevices(const std::string& driver, const ClaimDeviceIndex& index,
                    v1::PodResources* pod);

// The resources dpproxy serves where it runs a DRA side, each with its
// devices as the plugin reports them (kubelet-facing IDs).
using DraResources = std::vector<std::pair<std::string, std::shared_ptr<const DeviceList>>>;

// Adds to a GetAllocatableResources answer each Healthy device of
// `resources` it does not list (one entry per device, with its topology):
// the kubelet leaves out a resource served through DRA only, and the
// devices DRA claims hold of any other (Unhealthy to it). Returns how many
// were added.
int AddDraDevices(const DraResources& resources, v1::AllocatableResourcesResponse* resp);

class PodResourcesView {
 public:
  struct Options {
    std::string socket;          // where this view is served
    std::string kubelet_socket;  // the kubelet's pod-resources socket
    std::string driver;          // dpproxy's DRA driver; "" none (the answer passes as it is)
    std::string node;            // the node's name (pool names)
    // The resources and their devices where dpproxy runs a DRA side
    // (empty otherwise); unset: none.
    std::function<DraResources()> dra_resources;
  };
  PodResourcesView(Options options, StateKeeper* keeper);
  ~PodResourcesView();

  // Serves at options.socket (mode 0700); an error names the socket.
  absl::Status Start();
  // Stops serving; removes the socket unless another process has put its
  // own there since (a dpproxy taking over).
  void Stop();

 private:
  class Service;
  const Options options_;
  StateKeeper* const keeper_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  ino_t inode_ = 0;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_HOLDERS_POD_RESOURCES_VIEW_H_
