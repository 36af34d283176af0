// File: dra.h
//
// dpconform for DRA drivers (--dra_driver): the driver's command runs
// against kubelet_sim playing a DRA-capable release (1.32+), with an
// API-server simulator beside it (ResourceSlices, ResourceClaims, a
// scheduler that allocates from the published slices) and kubelet_sim
// resolving the returned CDI names as the container runtime would. One
// fresh kubelet, API server and driver process per cell, as for device
// plugins; the outcomes are the same (conform.h).
//
// The scenarios (DraScenarios(); docs/conformance.md):
//   dra-registers        plugin-watcher registration as a DRAPlugin with a
//                        service this release knows
//   dra-publishes        the node's ResourceSlices: valid pools, devices
//   dra-prepare          a claim the scheduler allocated is prepared: its
//                        devices, CDI names the runtime resolves; unprepare,
//                        twice
//   dra-kubelet-restart  after a kubelet restart (which deletes the node's
//                        slices) the driver registers and publishes again,
//                        and a repeated prepare answers the same
//   dra-driver-restart   the driver restarts: it registers again and a
//                        claim prepared before is answered the same
//   dra-unknown-claim    a claim the API server does not have is an error
//                        naming it, in its entry or as the call's
#ifndef DPPROXY_TOOLS_CONFORM_DRA_H_
#define DPPROXY_TOOLS_CONFORM_DRA_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tools/conform/conform.h"

namespace dpproxy::conform {

const std::vector<ScenarioInfo>& DraScenarios();
// The driver command's placeholders in DRA mode.
const std::vector<Placeholder>& DraPlaceholders();
// The default releases in DRA mode: 1.32 (v1beta1.DRAPlugin) and 1.34
// (v1.DRAPlugin).
std::vector<std::string> DefaultDraKubelets();

// ValidateOptions for DRA mode: kInvalidArgument naming the flag.
absl::Status ValidateDraOptions(const ConformOptions& options);
// Runs the DRA scenarios on the simulated releases of options.kubelets and,
// first, on the real node of options.real_kubelets (real.h).
absl::StatusOr<std::vector<CellResult>> RunDraConformance(const ConformOptions& options);

// The driver command's placeholder values (DraPlaceholders) for a kubelet
// whose root is `kubelet_root`, the rest as named.
std::vector<std::pair<std::string, std::string>> DraValues(
    const ConformOptions& o, const std::string& kubelet_root, const std::string& kubeconfig,
    const std::string& node_name, const std::string& cdi_dir, const std::string& work_dir,
    const std::string& kubelet_version);

// The devices of `driver`'s ResourceSlices for `node` among `slices`
// (ResourceSlice objects), by pool, from the newest generation of each
// pool. Sets `*problem` (when given) to name a pool whose newest generation
// has fewer or more slices than its resourceSliceCount says.
std::map<std::string, std::vector<std::string>> PublishedPools(
    const std::vector<nlohmann::json>& slices, const std::string& driver,
    const std::string& node, std::string* problem);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_DRA_H_
