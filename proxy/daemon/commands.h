// File: commands.h
//
// dpproxy's subcommands besides running it: each reads what a running
// dpproxy leaves (its status file) or offers (its registration socket),
// prints what it found on stdout and any error on stderr, and returns the
// process's exit status.
#ifndef DPPROXY_PROXY_DAEMON_COMMANDS_H_
#define DPPROXY_PROXY_DAEMON_COMMANDS_H_

#include <string>

namespace dpproxy {

// `dpproxy status`'s exit when the status says dpproxy is not ready.
inline constexpr int kExitNotReady = 3;

// `dpproxy status`: the status file at `path` as a table or as JSON
// (`output`). 0 when it says ready (as /readyz), kExitNotReady when not, 1
// when there is no status to read, 2 for an `output` of neither kind.
int PrintStatus(const std::string& path, const std::string& output);

// `dpproxy wait`: until a process listens at <plugin_dir>/kubelet.sock, or
// `wait_timeout` (a duration flag's text) has passed: 0, 1, or 2 for a
// timeout that does not parse.
int WaitForRegistrationSocket(const std::string& plugin_dir, const std::string& wait_timeout);

// `dpproxy reload`: SIGHUP to the running dpproxy, without a shell (the
// image has none): the pid the status file at `path` names, else PID 1 if
// that is a dpproxy (a container's). 0 once sent, 1 when there is no
// dpproxy to tell.
int Reload(const std::string& path);

}  // namespace dpproxy

#endif  // DPPROXY_PROXY_DAEMON_COMMANDS_H_
