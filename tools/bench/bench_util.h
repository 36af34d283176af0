// File: bench_util.h
//
// What the benches share: their processes (dpproxy, plugins, floors) as
// proxy/util's ChildProcess, a look at a process's /proc status, and
// percentiles.
#ifndef DPPROXY_TOOLS_BENCH_BENCH_UTIL_H_
#define DPPROXY_TOOLS_BENCH_BENCH_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proxy/util/child_process.h"

namespace dpproxy::bench {

using Child = std::unique_ptr<ChildProcess>;
// Starts `args` (output inherited); a bench that cannot start one of its
// processes says so and exits 1.
Child Spawn(const std::vector<std::string>& args);
// SIGTERM, and SIGKILL after 10 s; nothing for a process never started.
void Stop(Child& child);
// A field of the child's /proc/<pid>/status ("VmRSS"), as it reads; "?"
// where there is none.
std::string ProcField(const Child& child, const std::string& field);
bool WaitForPath(const std::string& path, absl::Duration timeout);

// The value at fraction `p` (0..1) of `v`, sorted; 0 if `v` is empty.
double Percentile(std::vector<double> v, double p);

}  // namespace dpproxy::bench

#endif  // DPPROXY_TOOLS_BENCH_BENCH_UTIL_H_
