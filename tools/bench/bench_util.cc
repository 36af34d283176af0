#include "tools/bench/bench_util.h"

#include <errno.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proxy/util/files.h"

namespace dpproxy::bench {

Child Spawn(const std::vector<std::string>& args) {
  ChildSpec spec;
  spec.argv = args;
  absl::StatusOr<Child> child = ChildProcess::Start(spec);
  if (!child.ok()) {
    std::cerr << program_invocation_short_name << ": " << child.status().message() << "\n";
    exit(1);
  }
  return *std::move(child);
}

void Stop(Child& child) {
  if (child != nullptr) child->Stop(absl::Seconds(10));
  child.reset();
}

std::string ProcField(const Child& child, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", child->pid(), "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::string v = line.substr(field.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "?";
}

bool WaitForPath(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (PathExists(path)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[i];
}

}  // namespace dpproxy::bench
