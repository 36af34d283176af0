// What the tests of dpconform against real processes share: the sample
// plugin's command for a conformance run, the releases where its faults
// differ, a work directory of the test's own, and a cell described for a
// failure message.
#ifndef DPPROXY_TESTS_CONFORM_CONFORM_TESTING_H_
#define DPPROXY_TESTS_CONFORM_CONFORM_TESTING_H_

#include <string>
#include <vector>

#include "tools/conform/conform.h"

namespace dpproxy::testing {

// Releases where the faults differ: before GetPreferredAllocation (1.18),
// asynchronous Register (1.24), synchronous Register (1.25), CDI behind its
// gate, off by default (1.28), CDI GA (1.31).
extern const std::vector<std::string> kFaultReleases;

// The sample plugin binary, from the runfiles.
std::string SamplePlugin();

// The kit keeps the directories of cells that fail (by design, for a
// person to look at), and these tests make cells fail: they go in a
// directory of the test's own, removed when it ends, not in /tmp.
const std::string& ConformWorkRoot();

// A run of the sample plugin with `plugin_flags` against kFaultReleases, its
// health set through its control socket, with deadlines for a test. A cell
// that fails leaves its files in the test's outputs (KeepFailedCell).
conform::ConformOptions SamplePluginRun(const std::string& plugin_flags);

// Under Bazel, copies the files of a failed cell's directory (the plugin's
// output, the kubelet's events, dpproxy's log) into the test's undeclared
// outputs, which outlive the work root; nothing otherwise.
void KeepFailedCell(const conform::CellResult& c);

// "scenario on release: outcome (summary) what the plugin did".
std::string DescribeCell(const conform::CellResult& c);

}  // namespace dpproxy::testing

#endif  // DPPROXY_TESTS_CONFORM_CONFORM_TESTING_H_
