#!/usr/bin/env bash
# tools/bench/flap_storm.sh: what a device whose health flaps costs. A
# sample plugin flips one device's health every 10 ms for SECONDS (6,000
# flips a minute) behind dpproxy, with flap damping off (every flip passes
# through, as without dpproxy) and on (5 flips within 5 m, then held);
# the floor is the same node with no flips. For each it prints dpproxy's
# CPU time over the window, the lines it logged and the events it wrote,
# and the device lists the kubelet (kubelet_sim) received. Real processes;
# a benchmark that prints figures, with no time limit on anything.
#
#   tools/bench/flap_storm.sh BIN_DIR [SECONDS]
set -euo pipefail

bin="$1"; shift
seconds="${1:-60}"
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
lines() { if [[ -f "$1" ]]; then wc -l <"$1"; else echo 0; fi; }

printf 'load average at start: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %10s %12s %12s %14s %14s\n' "case (${seconds}s)" "flips" "dpproxy CPU" \
  "log lines" "events written" "kubelet lists"
for mode in none passthrough damped; do
  dir="$(mktemp -d /tmp/dpp-flaps.XXXXXX)"
  flags=()
  [[ "$mode" == damped ]] && flags=(--flap_damping_flaps=5 --flap_damping_window=5m)
  flips=0
  [[ "$mode" != none ]] && flips=$((seconds * 100))
  "$bin/kubelet_sim" serve --root_dir="$dir/k" --events="$dir/sim.jsonl" >"$dir/sim.log" 2>&1 &
  sim=$!
  "$bin/dpproxy" --kubelet_root="$dir/k" --plugin_dir="$dir/p" --state_dir="$dir/s" \
    --status_file= --metrics_address= --events="$dir/proxy.jsonl" "${flags[@]}" \
    >"$dir/dpproxy.log" 2>&1 &
  proxy=$!
  for ((i = 1; i <= 50; i++)); do [[ -S "$dir/p/kubelet.sock" ]] && break; sleep 0.1; done
  plugin_flags=(--resource=vendor.com/gpu --devices=8 --kubelet_socket="$dir/p/kubelet.sock" --quiet)
  [[ "$mode" != none ]] && plugin_flags+=(--flip_device=dev-1 --flip_interval=10ms
                                          --flip_count="$flips")
  "$bin/sample_plugin" "${plugin_flags[@]}" >/dev/null 2>&1 &
  plugin=$!
  "$bin/kubelet_sim" wait --root_dir="$dir/k" --resource=vendor.com/gpu --min_healthy=7 \
    --timeout=60s >/dev/null 2>&1
  c0="$(cpu_ticks "$proxy")"; l0="$(lines "$dir/dpproxy.log")"; e0="$(lines "$dir/proxy.jsonl")"
  k0="$(grep -c '"event":"devices"' "$dir/sim.jsonl" || true)"
  sleep "$seconds"
  c1="$(cpu_ticks "$proxy")"; l1="$(lines "$dir/dpproxy.log")"; e1="$(lines "$dir/proxy.jsonl")"
  k1="$(grep -c '"event":"devices"' "$dir/sim.jsonl" || true)"
  printf '%-22s %10d %11.2fs %12d %14d %14d\n' "$mode" "$flips" \
    "$(python3 -c "print(($c1 - $c0) / $hz)")" $((l1 - l0)) $((e1 - e0)) $((k1 - k0))
  kill "$plugin" "$proxy" "$sim" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
done
