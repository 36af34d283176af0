#include "proxy/daemon/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/synchronization/mutex.h"
#include "proxy/cli/cli.h"
#include "proxy/handoff/listener_share.h"
#include "proxy/ops/in_place_upgrade.h"
#include "proxy/ops/ops_server.h"
#include "proxy/ops/systemd_notifier.h"
#include "proxy/rpc/grpc_util.h"
#include "proxy/server/metrics.h"
#include "proxy/server/proxy_server.h"
#include "proxy/status/status_model.h"
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

// The daemon's parts and the steps that start, run and stop them.
class Daemon {
 public:
  Daemon(const ProxyConfig& config, const DaemonOptions& options)
      : config_(config),
        options_(options),
        server_(config),
        // SIGUSR2: the binary at this path (the new build, once installed)
        // takes over from this process, as its child (docs/upgrade.md).
        upgrade_(options.argv),
        // systemd (Type=notify): READY=1 once every resource is registered,
        // or after 30 s; WATCHDOG=1 from the housekeeping thread. Nothing
        // without it.
        notifier_(absl::Seconds(30)) {}

  int Run() {
    if (absl::Status s = WireEvents(); !s.ok()) {
      std::cerr << "dpproxy: " << s.message() << "\n";
      return 2;
    }
    WireHooks();
    // The HTTP listener first: everything that can fail is tried before a
    // --takeover asks the running dpproxy to release its state.
    if (absl::Status s = StartOps(); !s.ok()) {
      // Before anything else is touched: a --takeover that cannot serve
      // HTTP leaves the running dpproxy as it is.
      LOG(ERROR) << "cannot start: " << s.message()
                 << (config_.takeover
                         ? " (nothing was taken over: the running dpproxy goes on; it holds "
                           "its own --metrics_address, so give the new one another)"
                         : "");
      return 1;
    }
    int start_signal = 0;
    if (!StartServer(&start_signal)) return start_signal != 0 ? 0 : 1;
    started_ok_ = true;
    ServeSignals(start_signal);
    Stop();
  }

 private:
  absl::Status WireEvents() {
    // Events go to the log, the events file and the counts behind the
    // metrics; nothing in the daemon reads a history of them.
    server_.events().SetHistory(0);
    server_.events().SetJsonLog(options_.json_event_lines);
    if (options_.events_file.empty()) return absl::OkStatus();
    return server_.events().OpenFile(options_.events_file);
  }

  void WireHooks() {
    server_.SetBeforeFinishHook([this] {
      AcceptNow("the running dpproxy is told to finish");
      NotifyMainProcess();
    });
    server_.SetHousekeepingHook([this] { OnHousekeeping(); });
    // Handed over to a dpproxy started with --takeover: stop as on SIGTERM
    // (the main thread waits for signals; every thread blocks them).
    server_.SetHandedOverHook([] { ::kill(::getpid(), SIGTERM); });
    if (notifier_.watchdog() > absl::ZeroDuration()) {
      LOG(INFO) << "systemd watchdog: a keep-alive every "
                << absl::FormatDuration(notifier_.watchdog() / 2);
    }
  }

  // Each housekeeping pass: systemd hears how ready dpproxy is, and a
  // listener taken over is accepted on once this one is live and ready.
  void OnHousekeeping() {
    const std::vector<HealthCheck> ready = server_.Readiness();
    notifier_.OnPass(ready);
    if (!started_ok_.load() || !accept_pending_.load()) return;
    if (server_.WaitForTakeover(absl::ZeroDuration())) {
      AcceptNow("the takeover has ended");
      return;
    }
    bool all = true;
    for (const HealthCheck& c : server_.Liveness()) all = all && c.ok;
    for (const HealthCheck& c : ready) all = all && c.ok;
    if (all) AcceptNow("live and ready");
  }

  // Taking over, the HTTP listener the running dpproxy shares is accepted
  // on only once this one is live and ready, or at the latest just before
  // the running one is told to finish: the probes answer for whichever
  // process is ready, never for one still starting.
  void AcceptNow(const char* why) {
    absl::MutexLock lock(&accept_mu_);
    accept_pending_ = false;
    if (accept_later_ == nullptr) return;
    LOG(INFO) << "takeover: answering on the shared HTTP listener from now on (" << why << ")";
    accept_later_->Accept();
    accept_later_ = nullptr;
  }

  OpsHandlers Handlers() {
    // Until Start() has returned, the probes say so and the metrics hold no
    // resource (the server's parts are made in Start).
    auto metrics = std::make_shared<ProxyMetrics>(
        [this] {
          return started_ok_.load() ? server_.Status(/*with_devices=*/false) : ProxyStatus();
        },
        &server_.events());
    OpsHandlers handlers;
    handlers.live = [this] { return server_.Liveness(); };
    handlers.ready = [this] {
      if (!started_ok_.load()) {
        return std::vector<HealthCheck>{{"started", false, "dpproxy is starting"}};
      }
      return server_.Readiness();
    };
    handlers.metrics.push_back(metrics);
    handlers.metrics.push_back(server_.telemetry().registry());
    return handlers;
  }

