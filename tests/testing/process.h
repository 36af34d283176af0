// File: process.h
//
// Real child processes for tests that kill them with real signals: the
// shipped binaries from the test's runfiles, started with only stdin
// (/dev/null), stdout and stderr open (the test's own gRPC sockets must not
// live on in the children).
#ifndef DPPROXY_TESTS_TESTING_PROCESS_H_
#define DPPROXY_TESTS_TESTING_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "proxy/util/child_process.h"

namespace dpproxy::testing {

// The path of a data dependency, e.g. Runfile("tools/sample_plugin/sample_plugin").
std::string Runfile(const std::string& path);

// Starts args[0] with args (proxy/util's ChildProcess, as the tools use:
// its own process group, stdout and stderr the test's); nullptr and a test
// failure if it cannot.
std::unique_ptr<ChildProcess> Spawn(const std::vector<std::string>& args);

// Sends `sig` and waits for the process to end (a test failure if it has
// not within a minute; it is then killed).
void Kill(ChildProcess* child, int sig);

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_TESTING_PROCESS_H_
