#include "tests/conform/conform_testing.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "tests/testing/process.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/temp_dir.h"

namespace dpproxy::testing {

const std::vector<std::string> kFaultReleases = {"1.18", "1.24", "1.25", "1.28", "1.31"};

std::string SamplePlugin() { return Runfile("tools/sample_plugin/sample_plugin"); }

const std::string& ConformWorkRoot() {
  static const ShortTempDir dir;
  return dir.path();
}

void KeepFailedCell(const conform::CellResult& c) {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (outputs == nullptr || c.dir.empty() || c.outcome != conform::Outcome::kFail) return;
  namespace fs = std::filesystem;
  const fs::path from(c.dir);
  // <run>-<cell>-<release>-<scenario>: the run's directory tells runs apart.
  const fs::path to = fs::path(outputs) / absl::StrCat(from.parent_path().filename().string(), "-",
                                                        from.filename().string(), "-", c.kubelet,
                                                        "-", c.scenario);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(from, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;  // sockets, directories
    const fs::path target = to / fs::relative(it->path(), from, ec);
    fs::create_directories(target.parent_path(), ec);
    fs::copy_file(it->path(), target, fs::copy_options::overwrite_existing, ec);
  }
}

conform::ConformOptions SamplePluginRun(const std::string& plugin_flags) {
  conform::ConformOptions o;
  o.work_root = ConformWorkRoot();
  o.resources = {"example.com/gpu"};
  o.plugin_command = absl::StrCat(SamplePlugin(),
                                  " --quiet --resource=example.com/gpu"
                                  " --kubelet_socket={kubelet_socket}"
                                  " --plugins_registry_dir={plugins_registry}"
                                  " --control_socket={work_dir}/control.sock ",
                                  plugin_flags);
  o.health_command = absl::StrCat(SamplePlugin(),
                                  " set-health --control_socket={work_dir}/control.sock"
                                  " --device={device} --health={health} >/dev/null");
  for (const std::string& k : kFaultReleases) o.kubelets.push_back(*sim::ParseKubeletVersion(k));
  // Deadlines on work: the simulator's dial of a plugin that serves (an
  // ASan sample plugin on a loaded machine once answered the plugin
  // watcher's dial after 1 s), stretched in an instrumented build; and
  // every wait of a scenario (a registration, a device list, the sample
  // plugin encoding and sending its 4.6 MB list for huge-list). These run
  // four cells at once beside other tests and builds, where a wait that
  // takes 50-110 ms alone once took over 6 s: 18 s in every build. Cells
  // that pass end as soon as they do; only a fault that shows as silence
  // waits a deadline out.
  o.dial_timeout = absl::Seconds(1) * kWorkSlowdown;
  o.timeout = absl::Seconds(18);
  o.settle = absl::Milliseconds(500);
  o.jobs = 4;
  o.on_cell = [](const conform::CellResult& c, size_t, size_t) { KeepFailedCell(c); };
  return o;
}

std::string DescribeCell(const conform::CellResult& c) {
  return absl::StrCat(c.scenario, " on ", c.kubelet, ": ", conform::OutcomeName(c.outcome),
                      c.blocked_by.empty() ? "" : absl::StrCat(" by ", c.blocked_by), " (",
                      c.summary, ") ", c.plugin_did);
}

}  // namespace dpproxy::testing
