// dpproxy: bridges Kubernetes device-plugin API versions. Parses the
// command line into a ProxyConfig (proxy/config) and runs the daemon
// (proxy/daemon/daemon.h), or one of the subcommands that read a running
// one (proxy/daemon/commands.h).
#include <malloc.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "absl/synchronization/mutex.h"
#include "proxy/cli/cli.h"
#include "proxy/config/config_file.h"
#include "proxy/config/flags.h"
#include "proxy/daemon/commands.h"
#include "proxy/daemon/daemon.h"
#include "proxy/ops/in_place_upgrade.h"
#include "proxy/ops/json_log.h"
#include "proxy/version/version.h"

namespace dpproxy {
namespace {

constexpr char kUsage[] = R"(dpproxy: bridges Kubernetes device-plugin API versions.

Usage:
  dpproxy [flags]                 run the proxy
  dpproxy status [--status_file=F] [--output=table|json]
                                  show what a running dpproxy is doing; exits
                                  0 when it is ready (as /readyz), 3 when it
                                  is not, 1 when there is no status to read
  dpproxy reload [--status_file=F]
                                  make a running dpproxy re-read its --config
                                  file (SIGHUP to the pid its status file
                                  names, or to PID 1 in a container where that
                                  is dpproxy and there is no status file);
                                  exits 1 when there is no dpproxy to tell
  dpproxy wait [--plugin_dir=D] [--wait_timeout=60s]
                                  wait until a dpproxy serves plugin
                                  registrations at <plugin_dir>/kubelet.sock;
                                  exits 0 then, 1 at the timeout. Start a
                                  vendor plugin after it (an init container,
                                  or `dpproxy ... & dpproxy wait && exec
                                  plugin`): a plugin that watches kubelet.sock
                                  and starts before it is created may restart
                                  itself on the creation it saw
  dpproxy version                 print the version and the commit

Toward the kubelet, dpproxy registers one device plugin per resource in
whichever API the kubelet accepts (v1alpha of 1.9, v1beta1 from 1.10,
synchronous registration from 1.25, or the plugin watcher). Toward vendor
plugins it is a kubelet: point a plugin's kubelet socket at
<plugin_dir>/kubelet.sock and it registers there, in v1alpha ("v1alpha2")
or v1beta1, unchanged. Every call is translated (see docs/translation.md).
SIGTERM or SIGINT stop it cleanly. SIGHUP re-reads the --config file: a
file with errors is refused (the running configuration stays); otherwise
static backends, the backend-loss policy, the call timeouts, CDI
annotations, renames, ID maps and compact IDs change at once, and every
other change is logged as taking effect at the next start (see
docs/operations.md). To upgrade dpproxy without a gap, start the new one
beside it with --takeover: the running one hands its state over and exits
once the new one is registered; or install the new build at the same path
and send SIGUSR2: the running one starts it, as its child, with
--takeover (under systemd it becomes the service's main process). A new
one that fails before it is done gives the state back (docs/upgrade.md).
Logs go to stderr in klog's text format or, with --log_format=json, klog's
JSON format (-v=1 for per-call detail).

On --metrics_address: /metrics (docs/metrics.md), /livez and /healthz (the
housekeeping thread is not stuck), /readyz (every resource registered with
the kubelet, the state writable; ?verbose lists each check). Under systemd
(Type=notify) it sends READY=1 once registered, watchdog keep-alives and
STATUS= lines.

Example:
  dpproxy --kubelet_root=/var/lib/kubelet --plugin_dir=/var/lib/dpproxy/device-plugins

Flags:
)";

// The status file `dpproxy status` and `dpproxy reload` read: as the
// daemon writes it, it follows --state_dir unless named.
std::string StatusFilePath() {
  return gflags::GetCommandLineFlagInfoOrDie("status_file").is_default
             ? DefaultStatusFile(FLAGS_state_dir)
             : FLAGS_status_file;
}

// The process's memory and locking settings, before anything allocates
// much or takes a lock.
void TuneProcess() {
  // glibc gives threads arenas of their own (up to 8 per core), and memory
  // freed in one is not reused by another: device lists built on gRPC's
  // threads and dropped on ours left RSS 20 MB higher at 8 x 10,000
  // devices. dpproxy's allocations are not contended; two arenas suffice.
  // (MALLOC_ARENA_MAX in the environment still wins.)
  if (::getenv("MALLOC_ARENA_MAX") == nullptr) ::mallopt(M_ARENA_MAX, 2);
  // Device lists and the messages they arrive in are large, short-lived
  // buffers. glibc raises its mmap threshold to the size of each mapped
  // block freed (up to 32 MiB), after which such buffers come from the
  // arenas and leave holes there that RSS keeps. A fixed threshold keeps
  // them mapped, each given back whole when freed.
  if (::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  // Abseil checks every Mutex acquisition against a global graph of lock
  // orders unless built with NDEBUG (Debian's is not): a process-wide lock
  // on every Allocate's path. The tests keep it on, where it finds lock-
  // order bugs; the daemon does not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

// Logging as --log_format asks (klog's text or JSON, json_log.h), to
// stderr; false (said on stderr) for a value it does not know.
bool StartLogging(const char* argv0) {
  if (FLAGS_log_format != "text" && FLAGS_log_format != "json") {
    std::cerr << "dpproxy: --log_format=" << FLAGS_log_format << " is not text or json\n";
    return false;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  if (FLAGS_log_format == "json") {
    UseJsonLogs();
  } else {
    UseTextLogs();
  }
  return true;
}

// Runs the daemon with the configuration the flags and the --config file
// give, or prints it (--check). The process's exit status.
int RunFromFlags(std::vector<std::string> started_argv) {
  if (FLAGS_after_handoff != "exit" && FLAGS_after_handoff != "wait") {
    std::cerr << "dpproxy: --after_handoff=" << FLAGS_after_handoff << " is not exit or wait\n";
    return 2;
  }
  // Nothing dpproxy creates is readable or writable by others unless it
  // says so (sockets and files also get explicit modes, whatever the umask).
  ::umask(077);
  absl::StatusOr<ProxyConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    std::cerr << "dpproxy: " << config.status().message() << "\n";
    return 2;
  }
  if (FLAGS_check) {
    std::cout << "# the configuration is valid; every setting in effect:\n"
              << ConfigToYaml(*config);
    return 0;
  }
  DaemonOptions options;
  options.argv = std::move(started_argv);
  options.events_file = FLAGS_events;
  // In JSON mode the events come as lines of their own from -v=1 on: at
  // the default verbosity a happening is one line, its log message.
  options.json_event_lines = FLAGS_log_format == "json" && FLAGS_v >= 1;
  options.wait_after_handoff = FLAGS_after_handoff == "wait";
  options.reread_config = [] { return ConfigFromFlags(); };
  return RunDaemon(*config, options);
}

}  // namespace
}  // namespace dpproxy

int main(int argc, char** argv) {
  dpproxy::TuneProcess();
  // The command line as given, for an in-place upgrade (SIGUSR2).
  std::vector<std::string> started_argv(argv, argv + argc);
  started_argv[0] = dpproxy::AbsoluteProgramPath(started_argv[0]);
  std::string command = "run";
  if (argc >= 2 && argv[1][0] != '-') {
    command = argv[1];
    dpproxy::ShiftArgs(&argc, argv);
  }
  if (command == "version" || (argc == 2 && std::string(argv[1]) == "--version")) {
    std::cout << "dpproxy " << dpproxy::kDpproxyVersion << " (commit " << dpproxy::kDpproxyCommit
              << ")\n";
    return 0;
  }
  if (command != "run" && command != "status" && command != "reload" && command != "wait" &&
      command != "help") {
    std::cerr << "dpproxy: unknown subcommand \"" << command << "\"; see dpproxy --help\n";
    return 2;
  }
  if (dpproxy::WantsHelp(argc, argv) || command == "help") {
    std::cout << dpproxy::kUsage << dpproxy::FlagsHelp({"proxy/config/flags.cc"});
    return 0;
  }
  if (!dpproxy::ParseFlags("dpproxy", &argc, &argv)) return 2;
  if (command == "status") return dpproxy::PrintStatus(dpproxy::StatusFilePath(), FLAGS_output);
  if (command == "reload") return dpproxy::Reload(dpproxy::StatusFilePath());
  if (command == "wait") {
    return dpproxy::WaitForRegistrationSocket(FLAGS_plugin_dir, FLAGS_wait_timeout);
  }
  if (!dpproxy::StartLogging(argv[0])) return 2;
  return dpproxy::RunFromFlags(std::move(started_argv));
}