  // The HTTP endpoint of metrics and probes, if --metrics_address asks for
  // one: on the listener the running dpproxy hands over when this one
  // takes over, where it can be served here.
  absl::Status StartOps() {
    if (config_.metrics_address.empty()) return absl::OkStatus();
    const OpsHandlers handlers = Handlers();
    // Taking over: the running dpproxy hands its listener over, so the
    // same address answers throughout and nothing has to bind a port it
    // holds.
    OpsServer::Options ops_options;
    if (config_.takeover && !config_.state_dir.empty()) {
      ops_options.listener_fd = ListenerFromPredecessor(config_.state_dir);
      ops_options.accept_later = true;
    }
    absl::StatusOr<std::unique_ptr<OpsServer>> started =
        OpsServer::Start(config_.metrics_address, handlers, ops_options);
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
      started = OpsServer::Start(config_.metrics_address, handlers, ops_options);
    }
    if (!started.ok()) return started.status();
    ops_ = *std::move(started);
    server_.SetSharedListener(ops_->listener_fd());
    if (!ops_->accepting()) {
      absl::MutexLock lock(&accept_mu_);
      accept_later_ = ops_.get();
      accept_pending_ = true;
    }
    if (!IsLoopbackAddress(config_.metrics_address)) {
      LOG(WARNING) << "metrics and probes are served at " << config_.metrics_address
                   << ", which is not a loopback address: the endpoint has no authentication, "
                      "so anyone who can reach it sees resource names, device counts and "
                      "allocation activity (use 127.0.0.1:PORT, or protect the port)";
      server_.events().Emit("metrics_exposed", {{"address", config_.metrics_address}});
    }
    const std::string host = config_.metrics_address.substr(0, config_.metrics_address.rfind(':'));
    LOG(INFO) << "metrics at http://" << host << ":" << ops_->port()
              << "/metrics; probes at /livez, /healthz and /readyz";
    return absl::OkStatus();
  }

  // Starts the server. SIGTERM or SIGINT while it starts (in DRA mode it
  // may wait on a slow API server) end its API calls at once, and the
  // signal is acted on as soon as it returns: `*start_signal` is the
  // signal received while starting (0: none). False if it did not start.
  bool StartServer(int* start_signal_out) {
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
          server_.CancelStart();
          return;
        }
      }
    });
    const absl::Status started = server_.Start();
    start_returned.store(true);
    start_watch.join();
    *start_signal_out = start_signal.load();
    if (started.ok()) return true;
    LOG(ERROR) << "cannot start: " << started.message();
    CloseOps();
    return false;
  }

  // Until a signal that stops dpproxy, or the end of a handoff: SIGHUP
  // reloads, SIGUSR2 upgrades in place. `pending`: a signal received while
  // starting, acted on first.
  void ServeSignals(int pending) {
    for (;;) {
      const int sig = pending != 0 ? std::exchange(pending, 0) : WaitForTerminationSignal();
      if (server_.handoff_failed()) return;
      if (server_.handed_over()) {
        LOG(INFO) << "handed over to the new dpproxy; exiting";
        return;
      }
      LOG(INFO) << "signal " << sig << " received";
      server_.events().Emit("signal", {{"signal", sig}});
      if (sig == SIGUSR2) {
        Upgrade();
        continue;
      }
      if (sig != SIGHUP) return;
      Reload();
    }
  }

  void Upgrade() {
    if (config_.state_dir.empty()) {
      LOG(ERROR) << "upgrade (SIGUSR2) refused: a takeover needs --state_dir";
    } else if (absl::Status s = upgrade_.Start(); !s.ok()) {
      LOG(ERROR) << "upgrade (SIGUSR2) refused: " << s.message();
    }
  }

  // A reload: the flags as given at start, the --config file as it is now.
  void Reload() {
    absl::StatusOr<ProxyConfig> next = options_.reread_config();
    if (!next.ok()) {
      LOG(ERROR) << "reload refused, the running configuration stays: "
                 << next.status().message();
      server_.events().Emit("config_reload_refused",
                            {{"error", std::string(next.status().message())}});
      return;
    }
    server_.Reload(*next);
  }

  void CloseOps() {
    {
      absl::MutexLock lock(&accept_mu_);
      accept_later_ = nullptr;
    }
    ops_.reset();
  }

  [[noreturn]] void Stop() {
    // Handed over: systemd supervises the new main process now; this one's
    // end is not the service's.
    if (!server_.handed_over()) notifier_.Stopping();
    CloseOps();
    server_.Shutdown();
    const int code = server_.handoff_failed() ? 1 : 0;
    if (code == 0 && server_.handed_over() && options_.wait_after_handoff) {
      // Everything is closed; a container runtime that would restart an
      // exited dpproxy (which would then take over back) waits for the
      // pod's deletion instead.
      LOG(INFO) << "handed over; waiting for SIGTERM (--after_handoff=wait)";
      for (;;) {
        const int s = WaitForTerminationSignal();
        if (s != SIGHUP) break;
      }
    }
    google::FlushLogFiles(google::GLOG_INFO);
    EndProcess(code);
  }

  const ProxyConfig& config_;
  const DaemonOptions& options_;
  ProxyServer server_;
  InPlaceUpgrade upgrade_;
  SystemdNotifier notifier_;
  std::atomic<bool> started_ok_{false};
  std::unique_ptr<OpsServer> ops_;
  absl::Mutex accept_mu_;
  OpsServer* accept_later_ ABSL_GUARDED_BY(accept_mu_) = nullptr;
  std::atomic<bool> accept_pending_{false};
};

}  // namespace

int RunDaemon(const ProxyConfig& config, const DaemonOptions& options) {
  BlockTerminationSignals();
  // gRPC stays initialized until the process ends, which it does through
  // EndProcess once everything has stopped (grpc_util.h).
  KeepGrpcForProcess();
  // Run ends the process once the daemon has stopped; it returns (and the
  // parts are destroyed here) only when it could not start.
  Daemon daemon(config, options);
  return daemon.Run();
}

}  // namespace dpproxy
