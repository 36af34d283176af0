// dpproxy: bridges Kubernetes device-plugin API versions. Parses the
// command line into a ProxyConfig (proxy/config), runs a ProxyServer with its
// metrics endpoint until SIGTERM or SIGINT, or prints a running one's status.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>

#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proxy/cli/cli.h"
#include "proxy/config/config_file.h"
#include "proxy/config/flags.h"
#include "proxy/events/event_log.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/ops/in_place_upgrade.h"
#include "proxy/ops/json_log.h"
#include "proxy/ops/ops_server.h"
#include "proxy/ops/systemd_notifier.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/metrics.h"
#include "proxy/server/proxy_server.h"
#include "proxy/server/status_model.h"
#include "proxy/util/files.h"
#include "proxy/version.h"

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

// `dpproxy status`: the status file says dpproxy is not ready.
constexpr int kExitNotReady = 3;

int PrintStatus() {
  // As the daemon does: the status file follows --state_dir unless named.
  const std::string path = gflags::GetCommandLineFlagInfoOrDie("status_file").is_default
                               ? dpproxy::DefaultStatusFile(FLAGS_state_dir)
                               : FLAGS_status_file;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    std::cerr << "dpproxy: no status at " << path
              << " (is dpproxy running with this --status_file or --state_dir?): "
              << text.status().message() << "\n";
    return 1;
  }
  const Json json = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<ProxyStatus> st = StatusFromJson(json);
  if (json.is_discarded() || !st.ok()) {
    std::cerr << "dpproxy: " << path << " is not a status file"
              << (st.ok() ? "" : absl::StrCat(" (", st.status().message(), ")")) << "\n";
    return 1;
  }
  if (FLAGS_output != "table" && FLAGS_output != "json") {
    std::cerr << "dpproxy: --output=" << FLAGS_output << " is not table or json\n";
    return 2;
  }
  std::cout << (FLAGS_output == "json" ? json.dump(2) + "\n" : StatusTable(*st));
  // As /readyz: a script can wait for dpproxy with `dpproxy status`.
  return st->not_ready.empty() ? 0 : kExitNotReady;
}

// `dpproxy wait`: until a process listens at <plugin_dir>/kubelet.sock.
int WaitForRegistrationSocket() {
  absl::StatusOr<absl::Duration> timeout = ParseFlagDuration("wait_timeout", FLAGS_wait_timeout);
  if (!timeout.ok()) {
    std::cerr << "dpproxy: " << timeout.status().message() << "\n";
    return 2;
  }
  const std::string socket = JoinPath(FLAGS_plugin_dir, "kubelet.sock");
  const absl::Time deadline = absl::Now() + *timeout;
  for (;;) {
    if (SomeoneListens(socket)) {
      std::cout << "dpproxy: plugins can register at " << socket << "\n";
      return 0;
    }
    if (absl::Now() >= deadline) break;
    // A poll of a path, with nothing to be woken by: 50 ms apart.
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
  std::cerr << "dpproxy: nothing serves plugin registrations at " << socket << " after "
            << absl::FormatDuration(*timeout) << " (is dpproxy running with this --plugin_dir?)\n";
  return 1;
}

// Whether process `pid` runs a dpproxy binary (its executable's name
// starts with "dpproxy": a pid from an old status file may be anyone's now).
bool IsDpproxy(int64_t pid) {
  const std::optional<std::string> path = dpproxy::ExecutableOf(absl::StrCat(pid));
  if (!path.has_value()) return false;
  return absl::StartsWith(path->substr(path->rfind('/') + 1), "dpproxy");
}

// `dpproxy reload`: SIGHUP to the running dpproxy, without a shell (the
// image has none): the pid from its status file, else PID 1 if that is a
// dpproxy (a container's).
int Reload() {
  const std::string path = gflags::GetCommandLineFlagInfoOrDie("status_file").is_default
                               ? dpproxy::DefaultStatusFile(FLAGS_state_dir)
                               : FLAGS_status_file;
  int64_t pid = 0;
  std::string from;
  if (absl::StatusOr<std::string> text = ReadFile(path); text.ok()) {
    absl::StatusOr<ProxyStatus> st =
        StatusFromJson(Json::parse(*text, nullptr, /*allow_exceptions=*/false));
    if (!st.ok() || st->pid <= 0) {
      std::cerr << "dpproxy: " << path << " is not a status file naming a process\n";
      return 1;
    }
    pid = st->pid;
    from = absl::StrCat("named by ", path);
  } else if (IsDpproxy(1)) {
    pid = 1;
    from = "PID 1";
  } else {
    std::cerr << "dpproxy: no status at " << path << " (" << text.status().message()
              << "), and PID 1 is not dpproxy; name the running one's --status_file or "
              << "--state_dir\n";
    return 1;
  }
  if (!IsDpproxy(pid)) {
    std::cerr << "dpproxy: process " << pid << " (" << from
              << ") is not a dpproxy (an old status file?); nothing was sent\n";
    return 1;
  }
  if (::kill(static_cast<pid_t>(pid), SIGHUP) != 0) {
    std::cerr << "dpproxy: cannot signal process " << pid << " (" << from
              << "): " << ErrnoText(errno) << "\n";
    return 1;
  }
  std::cout << "dpproxy (pid " << pid << ", " << from
            << ") re-reads its configuration; its log says what changed, or why the file "
               "was refused\n";
  return 0;
}

}  // namespace
}  // namespace dpproxy

