// File: allocation_response.h
//
// The plugin's answer an allocation keeps (state::Allocation.response),
// which the state holds serialized: parsed on the rare reads (dpctl,
// tests), never for the allocations held.
#ifndef DPPROXY_PROXY_STATE_ALLOCATION_RESPONSE_H_
#define DPPROXY_PROXY_STATE_ALLOCATION_RESPONSE_H_

#include "proto/v1beta1/api.pb.h"
#include "proxy/state/state.pb.h"

namespace dpproxy {

// The answer, parsed; an empty one if there is none (a reservation) or
// its bytes do not parse.
inline v1beta1::ContainerAllocateResponse ResponseOf(const state::Allocation& a) {
  v1beta1::ContainerAllocateResponse r;
  if (!r.ParseFromString(a.response())) r.Clear();
  return r;
}

inline void SetResponse(state::Allocation* a, const v1beta1::ContainerAllocateResponse& r) {
  r.SerializeToString(a->mutable_response());
}

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_STATE_ALLOCATION_RESPONSE_H_
