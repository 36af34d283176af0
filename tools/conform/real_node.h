// File: real_node.h
//
// dpconform's view of a real node (real.h): its kubelet's pod-resources
// socket and its API server, through which the real-kubelet cells start
// and end pods and read what the kubelet did with them. Shared by the
// files of real.cc's and real_dra.cc's cells only.
#ifndef DPPROXY_TOOLS_CONFORM_REAL_NODE_H_
#define DPPROXY_TOOLS_CONFORM_REAL_NODE_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "proto/podresources/api.grpc.pb.h"
#include "proxy/kube/kube_client.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/util/files.h"
#include "tools/conform/cell.h"
#include "tools/conform/grid_scenarios.h"

namespace dpproxy::conform {

using grid::Ms;

using Json = nlohmann::json;

// How often a wait looks again at the kubelet or the API server.
inline constexpr absl::Duration kPoll = absl::Milliseconds(200);
// The longest --restart_kubelet may take before the cell fails.
inline constexpr absl::Duration kRestartLimit = absl::Minutes(3);
inline constexpr char kManagedBy[] = "dpconform";
// The pods' containers: ended at once by the SIGTERM of a deletion.
inline constexpr char kPodScript[] = "trap 'exit 0' TERM; sleep 3600 & wait";

// The sockets the kubelet's plugin manager registered, from its metrics
// text: plugin_manager_total_plugins{socket_path="...",state="actual_state_of_world"}.
std::set<std::string> RegisteredSockets(const std::string& metrics);

// GetInfo on a registration socket, as the kubelet asks it: "DRAPlugin
// name [versions]", or why it did not answer.
struct RegistrationInfo {
  bool answered = false;
  std::string type, name;
  std::vector<std::string> versions;
  std::string Describe() const {
    return absl::StrCat(type, " ", name, " [", absl::StrJoin(versions, ", "), "]");
  }
};
RegistrationInfo GetInfo(const std::string& socket);

// The paths in `dir`, sorted.
std::vector<std::string> SocketsIn(const std::string& dir);

// What the kubelet does with a pod.
struct PodOutcome {
  enum Kind { kRunning, kRefused, kContainerError, kImage, kTimeout } kind = kTimeout;
  std::string reason;   // the kubelet's or the runtime's word
  std::string message;  // its text
  Json pod;
};

// What a plugin's (or driver's) side of each pod outcome says, for
// OutcomeProblem.
struct PodOutcomeTexts {
  std::string refused_did, refused_expects;
  std::string container_did, container_expects;
  std::string harness_did;  // the flags the harness needs (kImage)
  std::string late_did, late_expects, late_users;
};

// A pod outcome that is not kRunning as a Problem of `owner`'s, in the
// kubelet's or the runtime's words, after `timeout`.
Problem OutcomeProblem(const std::string& owner, const std::string& pod, const PodOutcome& out,
                       absl::Duration timeout, const PodOutcomeTexts& t);

// The node, its kubelet's pod-resources socket and the API server.
class RealNode {
 public:
  static absl::StatusOr<std::unique_ptr<RealNode>> Connect(const ConformOptions& o);

  const std::string& name() const { return name_; }
  // "v1.37.2", as the node reports its kubelet.
  const std::string& kubelet_version() const { return kubelet_version_; }
  // "1.37".
  std::string minor() const;
  const std::string& pod_resources_socket() const { return pod_resources_; }
  const std::string& namespace_name() const { return namespace_; }
  KubeClient& api() { return *api_; }

  // The kubelet's metrics: through the API server's node proxy (as
  // `kubectl get --raw /api/v1/nodes/NAME/proxy/metrics`), or, where the
  // API server cannot reach the kubelet (a kubelet serving on loopback
  // only), from the kubelet's own port on 127.0.0.1 with --kubeconfig's
  // credentials and CA.
  absl::StatusOr<std::string> KubeletMetrics();

  // One device a DRA claim gave a container, as the pod-resources socket
  // lists it (from 1.34; earlier kubelets list none).
  struct ClaimDevice {
    std::string claim, driver, pool, device;
    std::vector<std::string> cdi;
  };
  // The claims' devices the kubelet lists for each container of a pod.
  absl::StatusOr<std::map<std::string, std::vector<ClaimDevice>>> ContainerClaims(
      const std::string& pod);

