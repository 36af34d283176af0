// File: upstream.h
//
// Which of Kubernetes' own tests each dpconform scenario stands for: the
// kubelet's node e2e tests of device plugins (test/e2e_node/device_plugin*
// in kubernetes/kubernetes) and of DRA (test/e2e_node/dra_test.go), by file
// and test name. A scenario no upstream test covers says so, and why.
#ifndef DPPROXY_TOOLS_CONFORM_UPSTREAM_H_
#define DPPROXY_TOOLS_CONFORM_UPSTREAM_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dpproxy::conform {

struct UpstreamTest {
  // Path in kubernetes/kubernetes.
  const char* file;
  // The test's name (its ginkgo.It text).
  const char* test;
};

struct UpstreamMapping {
  const char* scenario;
  // Empty: none upstream.
  std::vector<UpstreamTest> tests;
  // How the scenario relates to them: "same check", what it adds, or why
  // nothing upstream checks it.
  const char* relation;
};

// Every scenario's mapping, device-plugin scenarios first, then DRA's.
const std::vector<UpstreamMapping>& UpstreamMappings();

// The mapping of `scenario`; nullptr for a name that has none.
const UpstreamMapping* UpstreamOf(absl::string_view scenario);

// One line: "file: test; file: test", or "none upstream".
std::string UpstreamText(const UpstreamMapping& m);

}  // namespace dpproxy::conform

#endif  // DPPROXY_TOOLS_CONFORM_UPSTREAM_H_
