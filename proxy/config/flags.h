// File: flags.h
//
// dpproxy's command-line flags (defined in flags.cc, the only file that
// defines them, so `--help` lists exactly these) and the ProxyConfig they
// make: flag defaults, then the --config file, then the flags given on the
// command line, validated.
#ifndef DPPROXY_PROXY_CONFIG_FLAGS_H_
#define DPPROXY_PROXY_CONFIG_FLAGS_H_

#include <gflags/gflags.h>

#include "absl/status/statusor.h"
#include "proxy/config/proxy_config.h"

DECLARE_string(status_file);
DECLARE_string(state_dir);
DECLARE_string(output);
DECLARE_string(events);
DECLARE_string(log_format);
DECLARE_string(after_handoff);
DECLARE_bool(check);
DECLARE_string(plugin_dir);
DECLARE_string(wait_timeout);

namespace dpproxy {

// kInvalidArgument naming the flag or file line and the problem.
absl::StatusOr<ProxyConfig> ConfigFromFlags();

// The status file when none is named: <state_dir>/status.json, or
// /var/lib/dpproxy/status.json without a state directory.
std::string DefaultStatusFile(const std::string& state_dir);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_CONFIG_FLAGS_H_
