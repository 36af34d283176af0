#!/usr/bin/env bash
# proxy/kube/gen_https_abi_h.sh HEADER OUT: writes https_abi.h, the HTTPS
# module's ABI mark: the first 16 hex digits of HEADER's SHA-256
# (https_module.h, the types the module and its loader share).
set -euo pipefail
mark="$(sha256sum <"$1" | cut -c1-16)"
cat >"$2" <<HEADER
// File: https_abi.h (generated from https_module.h by proxy/kube/gen_https_abi_h.sh)
#ifndef DPPROXY_PROXY_KUBE_HTTPS_ABI_H_
#define DPPROXY_PROXY_KUBE_HTTPS_ABI_H_

namespace dpproxy {
namespace https {

inline constexpr char kHttpsAbi[] = "$mark";

}  // namespace https
}  // namespace dpproxy

#endif  // DPPROXY_PROXY_KUBE_HTTPS_ABI_H_
HEADER