  // The IDs of `resource`'s devices the kubelet lists as allocatable.
  absl::StatusOr<std::set<std::string>> Allocatable(const std::string& resource);

  // The IDs of `resource` the kubelet lists for each container of a pod.
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> ContainerDevices(
      const std::string& pod, const std::string& resource);

  // The node's allocatable count of `resource` as the API server has it.
  absl::StatusOr<int64_t> NodeAllocatable(const std::string& resource);

  // Makes a pod bound to this node, one container c0, c1, ... per entry of
  // `containers`, each asking for that many devices of that resource.
  absl::Status CreatePod(const std::string& pod,
                         const std::vector<std::pair<std::string, int>>& containers);

  // Makes a pod of the claim `claim` (made beforehand in the namespace),
  // one container c0, c1, ... per entry of `requests`, each given the
  // claim's requests named in its entry (all of it for an empty entry).
  // The scheduler places it, on this node only: a claim is allocated while
  // the pod is scheduled, so a pod bound by name would never get one.
  absl::Status CreateClaimPod(const std::string& pod, const std::string& claim,
                              const std::vector<std::vector<std::string>>& requests);

  absl::StatusOr<Json> GetPod(const std::string& pod);

  // The ID of the pod's first running container, "" if none runs.
  std::string RunningContainerId(const std::string& pod);

  // Waits up to `timeout` until the pod runs, the kubelet refuses it, its
  // container cannot be made, or it ended.
  PodOutcome WaitPod(const std::string& pod, absl::Duration timeout);

  // The newest Warning event about the pod ("FailedMount: ..."), or "".
  std::string LatestWarning(const std::string& pod);

  // Deletes the pod and waits until it is gone (its containers stopped), up
  // to `timeout`.
  absl::Status DeletePod(const std::string& pod, absl::Duration timeout);

  // Deletes every pod dpconform made in the namespace (a run stopped half
  // way leaves some).
  absl::Status DeleteOurPods(absl::Duration timeout);

 private:
  RealNode(const ConformOptions& o, std::unique_ptr<KubeClient> api)
      : o_(o),
        api_(std::move(api)),
        namespace_(o.real.namespace_),
        pod_resources_(JoinPath(o.real.kubelet_root, "pod-resources/kubelet.sock")),
        stub_(v1::PodResourcesLister::NewStub(MakeUnixChannel(pod_resources_, 64 << 20))) {}

  std::string PodsPath() const { return absl::StrCat("/api/v1/namespaces/", namespace_, "/pods"); }

  Json Container(const std::string& name, const Json& resources) const;

  // A pod of dpconform's, its spec `spec` with what every pod has.
  Json PodManifest(const std::string& pod, const Json& containers, Json spec) const;

  absl::Status FindNode();

  absl::Status Unreachable(const char* call, const grpc::Status& st) const;

  static std::string TerminatedText(const Json& status);

  const ConformOptions& o_;
  std::unique_ptr<KubeClient> api_;
  const std::string namespace_;
  const std::string pod_resources_;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub_;
  std::string name_;
  std::string kubelet_version_;
  int kubelet_port_ = 0;
  // The kubelet's port, for its metrics where the API server cannot reach
  // it (KubeletMetrics).
  std::unique_ptr<KubeClient> kubelet_;
  bool direct_ = false;
  std::string proxy_error_;
};

// The node of options.real_kubelets, connected, its kubelet checked to be
// the release each names; an error naming what is wrong otherwise.
absl::StatusOr<std::unique_ptr<RealNode>> ConnectRealNode(const ConformOptions& o);

// A short ID of this run: its pods' (and claims') names begin
// dpconform-<id>-<cell>.
std::string RealRunId();

// Plays the scenarios of `all` the options select (--scenarios, or every
// one but `needs_restart` without --restart_kubelet) on each real kubelet,
// one cell at a time: `play(scenario, i, dir)` is cell i's result, named and
// timed here.
using PlayRealCell =
    std::function<CellResult(const std::string& scenario, size_t i, const std::string& dir)>;
absl::StatusOr<std::vector<CellResult>> RunRealCells(const ConformOptions& o, const RealNode& n,
                                                     const std::vector<std::string>& all,
                                                     const std::string& needs_restart,
                                                     const PlayRealCell& play);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_REAL_NODE_H_
