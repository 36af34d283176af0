// File: version.h
//
// dpproxy's version, and the commit it was built from when the build says
// so (-DDPPROXY_COMMIT="...", which `tools/dev package` and `tools/dev
// image` pass; "unknown" otherwise). Shown by dpproxy_build_info and
// `dpproxy --version`.
#ifndef DPPROXY_PROXY_VERSION_H_
#define DPPROXY_PROXY_VERSION_H_

namespace dpproxy {

inline constexpr char kDpproxyVersion[] = "0.7.0";
#ifdef DPPROXY_COMMIT
inline constexpr char kDpproxyCommit[] = DPPROXY_COMMIT;
#else
inline constexpr char kDpproxyCommit[] = "unknown";
#endif

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_VERSION_H_
