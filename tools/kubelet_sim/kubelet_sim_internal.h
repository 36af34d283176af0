// File: kubelet_sim_internal.h
//
// What the files of KubeletSim share: kubelet_sim.cc (start and stop),
// kubelet_sim_services.cc (the gRPC services), kubelet_sim_plugins.cc
// (registration and the plugin streams), kubelet_sim_admission.cc
// (admission, re-admission and the checkpoint) and kubelet_sim_pods.cc
// (pods and state): one registered plugin's connection, and small helpers.
// The plugin manager and the DRA manager are classes of their own
// (plugin_manager.h, dra_manager.h).
// Not for users of the simulator: include kubelet_sim.h.
#ifndef DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_INTERNAL_H_
#define DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_INTERNAL_H_

#include <algorithm>
#include <random>
#include <set>

#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>


#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "proto/cri/api.grpc.pb.h"
#include "proto/dra/v1/api.grpc.pb.h"
#include "proto/dra/v1beta1/api.grpc.pb.h"
#include "proto/dra_health/v1/api.grpc.pb.h"
#include "proto/dra_health/v1alpha1/api.grpc.pb.h"
#include "proto/pluginregistration/api.grpc.pb.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proto/v1alpha/api.grpc.pb.h"
#include "proto/v1beta1/api.grpc.pb.h"
#include "proxy/util/files.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/kube/kube_client.h"
#include "proxy/kube/kube_config.h"
#include "proxy/rpc/grpc_status.h"
#include "proxy/util/status_macros.h"
#include "tools/kubelet_sim/cdi_registry.h"
#include "tools/kubelet_sim/control.grpc.pb.h"
#include "tools/kubelet_sim/kubelet_texts.h"

#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::sim {
namespace kubelet_sim_internal {


inline constexpr char kPodsFileName[] = "kubelet_sim_pods.json";
inline constexpr char kUnexpectedAdmissionError[] = "UnexpectedAdmissionError";
inline constexpr absl::Duration kPreStartTimeout = absl::Seconds(30);
// The kubelet sets no deadline on Allocate and GetPreferredAllocation; the
// simulator uses a long one so a hung plugin cannot hang it forever.
inline constexpr absl::Duration kAdmissionRpcTimeout = absl::Seconds(60);

inline std::string NewPodUid() {
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  uint64_t a = rng(), b = rng();
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32, (a >> 16) & 0xffff,
                         a & 0xffff, b >> 48, b & 0xffffffffffffULL);
}

inline Json DevicesJson(const std::vector<v1beta1::Device>& devices) {
  Json out = Json::array();
  for (const auto& d : devices) {
    Json j = {{"id", d.id()}, {"health", d.health()}};
    if (d.has_topology()) {
      Json nodes = Json::array();
      for (const auto& n : d.topology().nodes()) nodes.push_back(n.id());
      j["numa"] = nodes;
    }
    out.push_back(j);
  }
  return out;
}

// Dials in short slices so that `cancelled` (checked between slices) can end
// the wait early.
inline absl::Status Dial(grpc::Channel* channel, absl::Duration timeout,
                  const std::function<bool()>& cancelled) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cancelled()) return absl::CancelledError("kubelet stopping");
    absl::Duration slice = std::min(absl::Milliseconds(200), deadline - absl::Now());
    if (WaitForConnected(channel, slice).ok()) return absl::OkStatus();
  }
  return absl::DeadlineExceededError("context deadline exceeded");
}

// One container's devices and the plugin's answer, as the kubelet records
// them.
inline ContainerAllocation MakeAllocation(const std::string& uid, const std::string& pod_name,
                                   const std::string& pod_namespace, const std::string& container,
                                   const std::string& resource,
                                   const std::vector<std::string>& ids,
                                   const v1beta1::ContainerAllocateResponse& response) {
  ContainerAllocation a;
  a.set_pod_uid(uid);
  a.set_pod_name(pod_name);
  a.set_pod_namespace(pod_namespace);
  a.set_container(container);
  a.set_resource(resource);
  for (const std::string& id : ids) a.add_device_ids(id);
  *a.mutable_response() = response;
  return a;
}

// The kubelet's gRPC services (kubelet_sim_services.cc), answering from
// `sim`'s public interface: registration as `personality` serves it,
// pod-resources, the container runtime's CRI (ListContainers) and the
// control API (control.proto).
std::unique_ptr<grpc::Service> NewRegistrationService(KubeletSim* sim, Personality personality);
std::unique_ptr<grpc::Service> NewPodResourcesService(KubeletSim* sim);
std::unique_ptr<grpc::Service> NewContainerRuntimeService(KubeletSim* sim);
std::unique_ptr<grpc::Service> NewControlService(KubeletSim* sim);

}  // namespace kubelet_sim_internal

// --- A connection to one registered plugin ------------------------------------

struct KubeletSim::PluginClient {
  std::string resource;
  std::string socket_path;
  std::string api_version;  // "v1alpha2" or "v1beta1"
  std::string via;          // "kubelet.sock" or "plugin-watcher"
  std::string watch_socket;  // plugins_registry socket, for plugin-watcher
  v1beta1::DevicePluginOptions options;
  uint64_t generation = 0;
  bool dialled = false;  // sync registration already dialled
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> beta;
  std::unique_ptr<deviceplugin::DevicePlugin::Stub> alpha;
  std::thread thread;

  absl::Mutex mu;
  grpc::ClientContext* stream_ctx ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled ABSL_GUARDED_BY(mu) = false;

  bool IsCancelled() {
    absl::MutexLock lock(&mu);
    return cancelled;
  }
  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
    if (stream_ctx != nullptr) stream_ctx->TryCancel();
  }
};

// --- gRPC services -------------------------------------------------------------

}  // namespace dpproxy::sim

#endif  // DPPROXY_TOOLS_KUBELET_SIM_KUBELET_SIM_INTERNAL_H_
