#!/usr/bin/env bash
# allocate_bench as `tools/dev bench` runs it, on a few calls: every path
# and floor of the Allocate phases answers without errors, the figures
# that compare them are printed, and so is the two-build comparison.
# Timings are not judged here (docs/benchmarks.md has them); a missing
# binary is refused as a usage error, the flags named.
set -uo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/dpproxy"
source "$RUNFILES/tests/testing/checks.sh"
BENCH="$RUNFILES/tools/bench/allocate_bench"
PROXY="$RUNFILES/proxy/dpproxy"
PLUGIN="$RUNFILES/tools/sample_plugin/sample_plugin"
HOP="$RUNFILES/tools/bench/bare_hop"

out="$("$BENCH" --dpproxy="$PROXY" --sample_plugin="$PLUGIN" --bare_hop="$HOP" \
  --compare_dpproxy="$PROXY" --iterations=20 --block=10 --concurrent_calls=20 \
  --concurrent_rounds=2 --startup_allocations=0 --reconcile_pods=0 --flips=0 --restarts=0 \
  --upgrades=0 --checkpoint_losses=0 2>&1)"
rc=$?
check "allocate_bench ends with status 0 (got $rc)" [ "$rc" -eq 0 ] || { echo "$out" | tail -n 40; finish; }

# The latency table: each path with its p50 and p99.
for path in "direct" "bare hop" "dpproxy, no journal" "dpproxy" "fdatasync, preallocated" \
            "fdatasync, appended" "no journal + fdatasync" "bare hop, durable"; do
  check "latency row: $path" grep -Eq "^(v1beta1 plugin)? +${path//+/\\+} +[0-9]+us +[0-9]+us" <<<"$out"
done
for path in "direct" "dpproxy, no journal" "dpproxy"; do
  check "v1alpha latency row: $path" grep -Eq "^(v1alpha plugin)? +$path +[0-9]+us" <<<"$out"
done
check "no errors in the latency rounds" bash -c '! grep -q "^  errors: " <<<"$1"' _ "$out"

# The throughput table: every path, its last column (errors) 0.
for path in "direct" "bare hop" "dpproxy, no journal" "dpproxy" "bare hop, durable" \
            "this build" "compared build"; do
  check "throughput row without errors: $path" \
    grep -Eq "^$path +[0-9]+ +[0-9.]+ms +[0-9.]+x +[0-9.]+x \([0-9.-]+\) +0$" <<<"$out"
done
for line in "dpproxy's CPU per call / the bare hop's: no journal" \
            "the durable bare hop's CPU per call / the bare hop's:" \
            "journal against the durable bare hop: CPU per call" \
            "v1beta1 p50: dpproxy with journal / durable bare hop" \
            "this build and the compared one (journal, static backend)" \
            "the compared build's CPU per call is"; do
  check "prints: $line" grep -Fq "$line" <<<"$out"
done

# A missing binary: refused before anything starts, the flags named.
out="$("$BENCH" --dpproxy="$PROXY" --sample_plugin="$PLUGIN" 2>&1)"
rc=$?
check "without --bare_hop: status 2, a usage error (got $rc)" [ "$rc" -eq 2 ]
check "without --bare_hop: the flags named" grep -Fq -- "--dpproxy, --sample_plugin and --bare_hop are required" <<<"$out"
finish
