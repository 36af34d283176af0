// File: control_commands.h
//
// dpctl's commands that ask the running dpproxy, on its control socket
// (<state_dir>/control.sock, proxy/control/control.proto): cordon,
// uncordon and cordons.
#ifndef DPPROXY_TOOLS_DPCTL_CONTROL_COMMANDS_H_
#define DPPROXY_TOOLS_DPCTL_CONTROL_COMMANDS_H_

#include <string>
#include <vector>

namespace dpproxy {

// Whether `command` is one of them.
bool IsControlCommand(const std::string& command);

// Runs `command` with its positional `args` against the dpproxy whose
// state directory is `state_dir`; prints the outcome; returns the exit
// status (0 done, 1 refused or unreachable, 2 bad usage).
int RunControlCommand(const std::string& command, const std::vector<std::string>& args,
                      const std::string& state_dir, const std::string& reason,
                      const std::string& output);

}  // namespace dpproxy

#endif  // DPPROXY_TOOLS_DPCTL_CONTROL_COMMANDS_H_
