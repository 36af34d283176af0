// File: sim_helpers.h
//
// Small helpers for tests that drive the kubelet simulator.
#ifndef DPPROXY_TESTS_TESTING_SIM_HELPERS_H_
#define DPPROXY_TESTS_TESTING_SIM_HELPERS_H_

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::testing {

// A pod named `name` whose containers each ask `resource` for a count.
inline sim::AllocateRequest PodRequest(const std::string& name,
                                       const std::vector<std::pair<std::string, int>>& containers,
                                       const std::string& resource) {
  sim::AllocateRequest r;
  r.set_pod_name(name);
  for (const auto& [c, n] : containers) {
    auto* cr = r.add_containers();
    cr->set_name(c);
    cr->set_resource(resource);
    cr->set_count(n);
  }
  return r;
}

inline std::vector<std::string> DeviceIdsOf(const sim::ContainerAllocation& a) {
  return {a.device_ids().begin(), a.device_ids().end()};
}

// The resource in a state, or nullptr. Never from a temporary State: the
// pointer would dangle.
const sim::ResourceState* FindResource(sim::State&& st, const std::string& name) = delete;
inline const sim::ResourceState* FindResource(const sim::State& st, const std::string& name) {
  for (const auto& r : st.resources()) {
    if (r.name() == name) return &r;
  }
  return nullptr;
}

// Health of one device as the simulated kubelet sees it ("" if unknown).
inline std::string KubeletHealth(sim::KubeletSim& sim, const std::string& resource,
                                 const std::string& id) {
  const sim::State st = sim.GetState();
  const sim::ResourceState* r = FindResource(st, resource);
  if (r == nullptr) return "";
  for (const auto& d : r->devices()) {
    if (d.id() == id) return d.health();
  }
  return "";
}

// How many rounds a storm-like test runs: the environment variable `name`
// if set (for longer runs on demand), else `ci_default`.
inline int CountFromEnv(const char* name, int ci_default) {
  const char* n = std::getenv(name);
  return n != nullptr ? std::max(1, std::atoi(n)) : ci_default;
}

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_SIM_HELPERS_H_
