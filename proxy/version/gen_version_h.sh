#!/usr/bin/env bash
# proxy/version/gen_version_h.sh VERSION OUT: writes proxy/version/version.h from the
# repository's VERSION file (one line, MAJOR.MINOR.PATCH[-SUFFIX]).
set -euo pipefail
version="$(tr -d '[:space:]' <"$1")"
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]]; then
  echo "gen_version_h.sh: $1 holds '$version', not a version (MAJOR.MINOR.PATCH)" >&2
  exit 1
fi
cat >"$2" <<HEADER
// File: version.h (generated from VERSION by proxy/version/gen_version_h.sh)
//
// dpproxy's version, and the commit it was built from when the build says
// so (-DDPPROXY_COMMIT="...", which \`tools/dev package\` and \`tools/dev
// image\` pass; "unknown" otherwise). Shown by dpproxy_build_info and every
// tool's --version.
#ifndef DPPROXY_PROXY_VERSION_H_
#define DPPROXY_PROXY_VERSION_H_

namespace dpproxy {

inline constexpr char kDpproxyVersion[] = "$version";
#ifdef DPPROXY_COMMIT
inline constexpr char kDpproxyCommit[] = DPPROXY_COMMIT;
#else
inline constexpr char kDpproxyCommit[] = "unknown";
#endif

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_VERSION_H_
HEADER
