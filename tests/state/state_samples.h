// File: state_samples.h
//
// What the state tests share: a small state with one resource and one
// allocation, a response's environment set on an allocation, and the
// names in a directory.
#ifndef DPPROXY_TESTS_STATE_STATE_SAMPLES_H_
#define DPPROXY_TESTS_STATE_STATE_SAMPLES_H_

#include <dirent.h>

#include <string>
#include <vector>

#include "proxy/state/allocation_response.h"
#include "proxy/state/state.pb.h"

namespace dpproxy::testing {

// Sets one environment variable of an allocation's response.
inline void SetEnv(state::Allocation* a, const std::string& name, const std::string& value) {
  v1beta1::ContainerAllocateResponse r = ResponseOf(*a);
  (*r.mutable_envs())[name] = value;
  SetResponse(a, r);
}

// One resource of one device (gpu-0) and one allocation of it.
inline state::State Sample() {
  state::State s;
  state::Resource* r = s.add_resources();
  r->set_name("vendor.com/gpu");
  r->set_kubelet_api("v1beta1");
  r->mutable_backend()->set_endpoint("/var/lib/dpproxy/device-plugins/gpu.sock");
  r->mutable_backend()->set_api_version("v1alpha2");
  auto* d = r->add_devices();
  d->set_id("gpu-0");
  d->set_health("Healthy");
  state::Allocation* a = s.add_allocations();
  a->set_id(1);
  a->set_resource("vendor.com/gpu");
  a->add_device_ids("gpu-0");
  SetEnv(a, "GPU", "gpu-0");
  s.set_next_allocation_id(1);
  return s;
}

// The entries of `dir`, "." and ".." left out.
inline std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  return out;
}

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_STATE_STATE_SAMPLES_H_
