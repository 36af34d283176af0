// File: daemon.h
//
// dpproxy as a running daemon: the ProxyServer and what surrounds it in a
// process. The HTTP endpoint of metrics and probes (on the listener a
// running dpproxy hands over when this one takes over, where it can be
// served here), systemd's notifications and watchdog, the events file, the
// in-place upgrade on SIGUSR2, reloads on SIGHUP, and the end on SIGTERM or
// SIGINT, or once the state is handed over to a new dpproxy.
//
//   DaemonOptions options;
//   options.argv = started_argv;
//   options.reread_config = ConfigFromFlags;
//   return RunDaemon(*config, options);
#ifndef DPPROXY_PROXY_DAEMON_DAEMON_H_
#define DPPROXY_PROXY_DAEMON_DAEMON_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proxy/config/proxy_config.h"

namespace dpproxy {

struct DaemonOptions {
  // The command line as started, argv[0] an absolute path: an in-place
  // upgrade (SIGUSR2) starts the binary at that path with it.
  std::vector<std::string> argv;
  // Events are appended here too (--events); "": the log only.
  std::string events_file;
  // Events as JSON log lines of their own (--log_format=json, -v=1).
  bool json_event_lines = false;
  // Once handed over, wait for SIGTERM instead of exiting
  // (--after_handoff=wait).
  bool wait_after_handoff = false;
  // The configuration as it is now, for SIGHUP: the flags as given at
  // start, the --config file re-read. An error refuses the reload.
  std::function<absl::StatusOr<ProxyConfig>()> reread_config;
};

// Runs until stopped, then ends the process itself (EndProcess, once
// everything has stopped: gRPC stays up until then). Returns only when it
// cannot start: 2 for an events file it cannot open, 1 for anything else
// (logged). Call with the termination signals not yet blocked: it blocks
// them in every thread and waits for them on its own.
int RunDaemon(const ProxyConfig& config, const DaemonOptions& options);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_DAEMON_DAEMON_H_
