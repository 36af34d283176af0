// File: grid_scenarios.h
//
// The scenarios of dpconform's device-plugin grid (docs/conformance.md),
// one function each, run in a Cell of one kubelet release: registration
// and the device list (grid_scenarios.cc), allocation
// (allocate_scenarios.cc), restarts of the kubelet and the plugin
// (restart_scenarios.cc). conform.cc lists them and runs the cells.
#ifndef DPPROXY_TOOLS_CONFORM_GRID_SCENARIOS_H_
#define DPPROXY_TOOLS_CONFORM_GRID_SCENARIOS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/conform/cell.h"

namespace dpproxy::conform::grid {

// "123 ms".
std::string Ms(absl::Duration d);

// Admits a pod with one container per entry of `containers` (resource,
// count); a Problem owned by the scenario the failure belongs to.
absl::StatusOr<sim::AllocateResponse> Admit(
    Cell& cell, const std::string& pod,
    const std::vector<std::pair<std::string, int>>& containers, Problem* problem);

// Registration, the device list and health.
CellResult Registers(Cell& c);
CellResult ServesFirst(Cell& c);
CellResult DeviceList(Cell& c);
CellResult ListSize(Cell& c);
CellResult ListGrowth(Cell& c);
CellResult PluginWatcher(Cell& c);
CellResult Health(Cell& c);
CellResult MultiResource(Cell& c);

// Allocation.
CellResult Allocate(Cell& c);
CellResult AllocateTwo(Cell& c);
CellResult Preferred(Cell& c);
CellResult PreStart(Cell& c);

// Restarts.
CellResult KubeletRestart(Cell& c);
CellResult KubeletCrash(Cell& c);
CellResult PluginRestart(Cell& c);
CellResult AllocateRestart(Cell& c);
CellResult CheckpointLost(Cell& c);
CellResult RollingUpdate(Cell& c);

}  // namespace dpproxy::conform::grid

#endif  // DPPROXY_TOOLS_CONFORM_GRID_SCENARIOS_H_
