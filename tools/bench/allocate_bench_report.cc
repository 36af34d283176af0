// allocate_bench's report (allocate_bench.h): each figure beside its floor.
#include <algorithm>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/allocate_bench.h"

namespace dpproxy::bench {


namespace {

// Allocate latency by path, per plugin version, and the journal against
// its fdatasync floors.
void PrintLatencies(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const auto& results = f.results;
  std::cout << absl::StrFormat(
      "Allocate, one container with one device, %d calls per path, blocks of %d alternating.\n"
      "direct: a client on the plugin's socket; bare hop: a minimal forwarder (gRPC's\n"
      "callback API on both sides as dpproxy, one channel, nothing else); dpproxy: the\n"
      "kubelet's v1beta1 call on dpproxy's socket, translated to the plugin's version,\n"
      "without and with its state directory.\n\n",
      s.iterations, s.block);
  std::cout << absl::StrFormat("%-16s %-24s %10s %10s %12s\n", "plugin", "path", "p50", "p99",
                               "p50/direct");
  for (const Result& r : results) {
    const double d50 = Percentile(r.us[0], 0.5);
    for (size_t p = 0; p < r.paths.size(); ++p) {
      const double p50 = Percentile(r.us[p], 0.5);
      // A floor is not an Allocate: no ratio to the direct call.
      const bool floor = absl::StartsWith(r.paths[p], "fdatasync");
      std::cout << absl::StrFormat("%-16s %-24s %8.0fus %8.0fus %s\n", p == 0 ? r.label : "",
                                   r.paths[p], p50, Percentile(r.us[p], 0.99),
                                   floor ? std::string(11, ' ') + "-"
                                         : absl::StrFormat("%11.2fx", p50 / d50));
    }
    if (r.errors > 0) std::cout << "  errors: " << r.errors << "\n";
  }
  if (!results.empty() && results[0].us.size() == 8) {
    // direct, bare hop, no journal, journal, fdatasync preallocated,
    // appended, no journal + fdatasync, bare hop durable
    const auto& u = results[0].us;
    std::cout << "\nfdatasync: 200 bytes written and fdatasync'd in the state directory, in the\n"
                 "same rotation: overwritten in a preallocated file (the floor, as dpproxy's\n"
                 "journal writes), appended (the file grows: its size is synced too), and the\n"
                 "preallocated write made right after each no-journal Allocate (a sync after\n"
                 "other work, as the journal's, is slower than one of a back-to-back series).\n";
    for (const auto& [label, q] : {std::pair<std::string, double>{"p50", 0.5}, {"p99", 0.99}}) {
      const double bare = Percentile(u[1], q), nj = Percentile(u[2], q),
                   j = Percentile(u[3], q), sync = Percentile(u[4], q),
                   after = Percentile(u[6], q) - nj;
      std::cout << absl::StrFormat(
          "v1beta1 %s: dpproxy without journal / bare hop %.2fx (goal <= 1.10); "
          "(journal - no journal) / fdatasync floor %.2f (goal <= 1.2), / one fdatasync "
          "after each call %.2f\n",
          label, nj / bare, (j - nj) / sync, (j - nj) / after);
    }
    std::cout << "The durable bare hop (bare_hop --journal) writes each request to a file and\n"
                 "fdatasyncs it while the plugin answers, group-committed, before answering: the\n"
                 "least a forwarder that keeps its calls on the disk does.\n";
    for (const auto& [label, q] : {std::pair<std::string, double>{"p50", 0.5}, {"p99", 0.99}}) {
      const double bare = Percentile(u[1], q), nj = Percentile(u[2], q),
                   j = Percentile(u[3], q), durable = Percentile(u[7], q);
      std::cout << absl::StrFormat(
          "v1beta1 %s: dpproxy with journal / durable bare hop %.2fx; the journal's cost "
          "(journal - no journal) / the durable hop's (durable - bare) %.2f\n",
          label, durable > 0 ? j / durable : 0, durable > bare ? (j - nj) / (durable - bare) : 0);
    }
  }
}

// Allocate throughput from concurrent clients, and the CPU per call by
// process, against the bare and the durable hop.
void PrintThroughput(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const auto& many = f.many;
  const SyncCost* sync_cost = f.sync_cost.get();
  std::cout << absl::StrFormat(
      "\nAllocate from %d concurrent clients, %d calls each in %d rounds (the paths take\n"
      "turns; v1beta1 plugin; each answer through dpproxy with its journal waits for its\n"
      "reservation's fdatasync, made while the plugin answers and shared by the calls\n"
      "that arrive meanwhile). /direct: over every round; per round: the median and the\n"
      "range of each round's ratio to the direct round before it.\n",
      s.clients, s.concurrent_calls, std::max(1, std::min(s.concurrent_rounds,
                                                                  s.concurrent_calls)));
  std::cout << absl::StrFormat("%-22s %10s %10s %8s %22s %7s\n", "path", "calls/s", "slowest",
                               "/direct", "per round: median (range)", "errors");
  for (const auto& [path, t] : many) {
    std::vector<double> ratios;
    const auto& direct = many[0].second.round_per_second;
    for (size_t r = 0; r < t.round_per_second.size() && r < direct.size(); ++r) {
      ratios.push_back(t.round_per_second[r] / direct[r]);
    }
    std::cout << absl::StrFormat("%-22s %10.0f %8.1fms %7.2fx %9.2fx (%.2f-%.2f) %7d\n", path,
                                 t.per_second, t.max_us / 1000,
                                 t.per_second / many[0].second.per_second,
                                 Percentile(ratios, 0.5), Percentile(ratios, 0.0),
                                 Percentile(ratios, 1.0), t.errors);
  }
  if (!many.empty()) {
    std::cout << "\nCPU time per call in those rounds (us; every thread, user and system):\n";
    std::cout << absl::StrFormat("%-22s %10s %10s %10s %10s %14s\n", "path", "clients",
                                 "middle", "plugin", "total", "total/direct");
    for (const auto& [path, t] : many) {
      const double total = t.client_cpu_us + t.middle_cpu_us + t.plugin_cpu_us;
      const auto& d = many[0].second;
      const double direct = d.client_cpu_us + d.middle_cpu_us + d.plugin_cpu_us;
      std::cout << absl::StrFormat("%-22s %10.1f %10.1f %10.1f %10.1f %13.2fx\n", path,
                                   t.client_cpu_us, t.middle_cpu_us, t.plugin_cpu_us, total,
                                   direct > 0 ? total / direct : 0);
    }
    auto row = [&](const std::string& label) -> const Throughput* {
      for (const auto& [path, t] : many) {
        if (path == label) return &t;
      }
      return nullptr;
    };
    if (many.size() >= 4) {
      const double bare = many[1].second.middle_cpu_us;
      std::cout << absl::StrFormat(
          "dpproxy's CPU per call / the bare hop's: no journal %.2fx, with journal %.2fx\n",
          bare > 0 ? many[2].second.middle_cpu_us / bare : 0,
          bare > 0 ? many[3].second.middle_cpu_us / bare : 0);
      // The journal's floor: what one durable write costs the thread that
      // makes it, on this disk, measured in the same run.
      if (sync_cost->syncs > 0) {
        const double per_sync =
            static_cast<double>(sync_cost->cpu_ns) / 1000.0 / static_cast<double>(sync_cost->syncs);
        const double extra = many[3].second.middle_cpu_us - many[2].second.middle_cpu_us;
        std::cout << absl::StrFormat(
            "the journal's CPU per call (with - without): %.1f us; one 200-byte write and\n"
            "fdatasync costs its thread %.1f us of CPU (the preallocated floor, same run): "
            "%.2f of them\n",
            extra, per_sync, per_sync > 0 ? extra / per_sync : 0);
      }
    }
    if (const Throughput *durable = row("bare hop, durable"), *journal = row("dpproxy");
        many.size() >= 4 && durable != nullptr && journal != nullptr) {
      const double bare = many[1].second.middle_cpu_us;
      const double nj = many[2].second.middle_cpu_us;
      std::cout << absl::StrFormat(
          "the durable bare hop's CPU per call / the bare hop's: %.2fx; dpproxy with its\n"
          "journal against the durable bare hop: CPU per call %.2fx, calls/s %.2f; the\n"
          "journal's CPU per call (with - without) / the durable hop's (durable - bare): "
          "%.2f\n",
          bare > 0 ? durable->middle_cpu_us / bare : 0,
          durable->middle_cpu_us > 0 ? journal->middle_cpu_us / durable->middle_cpu_us : 0,
          durable->per_second > 0 ? journal->per_second / durable->per_second : 0,
          durable->middle_cpu_us > bare
              ? (journal->middle_cpu_us - nj) / (durable->middle_cpu_us - bare)
              : 0);
    }
    if (f.build_labels.size() == 2) {
      const Throughput *mine = row(f.build_labels[0]), *other = row(f.build_labels[1]);
      const double bare = many[1].second.middle_cpu_us;
      if (mine != nullptr && other != nullptr) {
        std::cout << absl::StrFormat(
            "this build and the compared one (journal, static backend), CPU per call / the "
            "bare hop's:\n%.2fx and %.2fx; the compared build's CPU per call is %.2f of this "
            "build's, its calls/s %.2f of this build's\n",
            bare > 0 ? mine->middle_cpu_us / bare : 0, bare > 0 ? other->middle_cpu_us / bare : 0,
            mine->middle_cpu_us > 0 ? other->middle_cpu_us / mine->middle_cpu_us : 0,
            mine->per_second > 0 ? other->per_second / mine->per_second : 0);
      }
    }
  }
}

// Re-registration after kubelet restarts, direct and through dpproxy.
void PrintReregistration(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const Reregistration& rereg_one = f.rereg_one;
  const Reregistration& rereg_many = f.rereg_many;
  if (s.restarts > 0) {
    std::cout << absl::StrFormat(
        "\nRe-registration after %d kubelet restarts (v1beta1-sync kubelet; from the\n"
        "restarted kubelet being up to the resource registered again)\n",
        s.restarts);
    std::cout << absl::StrFormat("%-40s %9s %9s %9s %9s\n", "path", "p50", "p90", "p99", "max");
    auto row = [](const std::string& label, const std::vector<double>& v) {
      std::cout << absl::StrFormat("%-40s %7.1fms %7.1fms %7.1fms %7.1fms\n", label,
                                   Percentile(v, 0.5), Percentile(v, 0.9), Percentile(v, 0.99),
                                   Percentile(v, 1.0));
    };
    for (const Reregistration* r : {&rereg_one, &rereg_many}) {
      row(r->resources == 1 ? "1 plugin direct (floor)"
                            : absl::StrCat(r->resources, " plugins direct (floor)"),
          r->direct_ms);
      row(absl::StrCat("via dpproxy serving ", r->resources,
                       r->resources == 1 ? " resource" : " resources"),
          r->proxied_ms);
    }
    std::cout << absl::StrFormat(
        "(one resource timed; the kubelet registers the others at the same restart. The\n"
        "second pair runs after the Allocate phases: dpproxy's journal holds their\n"
        "allocations, which reached it directly; both kubelets of a pair start from the\n"
        "same checkpoint, %d allocations)\n",
        rereg_many.allocations);
    const int missed = rereg_one.missed + rereg_many.missed;
    if (missed > 0) std::cout << missed << " restart(s) not re-registered in 10 s\n";
  }
}

// Start-up with and without allocations, and the memory they hold.
void PrintStartup(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const auto& startup_empty = f.startup_empty;
  const auto& startup_full = f.startup_full;
  const auto& rss_empty = f.rss_empty;
  const auto& rss_full = f.rss_full;
  if (s.startup_allocations > 0) {
    std::cout << absl::StrFormat(
        "\nStart-up to the first resource registered (remembered list, no backend),\n"
        "median of 3 (-1: it did not register within 60 s)\n");
    std::cout << absl::StrFormat("%-40s %9.0fms\n", "no allocations (floor)",
                                 Percentile(startup_empty, 0.5));
    std::cout << absl::StrFormat("%-40s %9.0fms\n",
                                 absl::StrCat(s.startup_allocations, " allocations"),
                                 Percentile(startup_full, 0.5));
    // What holding them costs: the resident memory of the two starts once
    // registered (what the load freed and glibc kept included).
    const double empty_kb = Percentile(rss_empty, 0.5), full_kb = Percentile(rss_full, 0.5);
    std::cout << absl::StrFormat(
        "resident memory then: %.1f MB with none, %.1f MB with %d: %.0f bytes per allocation "
        "held (goal <= 300)\n",
        empty_kb / 1024, full_kb / 1024, s.startup_allocations,
        (full_kb - empty_kb) * 1024 / s.startup_allocations);
  }
}

// A health flip until the kubelet sees it, direct and through dpproxy.
void PrintFlips(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const Flips& flips_small = f.flips_small;
  const Flips& flips_large = f.flips_large;
  if (s.flips > 0) {
    std::cout << absl::StrFormat(
        "\nHealth flip seen by the kubelet (the plugin's control API, to the kubelet's new\n"
        "allocatable count), %d flips each way\n",
        s.flips);
    std::cout << absl::StrFormat("%-22s %12s %12s %14s %14s %9s\n", "devices", "direct p50",
                                 "direct p99", "dpproxy p50", "dpproxy p99", "p50 ratio");
    for (const auto& [label, f] : {std::pair<std::string, const Flips*>{"8", &flips_small},
                                   {"20,000", &flips_large}}) {
      const double dp50 = Percentile(f->direct_ms, 0.5), pp50 = Percentile(f->proxied_ms, 0.5);
      std::cout << absl::StrFormat("%-22s %10.1fms %10.1fms %12.1fms %12.1fms %8.2fx\n", label,
                                   dp50, Percentile(f->direct_ms, 0.99), pp50,
                                   Percentile(f->proxied_ms, 0.99), dp50 > 0 ? pp50 / dp50 : 0);
    }
  }
}

// Reconciliation's first pass beside one pod-resources List.
void PrintReconciliation(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const Reconciliation& reconciliation = f.reconciliation;
  if (s.reconcile_pods > 0) {
    std::cout << absl::StrFormat(
        "\nReconciliation, first pass over %d pods (-1: not seen within 30 s)\n"
        "%-40s %9.1fms\n%-40s %9.1fms (%d allocations named)\n",
        s.reconcile_pods, "pod-resources List (floor)", reconciliation.list_ms,
        "dpproxy's pass", reconciliation.pass_ms, reconciliation.annotated);
  }
}

// dpproxy upgraded under a pod stream: restart against takeover.
void PrintUpgrades(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const auto& upgrades = f.upgrades;
  if (!upgrades.empty()) {
    std::cout << absl::StrFormat(
        "\nUpgrading dpproxy while pods are admitted one after another, %d times each way\n"
        "(restart: stop, then start on the same directories; takeover: --takeover beside\n"
        "the running one). Gap: how long the kubelet had fewer than all 4 devices\n"
        "allocatable (-1: not back). Floor: no gap, no failed pod.\n",
        s.upgrades);
    std::cout << absl::StrFormat("%-8s %-10s %10s %10s %14s\n", "kubelet", "way", "gap p50",
                                 "gap max", "pods failed");
    for (const Upgrades& u : upgrades) {
      for (const auto& [way, gaps, failed] :
           {std::tuple<std::string, const std::vector<double>*, int>{"restart", &u.restart_gap_ms,
                                                                      u.restart_failed},
            {"takeover", &u.takeover_gap_ms, u.takeover_failed}}) {
        std::cout << absl::StrFormat("%-8s %-10s %8.0fms %8.0fms %14d\n", u.kubelet, way,
                                     Percentile(*gaps, 0.5), Percentile(*gaps, 1.0), failed);
      }
    }
    for (const Upgrades& u : upgrades) {
      std::cout << absl::StrFormat("(%s: %d pods in all)\n", u.kubelet, u.pods);
    }
    std::cout << "(1.25-1.36 disconnect whatever client holds the resource's name when the\n"
                 "old dpproxy's stream ends, kubernetes#121994; the new one empties that entry\n"
                 "first, so the end disconnects nothing)\n";
  }
}

// Kubelet restarts without the checkpoint, direct and through dpproxy.
void PrintCheckpointLosses(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const auto& losses = f.losses;
  if (!losses.empty()) {
    std::cout << absl::StrFormat(
        "\nKubelet restarts without its checkpoint, %d each, the plugin registered directly\n"
        "or behind dpproxy: pods of 2 and 1 of 4 devices run; then 3 new pods of 1 (1\n"
        "device is free), then a holder deleted and a pod of 2 admitted at once.\n"
        "Floor: no running pod denied, no device used twice, 2 new pods failed per round,\n"
        "the pod after the deletion admitted.\n",
        s.checkpoint_losses);
    std::cout << absl::StrFormat("%-8s %-8s %14s %11s %15s %20s %15s\n", "kubelet", "path",
                                 "running denied", "used twice", "new pods failed",
                                 "deletion to admit p50", "after deletion");
    for (const CheckpointLoss& l : losses) {
      std::cout << absl::StrFormat(
          "%-8s %-8s %14d %11d %11d of %d %18.0fms %9d failed\n", l.kubelet, l.path,
          l.running_denied, l.used_twice, l.new_failed, 3 * l.rounds,
          Percentile(l.delete_to_admit_ms, 0.5), l.after_delete_failed);
    }
  }
}

// dpproxy's memory and threads after the run.
void PrintMemory(const Figures& f) {
  [[maybe_unused]] const Settings& s = f.settings;
  const std::string& rss = f.rss;
  const std::string& hwm = f.hwm;
  const std::string& threads = f.threads;
  std::cout << "\ndpproxy resident memory after the run: " << rss << " (peak " << hwm << "), "
            << threads << " threads\n";
}

}  // namespace

void PrintReport(const Figures& f) {
  PrintLatencies(f);
  PrintThroughput(f);
  PrintReregistration(f);
  PrintStartup(f);
  PrintFlips(f);
  PrintReconciliation(f);
  PrintUpgrades(f);
  PrintCheckpointLosses(f);
  PrintMemory(f);
}

}  // namespace dpproxy::bench
