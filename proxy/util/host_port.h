// File: host_port.h
//
// A TCP address as dpproxy's flags name it (the metrics address).
#ifndef DPPROXY_PROXY_UTIL_HOST_PORT_H_
#define DPPROXY_PROXY_UTIL_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace dpproxy {

// "127.0.0.1:9464", "localhost:9464", "[::1]:9464", "0.0.0.0:9464" or
// ":9464" (every IPv4 interface); port 0 picks a free one.
struct HostPort {
  std::string host;  // an IP literal ("127.0.0.1", "::1")
  int port = 0;
};
// kInvalidArgument naming the address and what is wrong with it.
absl::StatusOr<HostPort> ParseHostPort(const std::string& address);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_HOST_PORT_H_