namespace {

// The HTTP listener of the dpproxy this one takes over from, or -1 (none
// offered: an older dpproxy, or one without a metrics address).
int ListenerFromPredecessor(const std::string& state_dir) {
  for (int generation : {0, 1}) {
    absl::StatusOr<int> fd = dpproxy::ReceiveListener(
        dpproxy::HandoffListenerSocket(state_dir, generation), absl::Seconds(2));
    if (fd.ok()) return *fd;
    if (fd.status().code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "takeover: " << fd.status().message();
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
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
  if (command == "status") return dpproxy::PrintStatus();
  if (command == "reload") return dpproxy::Reload();
  if (command == "wait") return dpproxy::WaitForRegistrationSocket();
  if (FLAGS_log_format != "text" && FLAGS_log_format != "json") {
    std::cerr << "dpproxy: --log_format=" << FLAGS_log_format << " is not text or json\n";
    return 2;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_after_handoff != "exit" && FLAGS_after_handoff != "wait") {
    std::cerr << "dpproxy: --after_handoff=" << FLAGS_after_handoff << " is not exit or wait\n";
    return 2;
  }
  // klog's formats (json_log.h), whichever is asked for.
  if (FLAGS_log_format == "json") {
    dpproxy::UseJsonLogs();
  } else {
    dpproxy::UseTextLogs();
  }
  // Nothing dpproxy creates is readable or writable by others unless it
  // says so (sockets and files also get explicit modes, whatever the umask).
  ::umask(077);
  absl::StatusOr<dpproxy::ProxyConfig> config = dpproxy::ConfigFromFlags();
  if (!config.ok()) {
    std::cerr << "dpproxy: " << config.status().message() << "\n";
    return 2;
  }
  if (FLAGS_check) {
    std::cout << "# the configuration is valid; every setting in effect:\n"
              << dpproxy::ConfigToYaml(*config);
    return 0;
  }
  dpproxy::BlockTerminationSignals();
  // gRPC stays initialized until the process ends, which it does through
  // EndProcess once everything has stopped (grpc_util.h).
  dpproxy::KeepGrpcForProcess();
  dpproxy::ProxyServer server(*config);
  // SIGUSR2: the binary at this path (the new build, once installed) takes
  // over from this process, as its child (docs/upgrade.md, systemd).
  dpproxy::InPlaceUpgrade upgrade(started_argv);
  // Taking over, the HTTP listener the running dpproxy shares is accepted
  // on only once this one is live and ready, or at the latest just before
  // the running one is told to finish: the probes answer for whichever
  // process is ready, never for one still starting.
  absl::Mutex accept_mu;
  dpproxy::OpsServer* accept_later = nullptr;  // guarded by accept_mu
  std::atomic<bool> accept_pending{false};
  auto accept_now = [&accept_mu, &accept_later, &accept_pending](const char* why) {
    absl::MutexLock lock(&accept_mu);
    accept_pending = false;
    if (accept_later == nullptr) return;
    LOG(INFO) << "takeover: answering on the shared HTTP listener from now on (" << why << ")";
    accept_later->Accept();
    accept_later = nullptr;
  };
  server.SetBeforeFinishHook([&accept_now] {
    accept_now("the running dpproxy is told to finish");
    dpproxy::NotifyMainProcess();
  });
  // Events go to the log, the events file and the counts behind the
  // metrics; nothing in the daemon reads a history of them.
  server.events().SetHistory(0);
  // In JSON mode the events come as lines of their own from -v=1 on: at
  // the default verbosity a happening is one line, its log message.
  server.events().SetJsonLog(FLAGS_log_format == "json" && FLAGS_v >= 1);
  if (!FLAGS_events.empty()) {
    if (absl::Status s = server.events().OpenFile(FLAGS_events); !s.ok()) {
      std::cerr << "dpproxy: " << s.message() << "\n";
      return 2;
    }
  }
  // systemd (Type=notify): READY=1 once every resource is registered, or
  // after 30 s; WATCHDOG=1 from the housekeeping thread. Nothing without it.
  dpproxy::SystemdNotifier notifier(absl::Seconds(30));
  std::atomic<bool> started_ok{false};
  server.SetHousekeepingHook([&notifier, &server, &started_ok, &accept_pending, &accept_now] {
    const std::vector<dpproxy::HealthCheck> ready = server.Readiness();
    notifier.OnPass(ready);
    if (!started_ok.load() || !accept_pending.load()) return;
    if (server.WaitForTakeover(absl::ZeroDuration())) {
      accept_now("the takeover has ended");
      return;
    }
    bool all = true;
    for (const dpproxy::HealthCheck& c : server.Liveness()) all = all && c.ok;
    for (const dpproxy::HealthCheck& c : ready) all = all && c.ok;
    if (all) accept_now("live and ready");
  });
  // Handed over to a dpproxy started with --takeover: stop as on SIGTERM
  // (the main thread waits for signals; every thread blocks them).
  server.SetHandedOverHook([] { ::kill(::getpid(), SIGTERM); });
  if (notifier.watchdog() > absl::ZeroDuration()) {
    LOG(INFO) << "systemd watchdog: a keep-alive every "
              << absl::FormatDuration(notifier.watchdog() / 2);
  }
  // The HTTP listener first: everything that can fail is tried before a
  // --takeover asks the running dpproxy to release its state.
  // Until Start() has returned, the probes say so and the metrics hold no
  // resource (the server's parts are made in Start).
  auto metrics = std::make_shared<dpproxy::ProxyMetrics>(
      [&server, &started_ok] {
        return started_ok.load() ? server.Status(/*with_devices=*/false) : dpproxy::ProxyStatus();
      },
      &server.events());
  std::unique_ptr<dpproxy::OpsServer> ops;
  if (!config->metrics_address.empty()) {
    dpproxy::OpsHandlers handlers;
    handlers.live = [&server] { return server.Liveness(); };
    handlers.ready = [&server, &started_ok] {
      if (!started_ok.load()) {
        return std::vector<dpproxy::HealthCheck>{{"started", false, "dpproxy is starting"}};
      }
      return server.Readiness();
    };
    handlers.metrics.push_back(metrics);
    handlers.metrics.push_back(server.telemetry().registry());
    // Taking over: the running dpproxy hands its listener over, so the
    // same address answers throughout and nothing has to bind a port it
    // holds.
    dpproxy::OpsServer::Options ops_options;
    if (config->takeover && !config->state_dir.empty()) {
      ops_options.listener_fd = ListenerFromPredecessor(config->state_dir);
      ops_options.accept_later = true;
    }
    absl::StatusOr<std::unique_ptr<dpproxy::OpsServer>> started =
        dpproxy::OpsServer::Start(config->metrics_address, handlers, ops_options);
    if (started.ok() && ops_options.listener_fd >= 0) {
      LOG(INFO) << "takeover: serving the metrics address on the listener the running dpproxy "
                   "handed over";
    } else if (!started.ok() && ops_options.listener_fd >= 0) {
      // Another pod's listener is expected (each pod has an address of
      // its own); anything else is worth a warning.
      if (absl::IsFailedPrecondition(started.status())) {
        LOG(INFO) << "takeover: " << started.status().message() << ": binding it";
      } else {
        LOG(WARNING) << started.status().message() << "; binding the address instead";
      }
      ops_options.listener_fd = -1;
      started = dpproxy::OpsServer::Start(config->metrics_address, handlers, ops_options);
    }
    if (!started.ok()) {
      // Before anything else is touched: a --takeover that cannot serve
      // HTTP leaves the running dpproxy as it is.
      LOG(ERROR) << "cannot start: " << started.status().message()
                 << (config->takeover
                         ? " (nothing was taken over: the running dpproxy goes on; it holds "
                           "its own --metrics_address, so give the new one another)"
                         : "");
      return 1;
    }
    ops = *std::move(started);
    server.SetSharedListener(ops->listener_fd());
    if (!ops->accepting()) {
      absl::MutexLock lock(&accept_mu);
      accept_later = ops.get();
      accept_pending = true;
    }
    if (!dpproxy::IsLoopbackAddress(config->metrics_address)) {
      LOG(WARNING) << "metrics and probes are served at " << config->metrics_address
                   << ", which is not a loopback address: the endpoint has no authentication, "
                      "so anyone who can reach it sees resource names, device counts and "
                      "allocation activity (use 127.0.0.1:PORT, or protect the port)";
      server.events().Emit("metrics_exposed", {{"address", config->metrics_address}});
    }
    const std::string host =
        config->metrics_address.substr(0, config->metrics_address.rfind(':'));
    LOG(INFO) << "metrics at http://" << host << ":" << ops->port()
              << "/metrics; probes at /livez, /healthz and /readyz";
  }
  // SIGTERM or SIGINT while Start() runs (in DRA mode it may wait on a
  // slow API server): its API calls end at once, and the signal is acted
  // on as soon as it returns.
  std::atomic<bool> start_returned{false};
  std::atomic<int> start_signal{0};
  std::thread start_watch([&] {
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    const timespec tick{0, 100 * 1000 * 1000};
    while (!start_returned.load()) {
      const int got = ::sigtimedwait(&stops, nullptr, &tick);
      if (got == SIGTERM || got == SIGINT) {
        LOG(INFO) << "signal " << got << " received while starting: API calls cancelled";
        start_signal.store(got);
        server.CancelStart();
        return;
      }
    }
  });
  const absl::Status started = server.Start();
  start_returned.store(true);
  start_watch.join();
  auto close_ops = [&] {
    {
      absl::MutexLock lock(&accept_mu);
      accept_later = nullptr;
    }
    ops.reset();
  };
  if (!started.ok()) {
    LOG(ERROR) << "cannot start: " << started.message();
    close_ops();
    return start_signal.load() != 0 ? 0 : 1;
  }
  started_ok = true;
  int sig = 0;
  int pending = start_signal.load();
  for (;;) {
    sig = pending != 0 ? std::exchange(pending, 0) : dpproxy::WaitForTerminationSignal();
    if (server.handoff_failed()) break;
    if (server.handed_over()) {
      LOG(INFO) << "handed over to the new dpproxy; exiting";
      break;
    }
    LOG(INFO) << "signal " << sig << " received";
    server.events().Emit("signal", {{"signal", sig}});
    if (sig == SIGUSR2) {
      if (config->state_dir.empty()) {
        LOG(ERROR) << "upgrade (SIGUSR2) refused: a takeover needs --state_dir";
      } else if (absl::Status s = upgrade.Start(); !s.ok()) {
        LOG(ERROR) << "upgrade (SIGUSR2) refused: " << s.message();
      }
      continue;
    }
    if (sig != SIGHUP) break;
    // A reload: the flags as given at start, the --config file as it is now.
    absl::StatusOr<dpproxy::ProxyConfig> next = dpproxy::ConfigFromFlags();
    if (!next.ok()) {
      LOG(ERROR) << "reload refused, the running configuration stays: "
                 << next.status().message();
      server.events().Emit("config_reload_refused",
                           {{"error", std::string(next.status().message())}});
      continue;
    }
    server.Reload(*next);
  }
  // Handed over: systemd supervises the new main process now; this one's
  // end is not the service's.
  if (!server.handed_over()) notifier.Stopping();
  close_ops();
  server.Shutdown();
  auto end = [](int code) {
    google::FlushLogFiles(google::GLOG_INFO);
    dpproxy::EndProcess(code);
  };
  if (server.handoff_failed()) end(1);
  if (server.handed_over() && FLAGS_after_handoff == "wait") {
    // Everything is closed; a container runtime that would restart an
    // exited dpproxy (which would then take over back) waits for the pod's
    // deletion instead.
    LOG(INFO) << "handed over; waiting for SIGTERM (--after_handoff=wait)";
    for (;;) {
      const int s = dpproxy::WaitForTerminationSignal();
      if (s != SIGHUP) break;
    }
  }
  end(0);
}
