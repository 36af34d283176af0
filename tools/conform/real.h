// File: real.h
//
// dpconform's cells on a real node (--kubelets=real:1.37). The plugin's
// command runs against the node's own kubelet, one cell at a time, and each
// check reads only what that kubelet shows:
//   - the devices its pod-resources socket lists as allocatable
//     (GetAllocatableResources: the healthy devices of registered plugins,
//     as the device manager holds them, without waiting for a node status
//     update);
//   - the node's allocatable as the API server has it (what the scheduler
//     sees, after the kubelet's next status update);
//   - pods bound to the node by name, so that the kubelet's admission and
//     the plugin's Allocate decide, and the devices the pod-resources
//     socket lists for their containers.
//
// Scenarios a real kubelet cannot show (when a plugin began serving, what
// it answered to a call the kubelet makes on its own) stay with the
// simulated kubelets; RealScenarios() lists the ones run here. Their names
// and verdicts mean what they mean on a simulated kubelet, so a grid puts
// a real column beside the simulated ones.
//
// The node is the user's: dpconform makes only pods labelled
// app.kubernetes.io/managed-by=dpconform in one namespace, deletes them,
// and writes nothing in the kubelet's directories. A kubelet restart is
// the user's own command (--restart_kubelet).
#ifndef DPPROXY_TOOLS_CONFORM_REAL_H_
#define DPPROXY_TOOLS_CONFORM_REAL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {

// "real" (whichever release the node runs: "") or "real:1.37" ("1.37");
// nullopt for a name that is not a real kubelet; kInvalidArgument for
// "real:" followed by something that is not a minor release.
absl::StatusOr<std::optional<std::string>> ParseRealKubelet(const std::string& name);

// The scenarios a real kubelet can judge, in the order they run.
const std::vector<std::string>& RealScenarios();
// The same for a DRA driver (--dra_driver; real_dra.cc).
const std::vector<std::string>& RealDraScenarios();

// Checks the options real kubelets need (--kubeconfig, --pod_image, a
// scenario named that only simulated kubelets can judge): kInvalidArgument
// naming the flag.
absl::Status ValidateRealOptions(const ConformOptions& options);

// Runs, for each of options.real_kubelets, the selected scenarios a real
// kubelet can judge (all of RealScenarios() but the opt-in ones when none
// are selected, and kubelet-restart only with --restart_kubelet) on the
// node, one cell at a time. An error, before any cell ran, when the node
// cannot be used: unreachable, another release, another plugin already
// serving the resource; the message names which.
absl::StatusOr<std::vector<CellResult>> RunRealConformance(const ConformOptions& options);

// The same for a DRA driver (--dra_driver): its command runs against the
// node's kubelet and API server with the placeholders naming the node's
// own paths, and the cells judge what those show: the kubelet's
// registrations (its plugin-manager metric, through the API server's node
// proxy), the node's ResourceSlices, and pods the scheduler places on the
// node with claims dpconform makes (a DeviceClass of the driver's devices
// for the run, one ResourceClaim per pod, deleted at the end). An error
// before any cell ran when the cluster serves no resource.k8s.io version
// dpconform speaks, or the kubelet's metrics cannot be read.
absl::StatusOr<std::vector<CellResult>> RunRealDraConformance(const ConformOptions& options);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_REAL_H_
