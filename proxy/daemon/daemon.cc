#include "proxy/daemon/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/synchronization/mutex.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/ops/in_place_upgrade.h"
#include "proxy/ops/ops_server.h"
#include "proxy/ops/systemd_notifier.h"
#include "proxy/cli/cli.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/metrics.h"
#include "proxy/server/proxy_server.h"
#include "proxy/server/status_model.h"
#include "proxy/util/files.h"

namespace dpproxy {
namespace {

// The HTTP listener of the dpproxy this one takes over from, or -1 (none
// offered: an older dpproxy, or one without a metrics address).
int ListenerFromPredecessor(const std::string& state_dir) {
  for (int generation : {0, 1}) {
    absl::StatusOr<int> fd = ReceiveListener(
        HandoffListenerSocket(state_dir, generation), absl::Seconds(2));
    if (fd.ok()) return *fd;
    if (fd.status().code() != absl::StatusCode::kNotFound) {
      LOG(WARNING) << "takeover: " << fd.status().message();
    }
  }
  return -1;
}

}  // namespace

int RunDaemon(const ProxyConfig& config, const DaemonOptions& options) {
  BlockTerminationSignals();
  // gRPC stays initialized until the process ends, which it does through
  // EndProcess once everything has stopped (grpc_util.h).
  KeepGrpcForProcess();
  ProxyServer server(config);
  // SIGUSR2: the binary at this path (the new build, once installed) takes
  // over from this process, as its child (docs/upgrade.md, systemd).
  InPlaceUpgrade upgrade(options.argv);
  // Taking over, the HTTP listener the running dpproxy shares is accepted
  // on only once this one is live and ready, or at the latest just before
  // the running one is told to finish: the probes answer for whichever
  // process is ready, never for one still starting.
  absl::Mutex accept_mu;
  OpsServer* accept_later = nullptr;  // guarded by accept_mu
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
    NotifyMainProcess();
  });
  // Events go to the log, the events file and the counts behind the
  // metrics; nothing in the daemon reads a history of them.
  server.events().SetHistory(0);
  // In JSON mode the events come as lines of their own from -v=1 on: at
  // the default verbosity a happening is one line, its log message.
  server.events().SetJsonLog(options.json_event_lines);
  if (!options.events_file.empty()) {
    if (absl::Status s = server.events().OpenFile(options.events_file); !s.ok()) {
      std::cerr << "dpproxy: " << s.message() << "\n";
      return 2;
    }
  }
  // systemd (Type=notify): READY=1 once every resource is registered, or
  // after 30 s; WATCHDOG=1 from the housekeeping thread. Nothing without it.
  SystemdNotifier notifier(absl::Seconds(30));
  std::atomic<bool> started_ok{false};
  server.SetHousekeepingHook([&notifier, &server, &started_ok, &accept_pending, &accept_now] {
    const std::vector<HealthCheck> ready = server.Readiness();
    notifier.OnPass(ready);
    if (!started_ok.load() || !accept_pending.load()) return;
    if (server.WaitForTakeover(absl::ZeroDuration())) {
      accept_now("the takeover has ended");
      return;
    }
    bool all = true;
    for (const HealthCheck& c : server.Liveness()) all = all && c.ok;
    for (const HealthCheck& c : ready) all = all && c.ok;
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
  auto metrics = std::make_shared<ProxyMetrics>(
      [&server, &started_ok] {
        return started_ok.load() ? server.Status(/*with_devices=*/false) : ProxyStatus();
      },
      &server.events());
  std::unique_ptr<OpsServer> ops;
  if (!config.metrics_address.empty()) {
    OpsHandlers handlers;
    handlers.live = [&server] { return server.Liveness(); };
    handlers.ready = [&server, &started_ok] {
      if (!started_ok.load()) {
        return std::vector<HealthCheck>{{"started", false, "dpproxy is starting"}};
      }
      return server.Readiness();
    };
    handlers.metrics.push_back(metrics);
    handlers.metrics.push_back(server.telemetry().registry());
    // Taking over: the running dpproxy hands its listener over, so the
    // same address answers throughout and nothing has to bind a port it
    // holds.
    OpsServer::Options ops_options;
    if (config.takeover && !config.state_dir.empty()) {
      ops_options.listener_fd = ListenerFromPredecessor(config.state_dir);
      ops_options.accept_later = true;
    }
    absl::StatusOr<std::unique_ptr<OpsServer>> started =
        OpsServer::Start(config.metrics_address, handlers, ops_options);
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
      started = OpsServer::Start(config.metrics_address, handlers, ops_options);
    }
    if (!started.ok()) {
      // Before anything else is touched: a --takeover that cannot serve
      // HTTP leaves the running dpproxy as it is.
      LOG(ERROR) << "cannot start: " << started.status().message()
                 << (config.takeover
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
    if (!IsLoopbackAddress(config.metrics_address)) {
      LOG(WARNING) << "metrics and probes are served at " << config.metrics_address
                   << ", which is not a loopback address: the endpoint has no authentication, "
                      "so anyone who can reach it sees resource names, device counts and "
                      "allocation activity (use 127.0.0.1:PORT, or protect the port)";
      server.events().Emit("metrics_exposed", {{"address", config.metrics_address}});
    }
    const std::string host =
        config.metrics_address.substr(0, config.metrics_address.rfind(':'));
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
    sig = pending != 0 ? std::exchange(pending, 0) : WaitForTerminationSignal();
    if (server.handoff_failed()) break;
    if (server.handed_over()) {
      LOG(INFO) << "handed over to the new dpproxy; exiting";
      break;
    }
    LOG(INFO) << "signal " << sig << " received";
    server.events().Emit("signal", {{"signal", sig}});
    if (sig == SIGUSR2) {
      if (config.state_dir.empty()) {
        LOG(ERROR) << "upgrade (SIGUSR2) refused: a takeover needs --state_dir";
      } else if (absl::Status s = upgrade.Start(); !s.ok()) {
        LOG(ERROR) << "upgrade (SIGUSR2) refused: " << s.message();
      }
      continue;
    }
    if (sig != SIGHUP) break;
    // A reload: the flags as given at start, the --config file as it is now.
    absl::StatusOr<ProxyConfig> next = options.reread_config();
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
  const int code = server.handoff_failed() ? 1 : 0;
  if (code == 0 && server.handed_over() && options.wait_after_handoff) {
    // Everything is closed; a container runtime that would restart an
    // exited dpproxy (which would then take over back) waits for the pod's
    // deletion instead.
    LOG(INFO) << "handed over; waiting for SIGTERM (--after_handoff=wait)";
    for (;;) {
      const int s = WaitForTerminationSignal();
      if (s != SIGHUP) break;
    }
  }
  google::FlushLogFiles(google::GLOG_INFO);
  EndProcess(code);
}

}  // namespace dpproxy
