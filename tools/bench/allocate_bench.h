// File: allocate_bench.h
//
// What allocate_bench measures (allocate_bench.cc) and prints
// (allocate_bench_report.cc): each figure with the floor it is judged
// against, collected in one run.
#ifndef DPPROXY_TOOLS_BENCH_ALLOCATE_BENCH_H_
#define DPPROXY_TOOLS_BENCH_ALLOCATE_BENCH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "proxy/util/child_process.h"
#include "tools/bench/bench_util.h"
#include "tools/kubelet_sim/kubelet_sim.h"

namespace dpproxy::bench {

// The CPU time the calling thread spends in a floor's writes and
// fdatasyncs (user and system), and how many it made.
struct SyncCost {
  std::atomic<int64_t> cpu_ns{0};
  std::atomic<int64_t> syncs{0};
};

// Throughput from `clients` threads, each with its own channel, per path.
// The paths take turns in rounds (each round: every path in turn, `calls /
// rounds` calls per client), so that a change in the machine's load meets
// every path alike instead of the one measured at that moment.
struct Throughput {
  double per_second = 0;  // over every round
  double max_us = 0;      // the slowest call
  int errors = 0;
  std::vector<double> round_per_second;
  // CPU time per call (us) of the clients (this process), of the process in
  // the middle (none for direct) and of the plugin, over every round: on
  // two shared cores, throughput is bounded by their sum, and unlike
  // calls/s this figure moves little with the machine's other load.
  double client_cpu_us = 0, middle_cpu_us = 0, plugin_cpu_us = 0;
};

// Re-registration after kubelet restarts: `kubelet` is restarted `n` times
// (Stop, then Start: the device-plugins directory wiped, a new kubelet.sock
// listening) and each time the milliseconds until it has `resource`
// registered again are recorded. Restarts alternate between the two
// kubelets so that noise hits both paths alike.
struct Reregistration {
  std::vector<double> direct_ms, proxied_ms;
  int missed = 0;
  int allocations = 0;  // in both kubelets' checkpoints
  int resources = 1;     // registered with each kubelet
};

// Reconciliation: `pods` pods of one device each admitted through dpproxy,
// then dpproxy's first pass over the kubelet's pod-resources API (which
// names the holder of every allocation and saves the names once), as
// dpproxy reports it (event "reconciled", duration_ms). The floor is one
// List call of the same API by the bench.
struct Reconciliation {
  double pass_ms = -1;
  double list_ms = -1;
  int annotated = 0;
};

// An upgrade of dpproxy while pods are admitted, two ways: a restart (the
// old one stopped, the new one started on the same directories) and a
// takeover (the new one started beside the old one with --takeover). For
// each: how long the kubelet had the resource without every device
// allocatable (from its events: a plugin loss or a smaller list, to all
// four back), and how many pod admissions failed meanwhile.
struct Upgrades {
  std::string kubelet;
  std::vector<double> restart_gap_ms, takeover_gap_ms;
  int restart_failed = 0, takeover_failed = 0, pods = 0;
};

// A kubelet restarting without its checkpoint while pods hold devices,
// with the plugin registered directly or behind dpproxy: 4 devices, pods
// holding 2 and 1, then three new pods of 1 (1 device is free), then a
// holder deleted and a pod of 2 admitted at once.
struct CheckpointLoss {
  std::string kubelet, path;
  int running_denied = 0;   // running pods denied or killed at re-admission
  int used_twice = 0;       // devices two running containers use
  int new_failed = 0;       // of the new pods, failed (two of three have no free device)
  int after_delete_failed = 0;
  std::vector<double> delete_to_admit_ms;  // the holder's deletion to the next pod admitted
  int rounds = 0;
};

// A health flip seen by the kubelet: the plugin's control API turns one
// device Unhealthy (then Healthy again), and the time until the kubelet
// has the new allocatable count is recorded, for a plugin registered
// directly and one behind dpproxy, alternately.
struct Flips {
  std::vector<double> direct_ms, proxied_ms;
};

// Latencies of one plugin's Allocate by path (direct, bare hop, dpproxy
// without and with its journal), measured in alternating blocks.
struct Result {
  std::string label;
  std::vector<std::string> paths;
  std::vector<std::vector<double>> us;
  int errors = 0;
};

// Start-up: dpproxy started on a state directory holding one resource of
// 8 devices and `allocations` allocations, timed from its start to the
// kubelet having that resource registered (from the remembered list, no
// backend needed), and its resident memory once it has: what holding the
// allocations costs. Milliseconds (-1: not registered) and kB.
struct Startup {
  double ms = -1;
  int64_t rss_kb = -1;  // once registered
};

Startup MeasureStartup(const std::string& dir, int allocations);
Upgrades MeasureUpgrades(const std::string& dir, const std::string& version, int rounds);
CheckpointLoss MeasureCheckpointLoss(const std::string& dir, const std::string& version,
                                     bool through_dpproxy, int rounds);
Reconciliation ReconcileAtScale(const std::string& dir, int pods);
// `devices` devices behind dpproxy (on `proxied_kubelet`, its plugins in
// `proxy_plugins`) and registered directly, flipped alternately.
Flips MeasureFlips(const std::string& dir, const std::string& proxy_plugins,
                   sim::KubeletSim& proxied_kubelet, int devices);

// The run's settings the report names (allocate_bench's flags).
struct Settings {
  int iterations = 0, block = 0, clients = 0, concurrent_calls = 0, concurrent_rounds = 0;
  int restarts = 0, startup_allocations = 0, flips = 0, reconcile_pods = 0, upgrades = 0;
  int checkpoint_losses = 0;
};

// Everything one run measured.
struct Figures {
  Settings settings;
  std::vector<Result> results;  // latencies, per plugin version
  // Throughput by path: direct, bare hop, dpproxy without and with its
  // journal, the durable bare hop, then each --compare_dpproxy build.
  std::vector<std::pair<std::string, Throughput>> many;
  std::shared_ptr<SyncCost> sync_cost;
  std::vector<std::string> build_labels;  // --compare_dpproxy: this build, the other
  Reregistration rereg_one, rereg_many;
  std::vector<double> startup_empty, startup_full, rss_empty, rss_full;
  Flips flips_small, flips_large;
  Reconciliation reconciliation;
  std::vector<Upgrades> upgrades;
  std::vector<CheckpointLoss> losses;
  std::string rss, hwm, threads;  // dpproxy's, after the run
};

// Prints every figure beside its floor, section by section.
void PrintReport(const Figures& f);

}  // namespace dpproxy::bench

#endif  // DPPROXY_TOOLS_BENCH_ALLOCATE_BENCH_H_
