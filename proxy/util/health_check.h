// File: health_check.h
//
// One check behind /livez or /readyz ("registered:vendor.com/gpu",
// "state-writable", ...): ok, or why not.
#ifndef DPPROXY_PROXY_UTIL_HEALTH_CHECK_H_
#define DPPROXY_PROXY_UTIL_HEALTH_CHECK_H_

#include <string>

namespace dpproxy {

struct HealthCheck {
  std::string name;
  bool ok = false;
  std::string reason;  // empty when ok
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_HEALTH_CHECK_H_
