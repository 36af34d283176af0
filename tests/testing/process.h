// File: process.h
//
// Real child processes for tests that kill them with real signals: the
// shipped binaries from the test's runfiles, started with only stdin,
// stdout and stderr inherited (the test's own gRPC sockets must not live on
// in the children).
#ifndef DPPROXY_TESTS_TESTING_PROCESS_H_
#define DPPROXY_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace dpproxy::testing {

// The path of a data dependency, e.g. Runfile("tools/sample_plugin/sample_plugin").
std::string Runfile(const std::string& path);

// Starts args[0] with args; -1 (and a test failure) if it cannot.
pid_t Spawn(const std::vector<std::string>& args);

// Sends `sig` and waits for the process to end.
void Kill(pid_t pid, int sig);

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_PROCESS_H_
