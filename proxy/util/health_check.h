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
  // Why it fails; for a check that passes, what a reader should know
  // (e.g. the devices cordoned by hand), or empty.
  std::string reason;
};

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_UTIL_HEALTH_CHECK_H_
