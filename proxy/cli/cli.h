// File: cli.h
//
// Command-line helpers shared by the dpproxy binaries: a --help that lists
// only the binary's own flags (not glog's) with their defaults, and
// subcommand dispatch.
#ifndef DPPROXY_PROXY_CLI_CLI_H_
#define DPPROXY_PROXY_CLI_CLI_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dpproxy {

// Text of every gflags flag defined in a file whose path contains one of
// `file_substrings`, one paragraph each: name, type, default, description.
std::string FlagsHelp(const std::vector<std::string>& file_substrings);

// True if argv asks for help: "--help", "-h", "-help" or "help".
bool WantsHelp(int argc, char** argv);

// Removes argv[1] (a subcommand name) so gflags sees only flags.
void ShiftArgs(int* argc, char** argv);

}  // namespace dpproxy



namespace dpproxy {

// Rewrites "--some-flag" to "--some_flag" (the part before '='), so people
// can type either; gflags only knows underscores.
void NormalizeFlagDashes(int argc, char** argv);

// Parses the flags (dashes or underscores) as every dpproxy binary does:
// an unknown flag, or an argument left over, is reported on stderr as
// "<program>: ..." with a pointer to --help. True if the flags are fine;
// false means exit with status 2 (bad usage, for every tool). --version
// prints "<program> VERSION (commit ...)" and exits 0.
bool ParseFlags(const char* program, int* argc, char*** argv);

// Parses a duration flag ("500ms", "10s", "5m"); kInvalidArgument naming
// the flag if it is not one or is negative.
absl::StatusOr<absl::Duration> ParseFlagDuration(const char* name, const std::string& value);

// Blocks SIGTERM, SIGINT, SIGHUP and SIGUSR2 (an in-place upgrade) in the
// calling thread and the threads it starts later; call before starting any
// thread.
void BlockTerminationSignals();

// Waits for SIGTERM, SIGINT, SIGHUP or SIGUSR2; returns the signal number.
int WaitForTerminationSignal();

}  // namespace dpproxy
#endif  // DPPROXY_PROXY_CLI_CLI_H_
